-- Where an event stream that starts now stands: the job of tenant p_tenant
-- (NULL: any) that finished last, by finish time, then id; NULL if none.
--
-- Asked with the tenant in the WHERE, the planner walked the finished index
-- back from the newest job and filtered by tenant: it assumes a tenant's
-- jobs are spread evenly over time. For a tenant idle since the others got
-- busy that read every job finished since (20,001 index entries for a
-- 50-job tenant behind 20,000 newer jobs; planning per call chose the same).
-- An index on (tenant_slug, finished_at, id) would answer directly, but
-- every ack would maintain it, on the path issue 11 measures per job.
-- Instead, two bounded steps: the newest 1,000 finished jobs (a busy
-- tenant's last job is among them), else the tenant's own jobs through
-- (tenant_slug, message_id, id), planned for that tenant. The cost is at
-- most the window plus the tenant's own kept history (queue retention
-- bounds it), never the other tenants'.
-- tests/integration/test_finished_reads.py counts the entries read.
CREATE FUNCTION mail_index_jobs_last_finished(p_tenant text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_id bigint;
BEGIN
    IF p_tenant IS NULL THEN
        SELECT j.id INTO found_id
          FROM mail_index_jobs j
         WHERE j.status IN ('succeeded', 'failed')
         ORDER BY j.finished_at DESC, j.id DESC
         LIMIT 1;
        RETURN found_id;
    END IF;

    SELECT w.id INTO found_id
      FROM (SELECT j.id, j.tenant_slug, j.finished_at
              FROM mail_index_jobs j
             WHERE j.status IN ('succeeded', 'failed')
             ORDER BY j.finished_at DESC, j.id DESC
             LIMIT 1000) w
     WHERE w.tenant_slug = p_tenant
     ORDER BY w.finished_at DESC, w.id DESC
     LIMIT 1;
    IF found_id IS NOT NULL THEN
        RETURN found_id;
    END IF;

    -- OFFSET 0 keeps the ORDER BY ... LIMIT out of the tenant's scan, which
    -- would otherwise become the backward walk again.
    EXECUTE 'SELECT t.id
               FROM (SELECT j.id, j.finished_at
                       FROM mail_index_jobs j
                      WHERE j.tenant_slug = $1
                        AND j.status IN (''succeeded'', ''failed'')
                     OFFSET 0) t
              ORDER BY t.finished_at DESC, t.id DESC
              LIMIT 1'
       INTO found_id USING p_tenant;
    RETURN found_id;
END $$;
