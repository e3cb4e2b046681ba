-- Upcoming load: a queue's open events by the hour they fall due and by minute within it
-- (tickler_due_count, kept by the event triggers), read in one statement: one snapshot.

-- name: queue_forecast
-- `hour` rows: each slot's row of the hours [:from, :to) (:from the current hour; the reader
-- adds the slots up and skips the minutes already past); `later`: the events of the hours from
-- :to on; `passed`: the events of the current minute already due at :now (the counters know
-- minutes, not seconds: these few are counted on the open-schedule index and taken off);
-- `seeded`: whether the counters were counted from the events (else they may lack the events
-- written before their triggers, and the forecast is not exact).
SELECT 'hour' AS part, hour, n, minutes
FROM tickler_due_count
WHERE queue = :queue AND hour >= :from AND hour < :to
UNION ALL
SELECT 'later', NULL, coalesce(sum(n), 0)::bigint, NULL
FROM tickler_due_count
WHERE queue = :queue AND hour >= :to
UNION ALL
SELECT 'passed', NULL, count(*), NULL
FROM tickler_event
WHERE queue = :queue AND dequeued_on IS NULL AND schedule_on >= :minute AND schedule_on < :now
UNION ALL
SELECT 'seeded', NULL, count(*), NULL FROM tickler_due_count_seeded;

-- name: fold_due_counts
-- The counters' slots added up, hours with no event removed (tickler_fold_due_counts).
SELECT tickler_fold_due_counts() AS removed;
