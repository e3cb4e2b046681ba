-- What the dashboard reads beyond the API's calls (scheduler/store/ui_reads.py).

-- name: timeline_page
-- One page of a key's timeline, newest first: the `limit` newest timeline rows before the row
-- `before` (keyset on the primary key (queue, item_key, id)), with the `claimed` entry each row
-- carries (tickler_timeline_entry, migration 0016); the first page also has the running lease's
-- `claimed` entry, which has no row of its own yet (id NULL).
WITH page AS (
    SELECT t.id FROM tickler_timeline AS t
    WHERE t.queue = :queue AND t.item_key = :item_key
      AND (CAST(:before AS bigint) IS NULL OR t.id < CAST(:before AS bigint))
    ORDER BY t.id DESC
    LIMIT :limit
)
SELECT e.id, e.step, e.at, e.action, e.actor, e.event_id, e.schedule_on, e.details
FROM tickler_timeline_entry AS e
WHERE e.queue = :queue AND e.item_key = :item_key
  AND (e.id = ANY(ARRAY(SELECT id FROM page)) OR (e.id IS NULL AND CAST(:before AS bigint) IS NULL))
ORDER BY e.id DESC NULLS FIRST, e.step DESC;
