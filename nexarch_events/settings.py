"""Frozen, validated settings. Every error names the key and what would fix it."""

from __future__ import annotations

import logging
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Self
from urllib.parse import urlsplit

from cryptography.fernet import Fernet

from .errors import ConfigurationError

#: The levels ``--log-level``, NEXARCH_LOG_LEVEL and the file's log_level take.
LOG_LEVELS = ("debug", "info", "warning", "error")

log = logging.getLogger("nexarch_events.settings")


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """How workers claim, retry and give up. Times are seconds."""

    #: Worker tasks per process. Two cores: a few tasks keep Postgres busy.
    workers: int = 4
    #: Jobs claimed per statement (and acknowledged per statement).
    batch_size: int = 100
    #: A lease without a heartbeat for this long belongs to a dead worker.
    stale_after: float = 30.0
    #: How often a live process refreshes its leases; default stale_after / 4.
    heartbeat_interval: float | None = None
    #: Retry delay = min(attempts, backoff_cap) * backoff_base (the seed's rule).
    backoff_base: float = 10.0
    backoff_cap: int = 10
    #: Safety net: drain this often even if no notification arrived.
    drain_interval: float = 60.0
    #: On shutdown, in-flight jobs get this long before they are released.
    shutdown_grace: float = 10.0
    #: Listener liveness probe: a ping every interval must answer within timeout,
    #: so a dead (even half-open) connection is noticed within interval + timeout.
    listener_ping_interval: float = 5.0
    listener_ping_timeout: float = 5.0
    #: Reconnect backoff of the listener: doubles from min to max.
    reconnect_min: float = 0.1
    reconnect_max: float = 5.0
    #: Retention: the sweeper deletes succeeded / failed jobs this long after
    #: they finished (0: keep them forever).
    retain_succeeded: float = 7 * 86400.0
    retain_failed: float = 30 * 86400.0
    #: Each service process vacuums the job table once this many more dead
    #: row versions than the last vacuum left have piled up (each job leaves
    #: three: claim, ack, prune), so claims do not wade through them until
    #: autovacuum comes by (0: leave it to autovacuum). See queue/vacuum.py.
    vacuum_dead_rows: int = 25_000

    def __post_init__(self) -> None:
        _positive_int("queue.workers", self.workers, upper=1024)
        _positive_int("queue.batch_size", self.batch_size, upper=10_000)
        _positive_int("queue.backoff_cap", self.backoff_cap, upper=1_000_000)
        _positive_int("queue.vacuum_dead_rows", self.vacuum_dead_rows, lower=0, upper=10**12)
        for name in ("stale_after", "backoff_base", "drain_interval", "listener_ping_interval",
                     "listener_ping_timeout", "reconnect_min", "reconnect_max"):
            _positive_float(f"queue.{name}", getattr(self, name))
        _positive_float("queue.shutdown_grace", self.shutdown_grace, allow_zero=True)
        _positive_float("queue.retain_succeeded", self.retain_succeeded, allow_zero=True)
        _positive_float("queue.retain_failed", self.retain_failed, allow_zero=True)
        if self.heartbeat_interval is not None:
            _positive_float("queue.heartbeat_interval", self.heartbeat_interval)
            # A lease is confirmed every interval plus a round trip; one late
            # heartbeat must not make it stale (the sweeper would hand the
            # job on), nor look lost to the worker's own lease watch (it
            # stopped healthy jobs for ever: a review).
            if self.heartbeat_interval > self.stale_after / 2:
                raise ConfigurationError(
                    f"queue.heartbeat_interval ({self.heartbeat_interval}) must be at most "
                    f"half of queue.stale_after ({self.stale_after}), or live workers lose "
                    "their jobs")
        if self.reconnect_min > self.reconnect_max:
            raise ConfigurationError("queue.reconnect_min must not exceed queue.reconnect_max")

    @property
    def prune_interval(self) -> float:
        """How often the sweeper prunes: a quarter of the shorter retention,
        between 1 s and a minute (a backlog is pruned sooner, batch by batch)."""
        kept = [r for r in (self.retain_succeeded, self.retain_failed) if r > 0]
        return min(60.0, max(1.0, min(kept) / 4)) if kept else math.inf

    @property
    def effective_heartbeat_interval(self) -> float:
        return self.heartbeat_interval if self.heartbeat_interval is not None \
            else self.stale_after / 4


