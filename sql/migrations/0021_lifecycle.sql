-- Archive lifecycle (issue 14): legal holds, the audit log, and the record
-- of erased messages. The statements that use them are in sql/lifecycle.sql;
-- the design is in nexarch_events/lifecycle/.

-- A legal hold freezes mail: held messages are never erased, by erasure or
-- by retention. Scope: a whole tenant, one mailbox (every message with a
-- location in it), or a search-language query (the messages it finds when
-- the hold is added, recorded in mail_legal_hold_items, and whatever it
-- finds at the time of an erasure). A removed hold keeps its row
-- (removed_at) so the audit log can name it.
CREATE TABLE mail_legal_holds (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_slug  text        NOT NULL,
    scope        text        NOT NULL,
    mailbox      text,
    query        text,
    reason       text        NOT NULL,
    created_by   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    removed_by   text,
    removed_at   timestamptz,

    CONSTRAINT mail_legal_holds_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    CONSTRAINT mail_legal_holds_scope CHECK (
        (scope = 'tenant' AND mailbox IS NULL AND query IS NULL)
        OR (scope = 'mailbox' AND length(mailbox) BETWEEN 1 AND 1000 AND query IS NULL)
        OR (scope = 'query' AND length(query) BETWEEN 1 AND 1000 AND mailbox IS NULL)),
    CONSTRAINT mail_legal_holds_reason CHECK (length(reason) BETWEEN 1 AND 1000),
    CONSTRAINT mail_legal_holds_who CHECK (length(created_by) BETWEEN 1 AND 200),
    CONSTRAINT mail_legal_holds_removed CHECK ((removed_at IS NULL) = (removed_by IS NULL))
);
CREATE INDEX mail_legal_holds_active ON mail_legal_holds (tenant_slug) WHERE removed_at IS NULL;

-- The messages a query hold found when it was added (no foreign key to the
-- archive: a held message is never erased, and the row must outlive a
-- removed hold's messages too).
CREATE TABLE mail_legal_hold_items (
    hold_id     bigint NOT NULL REFERENCES mail_legal_holds (id),
    tenant_slug text   NOT NULL,
    archive_id  bigint NOT NULL,
    PRIMARY KEY (hold_id, archive_id)
);
CREATE INDEX mail_legal_hold_items_message ON mail_legal_hold_items (tenant_slug, archive_id);

-- Who did what to which mail, and when: every erasure, retention pass,
-- hold change and retention setting. Never message content: ids, the
-- operator's query, counts. Append-only: nothing in the product deletes a
-- row, and only a retention pass completes its own row when it ends.
CREATE TABLE mail_audit_log (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text        NOT NULL,
    action       text        NOT NULL,
    tenant_slug  text        NOT NULL,
    -- ids (at most the first 1000; mail_erasures has every one), query,
    -- hold id, days ...
    target       jsonb       NOT NULL DEFAULT '{}',
    count        integer     NOT NULL DEFAULT 0,

    CONSTRAINT mail_audit_log_action CHECK (action IN (
        'erase', 'erase_query', 'erase_tenant', 'retention_pass',
        'hold_add', 'hold_remove', 'retention_set')),
    CONSTRAINT mail_audit_log_actor CHECK (length(actor) BETWEEN 1 AND 200),
    CONSTRAINT mail_audit_log_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    CONSTRAINT mail_audit_log_count CHECK (count >= 0)
);
CREATE INDEX mail_audit_log_tenant ON mail_audit_log (tenant_slug, id);

-- Every erased message (archive ids are never reused): lets verify-index
-- tell "erased but still in the index" from "missing", and an erasure
-- repeated by id answer "already erased". The delete job is the proof that
-- the index forgot it.
CREATE TABLE mail_erasures (
    tenant_slug    text        NOT NULL,
    archive_id     bigint      NOT NULL,
    erased_at      timestamptz NOT NULL DEFAULT now(),
    audit_id       bigint      NOT NULL REFERENCES mail_audit_log (id),
    delete_job_id  bigint,
    PRIMARY KEY (tenant_slug, archive_id)
);
