"""The scripted IMAP server for the tests: it lives in the package now
(``nexarch_events.testing.imap_server``, also the demo's sample server)."""

from nexarch_events.testing.imap_server import (
    Faults,
    ScriptedImapServer,
    ScriptedMessage,
    open_scripted_imap,
    resolve_uid_set,
    substitute_body,
)

__all__ = ["Faults", "ScriptedImapServer", "ScriptedMessage", "open_scripted_imap",
           "resolve_uid_set", "substitute_body"]
