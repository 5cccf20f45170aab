-- One statement trigger on INSERT instead of two. Migration 0001's
-- notification trigger and 0005's validation trigger each materialised the
-- statement's transition table and ran a plpgsql function over it: for the
-- one-row INSERT of Queue.enqueue_index that was more server CPU than the
-- INSERT itself (bench/enqueue_bench.py). This function does both, in one
-- pass over the new rows: the same checks, in the same order, raising the
-- same errors with the same constraint names, then the same notification.

CREATE FUNCTION mail_index_jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ready     bigint;
    first_id  bigint;
    last_id   bigint;
    next_due  timestamptz;
    bad_slug  text;
    bad_id    integer;
    bad_type  text;
    big       integer;
BEGIN
    SELECT count(*) FILTER (WHERE available_at <= now()),
           min(id), max(id),
           min(available_at) FILTER (WHERE available_at > now()),
           min(tenant_slug) FILTER (
               WHERE NOT (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$')),
           min(length(message_id)) FILTER (WHERE NOT (length(message_id) BETWEEN 1 AND 998)),
           min(jsonb_typeof(payload)) FILTER (WHERE jsonb_typeof(payload) <> 'object'),
           max(octet_length(payload::text))
      INTO ready, first_id, last_id, next_due, bad_slug, bad_id, bad_type, big
      FROM inserted;
    IF bad_slug IS NOT NULL THEN
        RAISE EXCEPTION 'tenant slug % is invalid: use 1-63 of a-z, 0-9 and inner "-"',
                        quote_literal(left(bad_slug, 80))
              USING ERRCODE = 'check_violation', CONSTRAINT = 'mail_index_jobs_tenant_slug',
                    TABLE = 'mail_index_jobs';
    END IF;
    IF bad_id IS NOT NULL THEN
        RAISE EXCEPTION 'message id must be 1-998 characters (got %)', bad_id
              USING ERRCODE = 'check_violation', CONSTRAINT = 'mail_index_jobs_message_id',
                    TABLE = 'mail_index_jobs';
    END IF;
    IF bad_type IS NOT NULL THEN
        RAISE EXCEPTION 'payload must be a JSON object, got %', bad_type
              USING ERRCODE = 'check_violation', CONSTRAINT = 'mail_index_jobs_payload_object',
                    TABLE = 'mail_index_jobs';
    END IF;
    -- Same bound as the Python API (models.MAX_PAYLOAD_BYTES).
    IF big > 1048576 THEN
        RAISE EXCEPTION 'payload is % bytes as JSON; the limit is 1048576', big
              USING ERRCODE = 'check_violation', CONSTRAINT = 'mail_index_jobs_payload_size',
                    TABLE = 'mail_index_jobs';
    END IF;
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

DROP TRIGGER mail_index_jobs_enqueued ON mail_index_jobs;
DROP TRIGGER mail_index_jobs_validate_insert ON mail_index_jobs;
DROP FUNCTION mail_index_jobs_notify_enqueued();
DROP FUNCTION mail_index_jobs_validate();

CREATE TRIGGER mail_index_jobs_after_insert
    AFTER INSERT ON mail_index_jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION mail_index_jobs_after_insert();
