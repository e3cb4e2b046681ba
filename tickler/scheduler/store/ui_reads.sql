-- What the dashboard reads beyond the API's calls (scheduler/store/ui_reads.py).

-- name: timeline_page
-- One page of a key's timeline, newest first: the `limit` newest timeline rows before the row
-- `before` (keyset on the key's index (queue, item_key, id)), with the `claimed` entry each row
-- carries (tickler_timeline_entry, scheduler/database/history.sql); the first page also has the
-- running lease's `claimed` entry, which has no row of its own yet (id NULL).
WITH page AS (  -- with the deliveries that are history rows (tickler_timeline_all)
    SELECT t.id FROM tickler_timeline_newest(:queue, :item_key, false, NULL, CAST(:before AS bigint), CAST(:limit AS integer)) AS t
)
SELECT e.id, e.step, e.at, e.action, e.actor, e.event_id, e.schedule_on, e.details
FROM tickler_timeline_entry AS e
WHERE e.queue = :queue AND e.item_key = :item_key
  AND (e.id = ANY(ARRAY(SELECT id FROM page)) OR (e.id IS NULL AND CAST(:before AS bigint) IS NULL))
ORDER BY e.id DESC NULLS FIRST, e.step DESC;

-- name: fair_backlogs
-- The fairness keys of a queue with the largest due backlogs (SPEC §10), counted over two bounded
-- reads, each at most :scan events: the first due, unleased, ungrouped events in claim order
-- (priority levels from the highest, the earlier due time first in each), and the first due,
-- unleased events of groups by due time (a group is claimed as one unit, but each of its events
-- counts for its own fairness key). Bounded whatever the backlog; it shows who holds the head of
-- the queue. The levels are a skip scan of tickler_event_claimable_priority, one probe each, and
-- each level's rows a range of it, read only until :scan rows are in; the grouped events are a
-- range of tickler_event_claimable_group. `seen` / `grouped_seen` is how many events each read
-- looked at (= :scan: there are more).
WITH RECURSIVE levels AS (
    (SELECT e.priority FROM tickler_event AS e
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
     ORDER BY e.priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT e.priority FROM tickler_event AS e
            WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
              AND e.priority < l.priority
            ORDER BY e.priority DESC LIMIT 1)
    FROM levels AS l WHERE l.priority IS NOT NULL
),
due AS (
    SELECT d.fairness_key FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT e.fairness_key FROM tickler_event AS e
        WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
          AND e.priority = l.priority AND e.schedule_on <= coalesce(CAST(:now AS timestamptz), now())
        ORDER BY e.schedule_on, e.id
        LIMIT :scan
    ) AS d
    WHERE l.priority IS NOT NULL
    LIMIT :scan
),
grouped AS (
    SELECT e.fairness_key FROM tickler_event AS e
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.group_key IS NOT NULL AND e.lease_id IS NULL
      AND e.schedule_on <= coalesce(CAST(:now AS timestamptz), now())
    ORDER BY e.schedule_on, e.id
    LIMIT :scan
),
counted AS (
    SELECT d.fairness_key, false AS in_group FROM due AS d
    UNION ALL
    SELECT g.fairness_key, true FROM grouped AS g
)
SELECT c.fairness_key, count(*) AS due, count(*) FILTER (WHERE c.in_group) AS grouped,
       sum(count(*)) OVER () AS seen, sum(count(*) FILTER (WHERE c.in_group)) OVER () AS grouped_seen
FROM counted AS c
GROUP BY c.fairness_key
ORDER BY count(*) DESC, c.fairness_key
LIMIT :keys;
