-- A folder of an account was opened (EXAMINE) with its decoded name
-- encoded again, not with the name LIST gave: a server that lists a name
-- in a form other than the canonical modified UTF-7 (a raw UTF-8 name, as
-- some servers send unasked, or a non-canonical encoding) answered
-- NONEXISTENT, and the folder's mail was never imported (an accounts
-- audit). The name as listed is kept here; NULL (a mailbox registered by
-- hand) encodes the folder name as before.
ALTER TABLE mail_import_mailboxes
    ADD COLUMN folder_wire text,
    ADD CONSTRAINT mail_import_mailboxes_folder_wire
        CHECK (folder_wire IS NULL OR length(folder_wire) BETWEEN 1 AND 8000);
