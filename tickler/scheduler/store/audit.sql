-- The operations log (tickler_operation_log): who changed how tickler runs, and what changed.

-- name: record_operation
-- One entry, in the caller's transaction (the change it records commits with it, or neither does).
INSERT INTO tickler_operation_log (actor, action, queue, before, after)
VALUES (:actor, :action, :queue, CAST(:before AS jsonb), CAST(:after AS jsonb))
RETURNING id;

-- name: operation_log_page
-- A page of entries, newest first, after the cursor's entry (:before_id) and matching the filters
-- given (NULL: any).
SELECT id, at, actor, action, queue, before, after
FROM tickler_operation_log
WHERE (CAST(:queue AS text) IS NULL OR queue = CAST(:queue AS text))
  AND (CAST(:actor AS text) IS NULL OR actor = CAST(:actor AS text))
  AND (CAST(:action AS text) IS NULL OR action = CAST(:action AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR at >= CAST(:since AS timestamptz))
  AND (CAST(:before_id AS bigint) IS NULL OR id < CAST(:before_id AS bigint))
ORDER BY id DESC
LIMIT :limit;

-- name: prune_operation_log
-- Retention: the entries older than :days days (at :now, default the database's clock).
DELETE FROM tickler_operation_log
WHERE at < coalesce(CAST(:now AS timestamptz), now()) - make_interval(days => :days);
