-- Message bodies compressed with lz4 instead of pglz where the server was
-- built with lz4 (Debian's and the official images are): measured in
-- bench/import_bench.py, one body per commit costs markedly less Postgres CPU
-- with lz4. Only values written from now on are affected; reads handle both.
-- A server without lz4 keeps pglz (this migration then changes nothing).
DO $$
BEGIN
    ALTER TABLE mail_archive ALTER COLUMN raw SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available on this server: mail_archive.raw stays pglz';
END $$;
