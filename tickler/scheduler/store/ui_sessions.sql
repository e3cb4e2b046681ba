-- Dashboard sessions (tickler_ui_session): started at sign-in, ended at sign-out or at a fixed time.

-- name: start_ui_session
-- A new session of a token, ending at a fixed time; sessions that ran out are swept on the way.
WITH swept AS (DELETE FROM tickler_ui_session WHERE expires_on <= now())
INSERT INTO tickler_ui_session (id_hash, token_hash, expires_on)
VALUES (:id_hash, :token_hash, now() + make_interval(secs => :lifetime_seconds))
RETURNING expires_on;

-- name: ui_session_principal
-- The principal of a live session: the session has not run out and its token is not revoked.
SELECT t.principal, t.is_admin, t.queues, s.expires_on, t.id AS token_id
FROM tickler_ui_session AS s
JOIN tickler_token AS t ON t.token_hash = s.token_hash
WHERE s.id_hash = :id_hash AND s.expires_on > now() AND t.revoked_on IS NULL;

-- name: end_ui_session
-- Sign-out: the session is gone, whoever holds a copy of its cookie.
DELETE FROM tickler_ui_session WHERE id_hash = :id_hash;
