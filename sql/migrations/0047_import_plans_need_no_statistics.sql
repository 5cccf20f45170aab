-- An import's lookups go by index whatever the statistics say (CI under
-- load). mail_import_message reads the message's locations by archive_id
-- (migration 0040). On a locations table that autovacuum had analyzed
-- while it was empty (a fresh install, a test database cloned from a
-- migrated template), the planner took it for a page of nothing, chose a
-- sequential scan, and the session kept that plan: every import read the
-- table's every location, the n-th import n of them, until the next
-- ANALYZE came along (a first sync of 10,000 messages is quadratic for as
-- long). Every statement of the function has an index for its lookup; no
-- sequential scan is ever the plan wanted, so none is taken.
ALTER FUNCTION mail_import_message(text, text, bigint, bigint, text, bytea, integer, bytea,
                                   timestamptz, text, bigint, bigint)
    SET enable_seqscan = off;
