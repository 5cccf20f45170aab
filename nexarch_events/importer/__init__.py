"""The IMAP importer: registered mailboxes, their sync state, one sync run
(``sync``), and the scheduler that keeps every mailbox in step (``scheduler``)."""
