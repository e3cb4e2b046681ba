-- Upcoming load: tickler_due_count, the open events of each queue by the hour (UTC) they fall
-- due and by minute within it, which the event triggers of event_triggers.sql keep through
-- tickler_count_due; the upkeep that folds its slots together; and its first count from the
-- events.
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

-- Sixty per-minute counts from the counts of some minutes of an hour (p_minute: 0 to 59). In
-- PL/pgSQL: a SQL function over generate_series would be planned and run as a subquery for each
-- hour a statement touches, ten times the cost of this loop.
CREATE OR REPLACE FUNCTION tickler_minute_counts(p_minute integer[], p_n bigint[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_counts  bigint[] := array_fill(0::bigint, ARRAY[60]);
BEGIN
    FOR i IN 1 .. cardinality(p_minute) LOOP
        v_counts[p_minute[i] + 1] := v_counts[p_minute[i] + 1] + p_n[i];
    END LOOP;
    RETURN v_counts;
END
$$;

-- Two rows' per-minute counts added up, minute by minute.
CREATE OR REPLACE FUNCTION tickler_add_minute_counts(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_sum  bigint[] := a;
BEGIN
    FOR i IN 1 .. 60 LOOP
        IF b[i] <> 0 THEN
            v_sum[i] := v_sum[i] + b[i];
        END IF;
    END LOOP;
    RETURN v_sum;
END
$$;

-- Add p_n[i] open events falling due in minute p_minute[i] of queue p_queue[i] (negative: taken
-- off), given one entry per queue and minute (NULL: nothing to do). One upsert of one row per
-- queue and hour, in this backend's slot: a statement's cost grows with the hours its events fall
-- due in, not with its rows.
CREATE OR REPLACE FUNCTION tickler_count_due(p_queue text[], p_minute timestamptz[], p_n bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_queue IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO tickler_due_count AS c (queue, hour, slot, n, minutes)
    SELECT d.queue, d.hour, pg_backend_pid() % 16, sum(d.n)::bigint,
           -- one minute of the hour (a batch spread over days has about one event an hour): the
           -- array by concatenation, without a function call
           CASE WHEN count(*) = 1
                THEN array_fill(0::bigint, ARRAY[min(d.m)]) || sum(d.n)::bigint || array_fill(0::bigint, ARRAY[59 - min(d.m)])
                ELSE tickler_minute_counts(array_agg(d.m), array_agg(d.n)) END
    FROM (
        SELECT u.queue, date_trunc('hour', u.minute AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
               extract(minute FROM u.minute AT TIME ZONE 'UTC')::integer AS m, u.n
        FROM unnest(p_queue, p_minute, p_n) AS u (queue, minute, n)
    ) AS d
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, hour, slot) DO UPDATE
    SET n = c.n + excluded.n, minutes = tickler_add_minute_counts(c.minutes, excluded.minutes);
END
$$;

-- The slots of each hour added up into slot 0, and the hours left with no event removed (an hour
-- whose events were all delivered): a forecast then reads about one row per hour. A writer that
-- meanwhile adds to a slot being folded waits for this transaction, then inserts its slot afresh.
-- Returns the rows removed.
CREATE OR REPLACE FUNCTION tickler_fold_due_counts() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_folded  bigint;
    v_empty   bigint;
BEGIN
    -- Rows a writer holds are left for the next fold (SKIP LOCKED): the fold waits for no writer
    -- there, and then locks slot 0 in the order writers lock their rows (queue, hour).
    WITH locked AS (
        SELECT queue, hour, slot FROM tickler_due_count WHERE slot <> 0
        ORDER BY queue, hour, slot FOR UPDATE SKIP LOCKED
    ), folded AS (
        DELETE FROM tickler_due_count AS c USING locked AS l
        WHERE (c.queue, c.hour, c.slot) = (l.queue, l.hour, l.slot)
        RETURNING c.queue, c.hour, c.minutes
    ), per_minute AS (
        SELECT f.queue, f.hour, u.i, sum(u.x)::bigint AS x
        FROM folded AS f, unnest(f.minutes) WITH ORDINALITY AS u (x, i)
        GROUP BY 1, 2, 3
    ), summed AS (
        INSERT INTO tickler_due_count AS c (queue, hour, slot, n, minutes)
        SELECT queue, hour, 0, sum(x)::bigint, array_agg(x ORDER BY i)
        FROM per_minute GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, hour, slot) DO UPDATE
        SET n = c.n + excluded.n, minutes = tickler_add_minute_counts(c.minutes, excluded.minutes)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM folded) - (SELECT count(*) FROM summed) INTO v_folded;
    DELETE FROM tickler_due_count AS c
    USING (SELECT queue, hour, slot FROM tickler_due_count
           WHERE slot = 0 AND n = 0 AND minutes = array_fill(0::bigint, ARRAY[60])
           FOR UPDATE SKIP LOCKED) AS empty
    WHERE (c.queue, c.hour, c.slot) = (empty.queue, empty.hour, empty.slot);
    GET DIAGNOSTICS v_empty = ROW_COUNT;
    RETURN v_folded + v_empty;
END
$$;

-- The first count, once (tickler_due_count_seeded says it was made): the events written before
-- the triggers kept the table are counted here. Applied after event_triggers.sql, so every writer
-- from now on keeps the table; the lock waits for those still at work under the former triggers,
-- and keeps new ones out while the events are counted.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tickler_due_count_seeded) THEN
        LOCK TABLE tickler_event IN SHARE MODE;
        DELETE FROM tickler_due_count;
        PERFORM tickler_count_due(array_agg(queue), array_agg(minute), array_agg(n))
        FROM (SELECT queue, tickler_due_minute(schedule_on) AS minute, count(*) AS n
              FROM tickler_event WHERE outcome IS NULL GROUP BY 1, 2) AS due;
        PERFORM tickler_fold_due_counts();
        INSERT INTO tickler_due_count_seeded DEFAULT VALUES;
    END IF;
END
$$;
