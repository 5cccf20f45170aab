-- The archive: each raw message stored once per tenant, identified by the
-- SHA-256 of its bytes (Message-ID is missing, reused and rewritten in real
-- mail), with every place it was seen.

CREATE TABLE mail_archive (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_slug  text        NOT NULL,
    sha256       bytea       NOT NULL,
    size_bytes   integer     NOT NULL,
    raw          bytea       NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now(),
    -- What indexing had to repair or cap (e.g. "body truncated to ..."),
    -- written by the indexer so that no cap is silent.
    index_notes  text[]      NOT NULL DEFAULT '{}',

    CONSTRAINT mail_archive_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    CONSTRAINT mail_archive_sha256 CHECK (octet_length(sha256) = 32),
    -- Same bound as archive.MAX_MESSAGE_BYTES (128 MiB).
    CONSTRAINT mail_archive_size
        CHECK (size_bytes = octet_length(raw) AND size_bytes BETWEEN 1 AND 134217728),
    CONSTRAINT mail_archive_once_per_tenant UNIQUE (tenant_slug, sha256),
    -- Target of the locations' composite foreign key (tenant isolation).
    CONSTRAINT mail_archive_id_tenant UNIQUE (id, tenant_slug)
);

CREATE TABLE mail_archive_locations (
    archive_id   bigint      NOT NULL,
    tenant_slug  text        NOT NULL,
    mailbox      text        NOT NULL,
    uidvalidity  bigint      NOT NULL,
    uid          bigint      NOT NULL,
    seen_at      timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (tenant_slug, mailbox, uidvalidity, uid),
    -- A location can only point at a message of its own tenant.
    CONSTRAINT mail_archive_locations_archive
        FOREIGN KEY (archive_id, tenant_slug)
        REFERENCES mail_archive (id, tenant_slug) ON DELETE CASCADE,
    -- (text can never hold NUL: Postgres refuses it on input.)
    CONSTRAINT mail_archive_locations_mailbox CHECK (length(mailbox) BETWEEN 1 AND 1000),
    -- RFC 3501: UIDs are nz-number; UIDVALIDITY 0 is kept (broken servers send
    -- it) so that such a mailbox can still be recorded and flagged.
    CONSTRAINT mail_archive_locations_uid CHECK (uid BETWEEN 1 AND 4294967295),
    CONSTRAINT mail_archive_locations_uidvalidity CHECK (uidvalidity BETWEEN 0 AND 4294967295)
);

CREATE INDEX mail_archive_locations_by_archive ON mail_archive_locations (archive_id);
