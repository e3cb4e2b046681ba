-- Issues #21 and #24: one B-tree fewer per scheduled event.
--
-- Every open, ungrouped event had entries in three indexes of claim order:
-- tickler_event_claimable (queue, schedule_on, id), tickler_event_claimable_priority (queue,
-- priority, schedule_on, id) and tickler_event_claimable_fair (queue, priority, fairness_key,
-- schedule_on, id), all with the same predicate. Since priorities (0045) the claim reads
-- _priority, a level at a time; the plain index served only the dispatcher's "when is the next
-- event due" (next_due), the capped fair claim's "is anything due left" (has_due_events) and the
-- dashboard's fair backlogs. They now read _priority a level at a time as well, and the index
-- goes: each insert writes one B-tree entry fewer (bench/analysis.md, "One claim-order index
-- fewer": ~9 % of PostgreSQL's CPU per single-event schedule).

-- The earliest due time among the queue's open, unleased, ungrouped events (NULL: none): one
-- probe of tickler_event_claimable_priority per priority level that has such events, lowest
-- level first (each probe finds the next level and its earliest event at once), one more to
-- find there is none above. Generic plans: each statement is one index probe whatever the values.
CREATE FUNCTION tickler_first_claimable(p_queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_level  smallint;
    v_first  timestamptz;
    v_min    timestamptz;
BEGIN
    SELECT e.priority, e.schedule_on INTO v_level, v_first FROM tickler_event AS e
    WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
    ORDER BY e.priority, e.schedule_on, e.id
    LIMIT 1;
    WHILE FOUND LOOP
        v_min := least(v_min, v_first);
        SELECT e.priority, e.schedule_on INTO v_level, v_first FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
          AND e.priority > v_level
        ORDER BY e.priority, e.schedule_on, e.id
        LIMIT 1;
    END LOOP;
    RETURN v_min;
END
$$;

DROP INDEX tickler_event_claimable;
