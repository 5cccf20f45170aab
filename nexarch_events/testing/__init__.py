"""What users import for their own tests: the mail-imported recorder
(``record_imports``), the pytest plugin (``pytest_plugin``, registered by
entry point), a scripted IMAP server (``imap_server``) and sample mail
(``samples``). Product code never imports this package; the demo (an
assembly) is the one exception, for its built-in sample mailbox."""

from .recorder import ImportEvent, ImportRecorder, record_imports

__all__ = ["ImportEvent", "ImportRecorder", "record_imports"]
