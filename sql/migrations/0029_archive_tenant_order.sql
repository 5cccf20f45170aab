-- One tenant's archive in id order without reading the other tenants'
-- (found beside issue 10's lookups; tests/integration/test_tenant_pages.py).
-- Keyset pages of one tenant (reindex, the index's rebuild, erasing a
-- tenant, retention's "undated" and "expired" passes) ask for
-- "tenant_slug = $1 AND id > $2 ORDER BY id LIMIT n". No index served both
-- columns in that order: the generic plan walked the primary key from $2
-- and filtered by tenant (a small tenant's page read every other tenant's
-- rows above it), the custom plan read the tenant's every row through
-- (tenant_slug, sha256) and sorted them, per page.
--
-- The unique (id, tenant_slug) key exists for the composite foreign keys
-- that keep a location or a date in its message's tenant. Its columns in
-- the other order serve those keys the same way and these pages too, so it
-- is replaced rather than joined by another index (no extra work per
-- archived message). The two foreign keys depend on the old index and are
-- made again on the new one, as they were.
ALTER TABLE mail_archive
    ADD CONSTRAINT mail_archive_tenant_id UNIQUE (tenant_slug, id);
ALTER TABLE mail_archive_locations DROP CONSTRAINT mail_archive_locations_archive;
ALTER TABLE mail_archive_dates DROP CONSTRAINT mail_archive_dates_archive;
ALTER TABLE mail_archive DROP CONSTRAINT mail_archive_id_tenant;
ALTER TABLE mail_archive_locations
    ADD CONSTRAINT mail_archive_locations_archive FOREIGN KEY (archive_id, tenant_slug)
        REFERENCES mail_archive (id, tenant_slug) ON DELETE CASCADE;
ALTER TABLE mail_archive_dates
    ADD CONSTRAINT mail_archive_dates_archive FOREIGN KEY (archive_id, tenant_slug)
        REFERENCES mail_archive (id, tenant_slug) ON DELETE CASCADE;

-- A page of one tenant's ids, planned for that tenant. Which plan reads
-- about one page depends on the tenant's share of the archive: walking the
-- primary key is right for a tenant that holds most of it, the (tenant_slug,
-- id) key for any other. A prepared statement soon switches to one generic
-- plan for every tenant, which guesses an average share, and a small
-- tenant's page then read the rows of every tenant above it. EXECUTE plans
-- each call with the tenant and the bounds it is given.
-- With the columns its callers need beside the id, so none joins the
-- archive again (a join to a function's rows may be planned as a scan of
-- the whole table).
CREATE FUNCTION mail_archive_tenant_ids(p_tenant text, p_after bigint, p_limit integer)
RETURNS TABLE (id bigint, archived_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT a.id, a.archived_at FROM mail_archive a
          WHERE a.tenant_slug = $1 AND a.id > $2
          ORDER BY a.id LIMIT $3'
        USING p_tenant, p_after, p_limit;
END $$;

-- The tenant's newest id (0 if none), planned for that tenant likewise.
CREATE FUNCTION mail_archive_tenant_newest(p_tenant text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    newest bigint;
BEGIN
    EXECUTE 'SELECT max(a.id) FROM mail_archive a WHERE a.tenant_slug = $1'
       INTO newest USING p_tenant;
    RETURN coalesce(newest, 0);
END $$;
