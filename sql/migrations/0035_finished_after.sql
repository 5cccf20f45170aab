-- The replay of an event stream that resumes after job p_after: finished
-- jobs of tenant p_tenant (NULL: all) that finished after it did, in
-- finish order (finished_at, id), at most p_limit. If p_after is not a
-- finished job of that tenant (0, requeued since, or another tenant's,
-- which must not reveal when that one finished), jobs with a higher id
-- are the best guess.
--
-- One statement served every tenant (queue.sql, "finished_after"): a range
-- of the finished index from the cursor, filtered by tenant. For a tenant
-- whose last jobs finished long ago, while others' kept finishing, that
-- walked every other tenant's job since the cursor: 20,040 index entries
-- for 39 rows behind 20,000 of another tenant's jobs (the planner assumes
-- a tenant's jobs are spread evenly over time, as in 0030).
-- For one tenant it is now two bounded steps, as last_finished does:
-- the next 1,000 finished jobs of anyone after the cursor (a busy tenant's
-- page is in them), else, after that window, the tenant's own jobs,
-- planned for that tenant. Never more than the window plus the tenant's
-- own kept history (queue retention bounds it). No new index: every ack
-- would maintain it (issue 11's per-job path).
-- tests/integration/test_finished_reads.py counts the entries read.
CREATE FUNCTION mail_index_jobs_finished_after(p_tenant text, p_after bigint, p_limit integer)
RETURNS TABLE (id bigint, tenant_slug text, status text, job_type text, message_id text,
               finished_at timestamptz)
LANGUAGE plpgsql STABLE AS $fn$
#variable_conflict use_column
DECLARE
    mark_at timestamptz;
    mark_id bigint;
    seen integer := 0;
    found integer := 0;
    w record;
BEGIN
    SELECT j.finished_at, j.id INTO mark_at, mark_id
      FROM mail_index_jobs j
     WHERE j.id = p_after
       AND j.status IN ('succeeded', 'failed')
       AND (p_tenant IS NULL OR j.tenant_slug = p_tenant);

    IF mark_id IS NULL THEN
        -- No cursor in finish order: the tenant's jobs (or all) above it by id.
        IF p_tenant IS NULL THEN
            RETURN QUERY
            SELECT j.id, j.tenant_slug, j.status, j.job_type, j.message_id, j.finished_at
              FROM mail_index_jobs j
             WHERE j.status IN ('succeeded', 'failed')
               AND j.id > p_after
             ORDER BY j.finished_at, j.id
             LIMIT p_limit;
        ELSE
            RETURN QUERY EXECUTE
                'SELECT t.id, t.tenant_slug, t.status, t.job_type, t.message_id, t.finished_at
                   FROM (SELECT j.id, j.tenant_slug, j.status, j.job_type, j.message_id,
                                j.finished_at
                           FROM mail_index_jobs j
                          WHERE j.tenant_slug = $1
                            AND j.status IN (''succeeded'', ''failed'')
                            AND j.id > $2
                         OFFSET 0) t
                  ORDER BY t.finished_at, t.id
                  LIMIT $3'
                USING p_tenant, p_after, p_limit;
        END IF;
        RETURN;
    END IF;

    IF p_tenant IS NULL THEN
        RETURN QUERY
        SELECT j.id, j.tenant_slug, j.status, j.job_type, j.message_id, j.finished_at
          FROM mail_index_jobs j
         WHERE j.status IN ('succeeded', 'failed')
           AND (j.finished_at, j.id) > (mark_at, mark_id)
         ORDER BY j.finished_at, j.id
         LIMIT p_limit;
        RETURN;
    END IF;

    -- The window: what finished next, anyone's.
    FOR w IN
        SELECT j.id, j.tenant_slug, j.status, j.job_type, j.message_id, j.finished_at
          FROM mail_index_jobs j
         WHERE j.status IN ('succeeded', 'failed')
           AND (j.finished_at, j.id) > (mark_at, mark_id)
         ORDER BY j.finished_at, j.id
         LIMIT 1000
    LOOP
        seen := seen + 1;
        mark_at := w.finished_at;
        mark_id := w.id;
        IF w.tenant_slug = p_tenant THEN
            id := w.id; tenant_slug := w.tenant_slug; status := w.status;
            job_type := w.job_type; message_id := w.message_id;
            finished_at := w.finished_at;
            RETURN NEXT;
            found := found + 1;
            IF found >= p_limit THEN
                RETURN;
            END IF;
        END IF;
    END LOOP;
    IF seen < 1000 THEN
        RETURN;  -- the window held every job finished after the cursor
    END IF;

    -- Past the window: the tenant's own jobs. OFFSET 0 keeps the ORDER BY
    -- ... LIMIT out of the tenant's scan, which would otherwise become the
    -- walk through everyone's jobs again.
    RETURN QUERY EXECUTE
        'SELECT t.id, t.tenant_slug, t.status, t.job_type, t.message_id, t.finished_at
           FROM (SELECT j.id, j.tenant_slug, j.status, j.job_type, j.message_id, j.finished_at
                   FROM mail_index_jobs j
                  WHERE j.tenant_slug = $1
                    AND j.status IN (''succeeded'', ''failed'')
                    AND (j.finished_at, j.id) > ($2, $3)
                 OFFSET 0) t
          ORDER BY t.finished_at, t.id
          LIMIT $4'
        USING p_tenant, mark_at, mark_id, p_limit - found;
END
$fn$;
