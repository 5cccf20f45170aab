"""The exceptions nexarch_events raises. Third-party errors are translated
once, at the boundary (``nexarch_events.aio``), into one of these."""

from __future__ import annotations


class NexarchError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigurationError(NexarchError):
    """A setting is missing or invalid; the message names the key and the fix."""


class InvalidJobError(NexarchError, ValueError):
    """A job was rejected before anything was written (bad type, slug, id or payload)."""


class JobNotFound(NexarchError, LookupError):
    """No job with that id (or not in the caller's tenant)."""


class NoJobAvailable(NexarchError):
    """A claim found nothing ready: the normal state of an empty queue."""


class DatabaseError(NexarchError):
    """Postgres refused a statement. ``sqlstate`` and ``constraint`` say why."""

    def __init__(self, message: str, *, sqlstate: str | None = None,
                 constraint: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.constraint = constraint


class DatabaseTransient(DatabaseError):
    """Postgres refused the statement for a reason outside our code that goes
    away by itself: a statement or lock timeout, a deadlock, a serialization
    failure, a full notification queue, a full disk, a read-only server
    (failover). Log it once, back off, retry. ``aio/pg.py`` sorts SQLSTATEs
    into these classes (table in docs/database-errors.md)."""


def is_outage(exc: DatabaseTransient) -> bool:
    """Whether a transient error says the database is out of reach or busy
    whatever the statement (a lost connection, a lock timeout, a deadlock, a
    full disk), rather than that this statement ran too long: a statement
    timeout (57014) or the command timeout (no SQLSTATE) may be the
    statement's own doing, a huge document. See ``Failure.outage``."""
    if isinstance(exc, DatabaseTimedOut):
        return False
    if exc.sqlstate is None:
        return isinstance(exc, DatabaseUnavailable)  # lost, closed, refused
    return exc.sqlstate not in ("57014", "54000")


class DatabaseUnavailable(DatabaseTransient):
    """The connection broke under us or could not be made (retry later, on a
    new connection)."""


class DatabaseTimedOut(DatabaseUnavailable):
    """A statement outlived NEXARCH_COMMAND_TIMEOUT (kept on trio's clock,
    aio/pg.py ``_bounded``): a half-open socket, or a statement that runs
    too long. asyncpg asks the server to cancel the statement."""


class DatabaseRejected(DatabaseError):
    """Postgres refused the data of one statement (SQLSTATE class 22 or 23:
    a value out of range, a CHECK): permanent for that item, retrying the
    same statement fails again."""


class DatabasePoolerError(DatabaseError, ConfigurationError):
    """The connection goes through a pooler in transaction mode that the
    configuration does not say (NEXARCH_LISTEN_DATABASE_URL): a configuration
    error (exit 2), found by the database."""


class DatabaseUrlError(DatabaseError, ConfigurationError):
    """The database URL's options are not valid (an unknown sslmode, a
    certificate file that is not there): a configuration error (exit 2)."""


class DatabasePrivilegeError(DatabaseError, ConfigurationError):
    """The role lacks a privilege a statement needs (SQLSTATE 42501): the
    operator's to grant (exit 2), not a bug in our SQL."""


class MigrationError(NexarchError):
    """The schema cannot be brought up to date (e.g. an applied migration changed)."""


class JobFailed(NexarchError):
    """Raised by a handler to fail one job with a clear message.

    ``permanent=True`` ends the job as ``failed`` at once instead of retrying:
    for input that can never succeed (a malformed message), not for outages.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class ImapError(NexarchError):
    """Talking to an IMAP server failed; the message says what and where."""


class ImapUnavailable(ImapError):
    """The server could not be reached, cut the connection, said BYE or stopped
    answering (retry later; the next run resumes from the persisted UID)."""


class ImapThrottled(ImapUnavailable):
    """The server refused a command for now ([UNAVAILABLE], [THROTTLED],
    [LIMIT], [INUSE]). ``wait``: the server's suggested backoff in seconds,
    None if it suggested none. Retry the same command after a wait."""

    def __init__(self, message: str, *, code: str, wait: float | None) -> None:
        super().__init__(message)
        self.code = code
        self.wait = wait


class ImapTlsError(ImapUnavailable):
    """TLS could not be set up: certificate not trusted, name mismatch, no STARTTLS."""


class ImapAuthError(ImapError):
    """The server refused the login (wrong user or password, or no session)."""


class OAuthRefused(ImapAuthError):
    """The provider's token endpoint refused to issue a token (revoked or
    expired refresh token, wrong client secret, missing consent). Retried with
    backoff; the message carries the provider's error code, never a secret."""


class OAuthUnavailable(ImapUnavailable):
    """The token endpoint could not be reached, timed out, or answered with
    something that is not a usable token (retry later, not before
    ``retry_after`` seconds when the endpoint said so)."""

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ImapCommandError(ImapError):
    """The server answered NO or BAD to a command. ``result``: which ("NO",
    "BAD"; None where the client refused the command itself)."""

    def __init__(self, message: str, *, result: str | None = None) -> None:
        super().__init__(message)
        self.result = result


class ImapProtocolError(ImapError):
    """The server's reply does not parse, or breaks a rule we rely on."""
