-- A refresh token the provider rotated to (RFC 6749 section 6: it may
-- revoke the old one; Microsoft issues a new one with every refresh, and
-- the one registered expires 90 days after it was issued, however often it
-- was used) was kept only in the memory of one token source: after a
-- restart, and between runs once an account's last runner had released its
-- source, the registered token was presented again, and a provider that
-- had revoked it or let it expire refused every folder of the account.
-- The newest one is kept here, sealed with the operator's key (never in
-- clear text), under a digest of the client and the registered token: a
-- new registered token (the operator signed in again) starts a new chain.
CREATE TABLE mail_import_oauth_refresh (
    client_key   bytea       PRIMARY KEY,
    token_sealed text        NOT NULL,
    rotated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT mail_import_oauth_refresh_key CHECK (octet_length(client_key) = 32),
    CONSTRAINT mail_import_oauth_refresh_sealed
        CHECK (token_sealed LIKE 'sealed:v1:%' AND length(token_sealed) <= 32768)
);
