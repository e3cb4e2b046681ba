-- Dashboard sessions kept on the server (SPEC §7): signing out, or reaching the session's fixed
-- end, ends it here, so a copied cookie stops working at once. The cookie carries a random
-- session id; this table keeps only its SHA-256 (a leaked table signs nobody in) and the hash of
-- the token that signed in, which is looked up again on every request: a revoked token ends its
-- sessions too.
CREATE TABLE tickler_ui_session (
    id_hash     bytea PRIMARY KEY,
    token_hash  bytea NOT NULL,
    created_on  timestamptz NOT NULL DEFAULT now(),
    -- Fixed at sign-in: activity never moves it.
    expires_on  timestamptz NOT NULL,
    CONSTRAINT ends_after_start CHECK (expires_on > created_on)
);

-- Sign-in sweeps the sessions that ran out.
CREATE INDEX tickler_ui_session_expires ON tickler_ui_session (expires_on);
