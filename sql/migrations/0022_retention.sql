-- Retention (issue 14): per tenant, keep mail N days by its received date,
-- then a daily pass erases it through the erasure path
-- (nexarch_events/lifecycle/retention.py; queries in sql/lifecycle.sql).

-- Days per tenant set with `nexarch-events retention set`; a row here wins
-- over the configuration file's [retention.days].
CREATE TABLE mail_retention_policies (
    tenant_slug  text        PRIMARY KEY,
    days         integer     NOT NULL,
    set_by       text        NOT NULL,
    set_at       timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT mail_retention_policies_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    CONSTRAINT mail_retention_policies_days CHECK (days BETWEEN 1 AND 36500)
);

-- The Date header of messages no server gave an INTERNALDATE for, read
-- once by the retention pass (a row with sent_at NULL: the message has no
-- usable Date, and its archive time counts). The received date is the
-- earliest INTERNALDATE of its locations, else this, else archived_at.
CREATE TABLE mail_archive_dates (
    archive_id   bigint      PRIMARY KEY,
    tenant_slug  text        NOT NULL,
    sent_at      timestamptz,
    CONSTRAINT mail_archive_dates_archive
        FOREIGN KEY (archive_id, tenant_slug)
        REFERENCES mail_archive (id, tenant_slug) ON DELETE CASCADE
);
