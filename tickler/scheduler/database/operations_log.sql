-- Upcoming load: the minute an open event falls due, as tickler_due_count keeps it (the event
-- triggers of event_triggers.sql write it), the maintenance that keeps that table small, and its
-- first count from the events.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- The start of the minute (UTC) of `at`: whatever the session's time zone, the same minute.
CREATE OR REPLACE FUNCTION tickler_due_minute(at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('minute', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;

-- The slots of each minute added up into slot 0, and the minutes left at zero removed (a minute
-- whose events were all delivered): a forecast then reads about one row per minute. A writer that
-- meanwhile adds to a slot being folded waits for this statement, then inserts its slot afresh.
-- Returns the rows removed.
CREATE OR REPLACE FUNCTION tickler_fold_due_counts() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_folded  bigint;
    v_zero    bigint;
BEGIN
    WITH folded AS (
        DELETE FROM tickler_due_count WHERE slot <> 0 RETURNING queue, minute, n
    ), summed AS (
        INSERT INTO tickler_due_count AS c (queue, minute, slot, n)
        SELECT queue, minute, 0, sum(n) FROM folded GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, minute, slot) DO UPDATE SET n = c.n + excluded.n
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM folded) - (SELECT count(*) FROM summed) INTO v_folded;
    DELETE FROM tickler_due_count WHERE slot = 0 AND n = 0;
    GET DIAGNOSTICS v_zero = ROW_COUNT;
    RETURN v_folded + v_zero;
END
$$;

-- The first count, once (tickler_due_count_seeded says it was made): the events written before
-- the triggers above kept the table are counted here. Applied after event_triggers.sql, so every
-- writer from now on keeps the table; the lock waits for those still at work under the former
-- triggers, and keeps new ones out while the events are counted.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tickler_due_count_seeded) THEN
        LOCK TABLE tickler_event IN SHARE MODE;
        DELETE FROM tickler_due_count;
        INSERT INTO tickler_due_count (queue, minute, slot, n)
        SELECT queue, tickler_due_minute(schedule_on), 0, count(*)
        FROM tickler_event WHERE outcome IS NULL
        GROUP BY 1, 2;
        INSERT INTO tickler_due_count_seeded DEFAULT VALUES;
    END IF;
END
$$;