@dataclass(frozen=True, slots=True)
class ImportSettings:
    """How the IMAP importer schedules and talks to servers. Times are seconds."""

    #: Mailboxes held in IDLE at once (one connection each); the rest are
    #: synced at their interval. Gmail allows 15 connections per account,
    #: Dovecot 10 per user and address by default.
    idle_limit: int = 50
    #: Re-issue IDLE this often (RFC 2177 says < 29 min; mailbox.org cuts
    #: IDLE after about 23). Each re-IDLE also runs a delta sync.
    idle_refresh: float = 1200.0
    #: Longest wait for connect, login or one IMAP command.
    imap_timeout: float = 30.0
    #: Re-read the registered mailboxes this often (new, removed, changed).
    reload_interval: float = 30.0
    #: After a failed run, retry after 2 s, doubling up to this (and never
    #: later than the mailbox's interval).
    backoff_max: float = 300.0
    #: How long a run waits for another run of the same mailbox to end.
    lock_wait: float = 30.0
    #: List the folders of every registered account this often (new,
    #: renamed and deleted folders); also once at start.
    discovery_interval: float = 600.0
    #: Mailbox syncs running at once in one process. Each holds a connection
    #: of the shared pool for its whole length (a first sync of a large
    #: folder: many minutes); 0 means the pool's size minus 2, so that the
    #: sweeper, the API and account discovery always find one.
    max_runs: int = 0
    #: IMAP sessions at once per server login (host, port, user name), IDLE
    #: and syncs together, in one process; IDLE takes at most one fewer, so
    #: that the login's other folders still sync at their interval. An
    #: account of many folders held one connection per folder and exhausted
    #: the provider's limit (Dovecot 10 per user and address, Gmail 15): the
    #: rest failed with "[LIMIT]", and so did the user's own mail client.
    sessions_per_login: int = 5

    def __post_init__(self) -> None:
        _positive_int("import.idle_limit", self.idle_limit, upper=100_000)
        _positive_int("import.sessions_per_login", self.sessions_per_login, upper=1000)
        _positive_int("import.max_runs", self.max_runs, upper=10_000, lower=0)
        for name in ("idle_refresh", "imap_timeout", "reload_interval", "backoff_max",
                     "lock_wait", "discovery_interval"):
            _positive_float(f"import.{name}", getattr(self, name))


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """Retention of archived mail (nexarch_events/lifecycle/retention.py).
    Days set with ``retention set`` (in the database) win over ``days``."""

    #: Seconds between retention passes (the first runs at start).
    interval: float = 86400.0
    #: Messages erased per transaction.
    batch_size: int = 100
    #: (tenant, days to keep) pairs: ``[retention.days] acme = 365`` in the
    #: file, ``NEXARCH_RETENTION_DAYS=acme=365,beta=30`` in the environment.
    days: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        _positive_float("retention.interval", self.interval)
        _positive_int("retention.batch_size", self.batch_size, upper=10_000)
        seen: set[str] = set()
        for tenant, days in self.days:
            if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", tenant):
                raise ConfigurationError(f"retention.days: {tenant[:40]!r} is not a valid "
                                         "tenant slug (NEXARCH_RETENTION_DAYS)")
            if tenant in seen:
                raise ConfigurationError(f"retention.days: tenant {tenant!r} is given twice")
            seen.add(tenant)
            _positive_int(f"retention.days.{tenant}", days, upper=36500)

    @staticmethod
    def parse_days(key: str, raw: str) -> tuple[tuple[str, int], ...]:
        """``acme=365,beta=30`` -> (("acme", 365), ("beta", 30))."""
        out: list[tuple[str, int]] = []
        for item in raw.split(","):
            if not item.strip():
                continue
            tenant, sep, days = item.partition("=")
            if not sep:
                raise ConfigurationError(f"{key}: {item.strip()[:40]!r} must be TENANT=DAYS "
                                         "(e.g. acme=365,beta=30)")
            out.append((tenant.strip(), int(_parse_number(key, days.strip(), integer=True))))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class ApiToken:
    """A bearer token of the HTTP API. Only its SHA-256 is kept in memory and
    compared (in constant time); ``tenant`` None means admin (every tenant)."""

    name: str
    sha256: str = field(repr=False)
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.name):
            raise ConfigurationError(f"api token name {self.name[:40]!r}: use 1-64 of "
                                     "A-Z a-z 0-9 . _ -")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ConfigurationError(f"api token {self.name!r}: sha256 must be 64 hex digits")
        if self.tenant is not None and not re.fullmatch(
                r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", self.tenant):
            raise ConfigurationError(f"api token {self.name!r}: tenant {self.tenant!r} is not "
                                     "a valid tenant slug")


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """The HTTP API and status page (``nexarch-events run``)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8080
    tokens: tuple[ApiToken, ...] = ()
    #: Concurrent ``/events`` streams, in all and per token; beyond either
    #: a new stream gets 429 with Retry-After.
    max_streams: int = 100
    max_streams_per_token: int = 10

    def __post_init__(self) -> None:
        _positive_int("api.max_streams", self.max_streams, upper=100_000)
        _positive_int("api.max_streams_per_token", self.max_streams_per_token, upper=100_000)
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise ConfigurationError(f"api.port (NEXARCH_API_PORT) must be 0..65535 (0: any "
                                     f"free port), got {self.port!r}")
        names = [t.name for t in self.tokens]
        if len(set(names)) != len(names):
            raise ConfigurationError("api tokens must have distinct names")


@dataclass(frozen=True, slots=True)
class Settings:
    #: None = the embedded Postgres in ``data_dir`` (see nexarch_events.db.embedded).
    database_url: str | None = field(default=None, repr=False)  # holds a password
    #: A direct connection for the LISTEN connection, when database_url goes
    #: through a transaction pooler (PgBouncer pool_mode=transaction), where
    #: LISTEN cannot work. Setting it also turns asyncpg's prepared-statement
    #: cache off on every other connection (the pooler cannot keep them).
    listen_database_url: str | None = field(default=None, repr=False)
    data_dir: str = ".nexarch"
    pool_size: int = 10
    #: Longest any single statement may take before the connection is
    #: treated as dead (a half-open socket would otherwise hang for minutes).
    command_timeout: float = 60.0
    queue: QueueSettings = field(default_factory=QueueSettings)
    importer: ImportSettings = field(default_factory=ImportSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    #: Log lines as "kv" (key=value) or "json".
    log_format: str = "kv"
    #: The lowest level logged (``--log-level`` wins over it).
    log_level: str = "info"
    #: Key that seals IMAP passwords stored in Postgres (NEXARCH_SECRET_KEY_FILE).
    secret_key: str | None = field(default=None, repr=False)
    #: "postgres" (full-text search in the same database) or "manticore".
    index_backend: str = "postgres"
    #: Manticore's HTTP API, e.g. http://manticore:9308 (index_backend=manticore).
    manticore_url: str | None = field(default=None, repr=False)  # may hold one
    #: Seconds each phase of a Manticore request (connect, send, answer) may
    #: take: highlighting huge documents and large bulks need more than 10 s.
    manticore_timeout: float = 30.0
    #: Postgres text-search configurations a document is stemmed with.
    search_languages: tuple[str, ...] = ("german", "english")

    def __post_init__(self) -> None:
        _positive_int("pool_size", self.pool_size, upper=1000)
        if self.listen_database_url is not None:
            if not self.listen_database_url.startswith(("postgres://", "postgresql://")):
                raise ConfigurationError("listen_database_url (NEXARCH_LISTEN_DATABASE_URL) must "
                                         "start with postgresql://")
            if self.database_url is None:
                raise ConfigurationError("listen_database_url (NEXARCH_LISTEN_DATABASE_URL) "
                                         "needs database_url: it is for running behind a "
                                         "pooler, the embedded Postgres has none")
        if self.log_format not in ("kv", "json"):
            raise ConfigurationError(f"log_format must be 'kv' or 'json', got "
                                     f"{self.log_format!r} (NEXARCH_LOG_FORMAT)")
        if self.log_level not in LOG_LEVELS:
            raise ConfigurationError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got "
                                     f"{self.log_level!r} (NEXARCH_LOG_LEVEL)")
        if self.secret_key is not None:
            _check_secret_key(self.secret_key)
        _positive_float("command_timeout", self.command_timeout)
        _positive_float("manticore_timeout", self.manticore_timeout)
        if self.index_backend not in ("postgres", "manticore"):
            raise ConfigurationError(
                f"index_backend must be 'postgres' or 'manticore', got {self.index_backend!r} "
                "(NEXARCH_INDEX_BACKEND)")
        if self.index_backend == "manticore" and not self.manticore_url:
            raise ConfigurationError(
                "index_backend=manticore needs manticore_url (NEXARCH_MANTICORE_URL, "
                "e.g. http://127.0.0.1:9308)")
        if self.manticore_url is not None and not self.manticore_url.startswith(
                ("http://", "https://")):
            raise ConfigurationError("manticore_url must start with http:// or https://")
        if not self.search_languages or not all(
                re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", lang) for lang in self.search_languages):
            raise ConfigurationError(
                "search_languages must name Postgres text-search configurations, "
                "e.g. NEXARCH_SEARCH_LANGUAGES=german,english")
        if self.database_url is not None and not self.database_url.startswith(
                ("postgres://", "postgresql://")):
            raise ConfigurationError(
                "database_url must start with postgresql:// (set NEXARCH_DATABASE_URL), "
                "or be unset to use the embedded Postgres")
        if self.database_url is not None:
            _check_url_ports(self.database_url)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Settings from ``NEXARCH_*`` variables, e.g. ``NEXARCH_QUEUE_WORKERS=8``."""
        env = os.environ if environ is None else environ
        for key, value in env.items():
            # A NUL reaches a path or the database as a bug (exit 70; an
            # operator audit with data_dir = "a\0b").
            if key.startswith("NEXARCH_") and "\x00" in value:
                raise ConfigurationError(f"{key} contains a NUL character")
        queue_kwargs: dict[str, object] = {}
        for f in fields(QueueSettings):
            key = f"NEXARCH_QUEUE_{f.name.upper()}"
            if key in env:
                queue_kwargs[f.name] = _parse_number(key, env[key], integer=f.type == "int")
        import_kwargs: dict[str, object] = {}
        for f in fields(ImportSettings):
            key = f"NEXARCH_IMPORT_{f.name.upper()}"
            if key in env:
                import_kwargs[f.name] = _parse_number(key, env[key], integer=f.type == "int")
        unknown = sorted(k for k in env if k.startswith("NEXARCH_")
                         and k not in cls.known_env_keys()
                         # reserved for test and benchmark tooling
                         and not k.startswith(("NEXARCH_TEST_", "NEXARCH_BENCH_")))
        if unknown:
            raise ConfigurationError(
                f"unknown setting(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(cls.known_env_keys()))}")
        top: dict[str, object] = {}
        if env.get("NEXARCH_DATABASE_URL_FILE"):
            # Secrets come from files (compose/Kubernetes secrets), not the environment.
            top["database_url"] = _read_secret("NEXARCH_DATABASE_URL_FILE",
                                               env["NEXARCH_DATABASE_URL_FILE"])
        if env.get("NEXARCH_DATABASE_URL"):
            top["database_url"] = env["NEXARCH_DATABASE_URL"]
        if env.get("NEXARCH_SECRET_KEY_FILE"):
            top["secret_key"] = _read_secret("NEXARCH_SECRET_KEY_FILE",
                                             env["NEXARCH_SECRET_KEY_FILE"])
        if env.get("NEXARCH_LISTEN_DATABASE_URL"):
            top["listen_database_url"] = env["NEXARCH_LISTEN_DATABASE_URL"]
        if env.get("NEXARCH_DATA_DIR"):
            top["data_dir"] = env["NEXARCH_DATA_DIR"]
        if env.get("NEXARCH_LOG_FORMAT"):
            top["log_format"] = env["NEXARCH_LOG_FORMAT"]
        if env.get("NEXARCH_LOG_LEVEL"):
            top["log_level"] = env["NEXARCH_LOG_LEVEL"].strip().lower()
        api_kwargs: dict[str, object] = {}
        if env.get("NEXARCH_API_HOST"):
            api_kwargs["host"] = env["NEXARCH_API_HOST"]
        if "NEXARCH_API_PORT" in env:
            api_kwargs["port"] = _parse_number("NEXARCH_API_PORT", env["NEXARCH_API_PORT"],
                                               integer=True)
        for name in ("max_streams", "max_streams_per_token"):
            key = f"NEXARCH_API_{name.upper()}"
            if key in env:
                api_kwargs[name] = _parse_number(key, env[key], integer=True)
        if "NEXARCH_API_ENABLED" in env:
            api_kwargs["enabled"] = _parse_bool("NEXARCH_API_ENABLED", env["NEXARCH_API_ENABLED"])
        if api_kwargs:
            top["api"] = ApiSettings(**api_kwargs)  # type: ignore[arg-type]
        retention_kwargs: dict[str, object] = {}
        if "NEXARCH_RETENTION_INTERVAL" in env:
            retention_kwargs["interval"] = _parse_number(
                "NEXARCH_RETENTION_INTERVAL", env["NEXARCH_RETENTION_INTERVAL"], integer=False)
        if "NEXARCH_RETENTION_BATCH_SIZE" in env:
            retention_kwargs["batch_size"] = _parse_number(
                "NEXARCH_RETENTION_BATCH_SIZE", env["NEXARCH_RETENTION_BATCH_SIZE"], integer=True)
        if "NEXARCH_RETENTION_DAYS" in env:
            retention_kwargs["days"] = RetentionSettings.parse_days(
                "NEXARCH_RETENTION_DAYS", env["NEXARCH_RETENTION_DAYS"])
        if retention_kwargs:
            top["retention"] = RetentionSettings(**retention_kwargs)  # type: ignore[arg-type]
        if env.get("NEXARCH_INDEX_BACKEND"):
            top["index_backend"] = env["NEXARCH_INDEX_BACKEND"]
        if env.get("NEXARCH_MANTICORE_URL"):
            top["manticore_url"] = env["NEXARCH_MANTICORE_URL"]
        if "NEXARCH_MANTICORE_TIMEOUT" in env:
            top["manticore_timeout"] = _parse_number(
                "NEXARCH_MANTICORE_TIMEOUT", env["NEXARCH_MANTICORE_TIMEOUT"], integer=False)
        if env.get("NEXARCH_SEARCH_LANGUAGES"):
            top["search_languages"] = tuple(
                part.strip() for part in env["NEXARCH_SEARCH_LANGUAGES"].split(",") if part.strip())
        if "NEXARCH_COMMAND_TIMEOUT" in env:
            top["command_timeout"] = _parse_number(
                "NEXARCH_COMMAND_TIMEOUT", env["NEXARCH_COMMAND_TIMEOUT"], integer=False)
        if "NEXARCH_POOL_SIZE" in env:
            top["pool_size"] = _parse_number("NEXARCH_POOL_SIZE", env["NEXARCH_POOL_SIZE"],
                                             integer=True)
        return cls(queue=QueueSettings(**queue_kwargs),  # type: ignore[arg-type]
                   importer=ImportSettings(**import_kwargs), **top)  # type: ignore[arg-type]

    @staticmethod
    def known_env_keys() -> frozenset[str]:
        queue = {f"NEXARCH_QUEUE_{f.name.upper()}" for f in fields(QueueSettings)}
        queue |= {f"NEXARCH_IMPORT_{f.name.upper()}" for f in fields(ImportSettings)}
        return frozenset(queue | {"NEXARCH_SECRET_KEY_FILE", "NEXARCH_CONFIG",
            "NEXARCH_LOG_FORMAT", "NEXARCH_API_HOST", "NEXARCH_API_PORT", "NEXARCH_API_ENABLED",
            "NEXARCH_DATABASE_URL", "NEXARCH_DATABASE_URL_FILE", "NEXARCH_DATA_DIR",
            "NEXARCH_LISTEN_DATABASE_URL",
            "NEXARCH_POOL_SIZE", "NEXARCH_COMMAND_TIMEOUT", "NEXARCH_INDEX_BACKEND",
            "NEXARCH_MANTICORE_URL", "NEXARCH_SEARCH_LANGUAGES", "NEXARCH_LOG_LEVEL",
            "NEXARCH_MANTICORE_TIMEOUT", "NEXARCH_API_MAX_STREAMS",
            "NEXARCH_API_MAX_STREAMS_PER_TOKEN", "NEXARCH_RETENTION_INTERVAL",
            "NEXARCH_RETENTION_BATCH_SIZE", "NEXARCH_RETENTION_DAYS"})

    @property
    def statement_cache_size(self) -> int:
        """asyncpg's per-connection prepared-statement cache: off behind a
        transaction pooler (listen_database_url set), else asyncpg's default."""
        return 0 if self.listen_database_url is not None else 100

    def pool_options(self) -> dict[str, Any]:
        """What every pool the service and the CLI open takes from these
        settings: ``Database.open(url, max_size=..., **settings.pool_options())``.
        Behind a transaction pooler (listen_database_url set), statements are
        not cached and session locks take a direct connection."""
        return {"command_timeout": self.command_timeout,
                "statement_cache_size": self.statement_cache_size,
                "session_dsn": self.listen_database_url}

    def with_queue(self, **changes: object) -> Settings:
        return replace(self, queue=replace(self.queue, **changes))  # type: ignore[arg-type]


def _check_url_ports(url: str) -> None:
    """A malformed host:port is the user's to fix (exit 2), not a crash deep
    inside the driver. Each host of a multi-host URL is checked."""
    netloc = urlsplit(url).netloc
    hosts = netloc.rpartition("@")[2]
    for host in hosts.split(","):
        try:
            _ = urlsplit("//" + host).port  # raises ValueError if malformed
        except ValueError:
            if "@" not in netloc and "@" in url.partition("://")[2]:
                # The host part ended at a "/", "?" or "#" before an "@":
                # perhaps inside the password, which the "host" then holds.
                raise ConfigurationError(
                    "database_url (NEXARCH_DATABASE_URL): the port is not a number, or the "
                    "user or password holds a '/', '?' or '#' (percent-encode it: %2F, %3F, "
                    "%23); the host part is not shown, as it may hold the password") from None
            raise ConfigurationError(
                f"database_url (NEXARCH_DATABASE_URL): the port in {host[:60]!r} is not a "
                "number 0..65535; e.g. postgresql://user@host:5432/dbname") from None


def exposed_secret(path: str, what: str) -> str | None:
    """A warning if the file at ``path`` holding ``what`` can be read (or
    changed) by every user of the machine, as ssh warns of a key file;
    None if not, or if it cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        return (f"{path} holds {what} and every user of this machine can read it "
                f"(mode {stat.S_IMODE(mode):o}): chmod o-rw {path}")
    return None


def _read_secret(key: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
    except OSError as exc:
        raise ConfigurationError(f"{key}={path!r} cannot be read: {exc.strerror}") from None
    warning = exposed_secret(path, f"a secret ({key})")
    if warning:
        log.warning("%s", warning)
    if not value:
        raise ConfigurationError(f"{key}={path!r} is empty")
    return value


def _check_secret_key(key: str) -> None:
    """A key that cannot seal was found only when a password was first
    stored or read, long after ``config check`` said all was well."""
    try:
        Fernet(key.encode())
    except (ValueError, TypeError):
        raise ConfigurationError(
            "NEXARCH_SECRET_KEY_FILE does not hold a valid key: it must be 32 url-safe "
            "base64-encoded bytes, as `nexarch-events mailbox new-key` prints") from None


def _parse_bool(key: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{key}={raw!r} is not true or false")


def _parse_number(key: str, raw: str, *, integer: bool) -> int | float:
    try:
        return int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ConfigurationError(f"{key}={raw!r} is not {kind}") from None


def _positive_int(key: str, value: object, *, upper: int, lower: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lower <= value <= upper:
        raise ConfigurationError(
            f"{key} must be a whole number from {lower} to {upper}, got {value!r}")


def _positive_float(key: str, value: object, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{key} must be a finite number of seconds {bound}, got {value!r}")
