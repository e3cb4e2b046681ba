-- Upcoming load: a queue's open events by the minute they fall due (tickler_due_count, kept by the
-- event triggers), read in one statement so that every part comes from one snapshot.

-- name: queue_forecast
-- `minute` rows: the minutes of the window [:from, :to) that hold events; `later`: those at :to or
-- after; `passed`: the events of the window's first minute already due at :now (the counters
-- know minutes, not seconds: these few are counted on the open-schedule index and taken off);
-- `seeded`: whether the counters were counted from the events (else they may lack the events
-- written before their triggers, and the forecast is not exact).
SELECT 'minute' AS part, minute, sum(n)::bigint AS n
FROM tickler_due_count
WHERE queue = :queue AND minute >= :from AND minute < :to
GROUP BY minute
HAVING sum(n) <> 0
UNION ALL
SELECT 'later', NULL, coalesce(sum(n), 0)::bigint
FROM tickler_due_count
WHERE queue = :queue AND minute >= :to
UNION ALL
SELECT 'passed', NULL, count(*)
FROM tickler_event
WHERE queue = :queue AND dequeued_on IS NULL AND schedule_on >= :from AND schedule_on < :now
UNION ALL
SELECT 'seeded', NULL, count(*) FROM tickler_due_count_seeded;

-- name: fold_due_counts
-- The counters' slots added up, minutes at zero removed (tickler_fold_due_counts).
SELECT tickler_fold_due_counts() AS removed;
