-- History without its id index (issue #21): one B-tree entry fewer per finished event.
--
-- tickler_event_history_id (id), in every day of history, served only reads of a finished event
-- by its id alone. Every such reader knows more than the id (bench/analysis.md, "History without
-- its id index"): the key's timeline gives the event's queue, its schedule_on and the time it
-- finished (the finishing entry's `at` is the row's dequeued_on: the statement that finishes an
-- event writes both from one clock), and an archive run records them with each event it selects.
-- With those, tickler_event_history_schedule (queue, schedule_on, id) finds the row in the one
-- day of history that holds it: tickler_history_event() below.
--
-- Rows written by the archive before this upgrade (an unfinished run) get the same columns here,
-- read through the index that this migration then drops.

ALTER TABLE tickler_archive_item
    ADD COLUMN queue text,
    ADD COLUMN schedule_on timestamptz,
    ADD COLUMN dequeued_on timestamptz;

COMMENT ON COLUMN tickler_archive_item.queue IS
    'The event''s queue, schedule_on and dequeued_on: how the run''s reads find it in history (0063).';

UPDATE tickler_archive_item AS i
SET queue = e.queue, schedule_on = e.schedule_on, dequeued_on = e.dequeued_on
FROM tickler_event_history AS e
WHERE e.id = i.event_id;

DROP INDEX tickler_event_history_id;


-- A finished event by its queue, id and schedule_on, in the day (UTC) of `finished_at`: one probe
-- of the (queue, schedule_on, id) index of that day's partition (the day bound prunes the others
-- when the plan is built, or at run time when the values come from another row of the query).
-- Inlined into its caller (a single-SELECT, STABLE SQL function) as a lateral subquery that is not
-- pulled up (OFFSET 0): flattened into a join, a planner that believes the history days are empty
-- (no statistics yet) would read the queue's whole range of each day and filter it.
CREATE FUNCTION tickler_history_event(p_queue text, p_id bigint, p_schedule_on timestamptz, p_finished_at timestamptz)
RETURNS SETOF tickler_event_history
LANGUAGE sql STABLE AS $$
SELECT h.*
FROM tickler_event_history AS h
WHERE h.queue = p_queue AND h.schedule_on = p_schedule_on AND h.id = p_id
  AND h.dequeued_on >= (date_trunc('day', p_finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
  AND h.dequeued_on < (date_trunc('day', p_finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') + interval '24 hours'
OFFSET 0  -- kept a subquery of its own: its caller's row gives the values, each probe uses all three
$$;

COMMENT ON FUNCTION tickler_history_event(text, bigint, timestamptz, timestamptz) IS
    'A finished event by queue, id and schedule_on, in the UTC day of its finish (its finishing timeline entry''s at).';
