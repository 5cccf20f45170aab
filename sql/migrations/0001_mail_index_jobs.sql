-- The index job queue (seed: indexworker/queue.go), plus leases, heartbeats
-- and a NOTIFY on every enqueue. The tables are the truth; NOTIFY is a hint.

CREATE TABLE mail_index_jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_type      text        NOT NULL,
    -- DNS-label style: lower case, digits, inner hyphens. No underscore, so a
    -- slug maps to a Manticore table name ('-' -> '_') without collisions.
    tenant_slug   text        NOT NULL,
    message_id    text        NOT NULL,
    payload       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status        text        NOT NULL DEFAULT 'pending',
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT 5,
    available_at  timestamptz NOT NULL DEFAULT now(),
    locked_at     timestamptz,
    locked_by     text,
    -- A fresh token per claim: heartbeat, complete, fail and release must
    -- present it, so a worker whose claim was taken over cannot ack.
    lease         uuid,
    heartbeat_at  timestamptz,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,

    CONSTRAINT mail_index_jobs_job_type CHECK (job_type IN ('index', 'delete')),
    CONSTRAINT mail_index_jobs_status
        CHECK (status IN ('pending', 'processing', 'succeeded', 'failed')),
    CONSTRAINT mail_index_jobs_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    CONSTRAINT mail_index_jobs_message_id
        CHECK (length(message_id) BETWEEN 1 AND 998),
    CONSTRAINT mail_index_jobs_payload_object CHECK (jsonb_typeof(payload) = 'object'),
    -- Same bound as the Python API (models.MAX_PAYLOAD_BYTES), so producers
    -- writing plain SQL get it too.
    CONSTRAINT mail_index_jobs_payload_size CHECK (octet_length(payload::text) <= 1048576),
    CONSTRAINT mail_index_jobs_attempts CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT mail_index_jobs_lease_iff_processing
        CHECK ((status = 'processing') = (lease IS NOT NULL))
);

-- The claim scans ready jobs in due order; finished rows never enter this
-- index, so it stays small however much history the table keeps.
CREATE INDEX mail_index_jobs_ready
    ON mail_index_jobs (available_at, id)
    WHERE status = 'pending';

-- Per-key FIFO: the claim asks "is there an older open job for this
-- (tenant, message)?" -- one probe per candidate, usually over 0-2 rows.
-- Not partial: re-queue asks the same about newer jobs of any status.
CREATE INDEX mail_index_jobs_key
    ON mail_index_jobs (tenant_slug, message_id, id);

-- The sweeper's stale-lease scan.
CREATE INDEX mail_index_jobs_heartbeat
    ON mail_index_jobs (heartbeat_at)
    WHERE status = 'processing';

-- Operator views: failed jobs per tenant, status lookups by key.
CREATE INDEX mail_index_jobs_failed
    ON mail_index_jobs (tenant_slug, id)
    WHERE status = 'failed';

-- One notification per INSERT statement (a bulk enqueue of 10,000 rows sends
-- one), from a trigger so that any program's INSERT wakes workers.
-- Payload: ids and counts only; see docs/events.md.
CREATE FUNCTION mail_index_jobs_notify_enqueued() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ready     bigint;
    first_id  bigint;
    last_id   bigint;
    next_due  timestamptz;
BEGIN
    SELECT count(*) FILTER (WHERE available_at <= now()),
           min(id), max(id),
           min(available_at) FILTER (WHERE available_at > now())
      INTO ready, first_id, last_id, next_due
      FROM enqueued;
    IF first_id IS NOT NULL THEN
        PERFORM pg_notify('nexarch_index_jobs', json_build_object(
            'v', 1,
            'event', 'enqueued',
            'ready', ready,
            'first_id', first_id,
            'last_id', last_id,
            'next_due', extract(epoch FROM next_due)
        )::text);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER mail_index_jobs_enqueued
    AFTER INSERT ON mail_index_jobs
    REFERENCING NEW TABLE AS enqueued
    FOR EACH STATEMENT
    EXECUTE FUNCTION mail_index_jobs_notify_enqueued();
