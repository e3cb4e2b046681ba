-- Retention per queue (SPEC §9, issue #21): each queue's history goes when its own
-- `retention_days` is past, still a whole table at a time.
--
-- Until now a day partition held every queue's history of that day, so a day went only once it
-- was past the longest retention of any queue: a queue keeping 1 day of history kept as much as
-- the queue keeping the most (3650 days for the queues of an upgraded database).
--
-- Now each day's table is itself partitioned by queue (LIST), into one part per retention class:
--
--   tickler_event_history_20261127            the day (RANGE of the parent, as before)
--     tickler_event_history_20261127_r30      the queues that had retention_days = 30 when the
--                                             part was made (its list of values)
--     tickler_event_history_20261127_r1       ... those with 1
--     tickler_event_history_20261127_rest     DEFAULT: queues listed in no part (new since)
--
-- and the same for tickler_timeline. A row goes to its part by its queue, so nothing a writer
-- does changes: no column was added, every INSERT is the one it was. The maintenance pass
-- (tickler_maintain_history) makes the parts with the day. A queue created later gets its part
-- in the days ahead at the next pass; its rows of the day it was created on wait in that day's
-- `_rest`, and move to a part of their own once the day is over (see the pass for why not
-- before).
--
-- A part is dropped once its day is past the retention of every queue of its list, as they are
-- set *now* (a queue whose retention_days changed after the part was made is held to its new
-- setting; see tickler_history_keep_from for queues since deleted). The parts of one day are
-- dropped one by one; the day's table and its `_rest` go with the last of them. Dropping a part
-- subtracts its events from the queue counters by (day, queue) from tickler_history_count, which
-- needs no column either: a part holds exactly the rows of its day and its queues.
--
-- What is not exact: queues of one part share it until it goes. When a queue's retention_days is
-- lowered, the days already made keep it in the part of its former class: those days go when
-- the other queues of that part allow (the days made after the change follow the new setting).
-- When it is raised, the days already made are kept for the new, longer time, and so is the
-- history of the other queues of their parts. Days made before this upgrade are whole-day
-- partitions as before: they go when every queue allows, as they did.

ALTER TABLE tickler_history_partition
    ADD COLUMN day_table text,          -- a part: the day's table it is a partition of
    ADD COLUMN queues text[],           -- a part: the queues it lists (NULL: the day's `_rest`)
    ADD COLUMN retention_days integer,  -- a part: the class it was made for
    ADD COLUMN partitioned boolean NOT NULL DEFAULT false,  -- a day's table, partitioned by queue
    ADD COLUMN settled boolean NOT NULL DEFAULT false;      -- a day's table past, its `_rest` sorted

COMMENT ON COLUMN tickler_history_partition.day_table IS
    'For a part of a day (migration 0074): the day''s table; NULL for a partition of the parent itself.';
COMMENT ON COLUMN tickler_history_partition.queues IS
    'For a part of a day: the queues whose rows it holds (its LIST bound); NULL for the day''s DEFAULT part (`_rest`) and for whole-day partitions.';


-- The start of the first day that must be kept, for the history of these queues: the day
-- (today − the longest retention_days of those queues); with archive_before_prune on any of
-- them, no later than what the archive has written. Queues since deleted have no say (their
-- events went with them; their timeline entries follow the queues they share a part with),
-- unless none of them is left: then p_class (the class the part was made for), else the longest
-- retention of any queue.
CREATE FUNCTION tickler_history_keep_from(p_now timestamptz, p_queues text[], p_class integer)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT least(
        date_trunc('day', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
            - make_interval(days => coalesce(
                  (SELECT max(q.retention_days) FROM tickler_queue AS q WHERE q.name = ANY(p_queues)),
                  p_class,
                  (SELECT max(q.retention_days) FROM tickler_queue AS q),
                  30)),
        CASE WHEN EXISTS (SELECT 1 FROM tickler_queue AS q WHERE q.name = ANY(p_queues) AND q.archive_before_prune)
             THEN coalesce((SELECT archived_through FROM tickler_archive_progress), '-infinity') END)
$$;


-- The parts a day's table lacks: one per retention class, for the queues it lists in no part —
-- every such queue for a day not yet past (p_every_queue), else only those with rows in its
-- `_rest`. Their rows move from `_rest` into the part, which is then attached (the lock on
-- `_rest`, taken first, makes a writer of such a row wait for the attach; see 0031). Returns
-- the parts made.
CREATE FUNCTION tickler_add_history_parts(p_day_table text, p_every_queue boolean) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_day      tickler_history_partition;
    v_rest     text := p_day_table || '_rest';
    v_in_rest  text[];
    v_class    record;
    v_name     text;
    v_n        integer;
    v_made     text[] := '{}';
BEGIN
    SELECT * INTO STRICT v_day FROM tickler_history_partition WHERE name = p_day_table;
    IF NOT p_every_queue THEN
        EXECUTE format('SELECT array_agg(DISTINCT queue) FROM %I', v_rest) INTO v_in_rest;
        IF v_in_rest IS NULL THEN
            RETURN v_made;
        END IF;
    END IF;
    FOR v_class IN
        SELECT q.retention_days, array_agg(q.name ORDER BY q.name) AS queues
        FROM tickler_queue AS q
        WHERE (p_every_queue OR q.name = ANY(v_in_rest))
          AND NOT EXISTS (SELECT 1 FROM tickler_history_partition AS p
                          WHERE p.day_table = p_day_table AND q.name = ANY(p.queues))
        GROUP BY q.retention_days ORDER BY q.retention_days
    LOOP
        v_name := p_day_table || '_r' || v_class.retention_days;
        v_n := 1;
        WHILE EXISTS (SELECT 1 FROM tickler_history_partition WHERE name = v_name) LOOP
            v_n := v_n + 1;
            v_name := p_day_table || '_r' || v_class.retention_days || '_' || v_n;
        END LOOP;
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', v_rest);
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name, v_day.parent);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE queue = ANY($1) RETURNING *) '
                       'INSERT INTO %I SELECT * FROM moved', v_rest, v_name) USING v_class.queues;
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%s)', p_day_table, v_name,
                       (SELECT string_agg(quote_literal(n), ', ') FROM unnest(v_class.queues) AS n));
        INSERT INTO tickler_history_partition (name, parent, day_from, day_to, day_table, queues, retention_days)
        VALUES (v_name, v_day.parent, v_day.day_from, v_day.day_to, p_day_table, v_class.queues, v_class.retention_days);
        v_made := v_made || v_name;
    END LOOP;
    RETURN v_made;
END
$$;


-- A day of a history table (latest: 0031), now partitioned by queue: its table, its `_rest`, a
-- part per retention class of the queues there are, then the day's rows from the parent's
-- default partition (each to its part), then the attach. Returns what it made (nothing when the
-- day has its table).
DROP FUNCTION tickler_add_history_day(text, date);
CREATE FUNCTION tickler_add_history_day(p_parent text, p_day date) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_name    text := p_parent || '_' || to_char(p_day, 'YYYYMMDD');
    v_column  text := CASE p_parent WHEN 'tickler_timeline' THEN 'at' ELSE 'dequeued_on' END;
    v_from    timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    v_to      timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
    v_made    text[];
BEGIN
    IF EXISTS (SELECT 1 FROM tickler_history_partition WHERE name = v_name) THEN
        RETURN '{}';
    END IF;
    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', p_parent || '_default');
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY LIST (queue)',
                   v_name, p_parent);
    EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', v_name || '_rest', v_name);
    INSERT INTO tickler_history_partition (name, parent, day_from, day_to, partitioned) VALUES
        (v_name, p_parent, v_from, v_to, true);
    INSERT INTO tickler_history_partition (name, parent, day_from, day_to, day_table) VALUES
        (v_name || '_rest', p_parent, v_from, v_to, v_name);
    v_made := ARRAY[v_name] || tickler_add_history_parts(v_name, true);
    EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                   'INSERT INTO %I SELECT * FROM moved',
                   p_parent || '_default', v_column, v_column, v_name) USING v_from, v_to;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   p_parent, v_name, v_from, v_to);
    RETURN v_made;
END
$$;


-- The maintenance pass (latest: 0021), by part. Returns the tables it made and dropped.
CREATE OR REPLACE FUNCTION tickler_maintain_history(p_now timestamptz DEFAULT NULL, p_days_ahead integer DEFAULT 3)
RETURNS TABLE (created text[], dropped text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_today    date := (v_now AT TIME ZONE 'UTC')::date;
    v_keep     timestamptz;
    v_created  text[] := '{}';
    v_dropped  text[] := '{}';
    v_locked   boolean := false;
    v_day      date;
    v_part     record;
    v_queues   text[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('tickler.history')) THEN
        RETURN QUERY SELECT v_created, v_dropped;  -- another process is at it
        RETURN;
    END IF;
    -- Creating and dropping a partition waits for the transactions writing its table; the writers
    -- that come after queue behind it. It gives up soon instead (and the next pass tries again):
    -- before PostgreSQL's deadlock check (deadlock_timeout, 1 s by default) would pick a victim,
    -- so a writer never fails because of this pass.
    PERFORM set_config('lock_timeout', '500ms', true);

    -- The days: those the default partitions hold rows of, today and the days ahead.
    FOR v_day IN
        SELECT DISTINCT (h.dequeued_on AT TIME ZONE 'UTC')::date FROM tickler_event_history_default AS h
        UNION
        SELECT DISTINCT (t.at AT TIME ZONE 'UTC')::date FROM tickler_timeline_default AS t
        UNION
        SELECT v_today + d FROM generate_series(0, p_days_ahead) AS d
        ORDER BY 1
    LOOP
        -- the timeline's first: the order of a finish (it logs, then moves) and of the drops
        v_created := v_created || tickler_add_history_day('tickler_timeline', v_day)
                               || tickler_add_history_day('tickler_event_history', v_day);
    END LOOP;
    -- The parts days lack, never for a day being written: a row a writer routed to `_rest` just
    -- before a part for its queue is attached fails PostgreSQL's re-check of `_rest`'s bound
    -- ("violates partition constraint"). So a day ahead (from an hour on) gets a part for each
    -- queue created since it was made, and a day past (by an hour: time for the transactions that
    -- began that day to commit) gets parts for the queues with rows in its `_rest` — those
    -- created during that day — once; it is then settled, and later passes leave it alone.
    FOR v_part IN
        SELECT p.name, p.day_from, p.day_to FROM tickler_history_partition AS p
        WHERE p.partitioned
          AND (p.day_from > v_now + interval '1 hour' OR (NOT p.settled AND p.day_to <= v_now - interval '1 hour'))
        ORDER BY p.day_from, p.parent DESC  -- each day's timeline, then its history
    LOOP
        v_created := v_created || tickler_add_history_parts(v_part.name, v_part.day_from > v_now);
        UPDATE tickler_history_partition SET settled = true
        WHERE name = v_part.name AND day_to <= v_now - interval '1 hour';
    END LOOP;

    LOCK TABLE tickler_archive_run IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM tickler_archive_run WHERE state <> 'deleted') THEN
        RETURN QUERY SELECT v_created, v_dropped;
        RETURN;
    END IF;
    v_keep := tickler_history_keep_from(v_now);

    -- 1. The parts of a day whose queues all allow it, and the whole-day partitions (from before
    --    0074, and the upgraded one) that every queue allows.
    FOR v_part IN
        SELECT p.name, p.parent, p.day_from, p.day_to, p.queues FROM tickler_history_partition AS p
        WHERE NOT p.partitioned
          AND CASE WHEN p.queues IS NOT NULL
                   THEN p.day_to <= tickler_history_keep_from(v_now, p.queues, p.retention_days)
                   ELSE p.day_table IS NULL AND p.day_to <= v_keep END
        ORDER BY p.day_to, p.name
    LOOP
        IF NOT v_locked THEN
            -- Dropping a partition locks its parent. A finish writes the timeline, then the history
            -- (its statement logs; the move comes after it): the same order here.
            LOCK TABLE ONLY tickler_timeline IN ACCESS EXCLUSIVE MODE;
            LOCK TABLE ONLY tickler_event_history IN ACCESS EXCLUSIVE MODE;
            v_locked := true;
        END IF;
        IF v_part.parent = 'tickler_event_history' THEN
            PERFORM tickler_forget_history_counts(v_part.day_from, v_part.day_to, v_part.queues);
        END IF;
        EXECUTE format('DROP TABLE %I', v_part.name);
        DELETE FROM tickler_history_partition WHERE name = v_part.name;
        v_dropped := v_dropped || v_part.name::text;
    END LOOP;

    -- 2. The day's table, with its `_rest`, once its parts are gone and the queues with rows in
    --    `_rest` (a queue since deleted, or one no pass has given its part yet) allow it too.
    FOR v_part IN
        SELECT p.name, p.parent, p.day_from, p.day_to FROM tickler_history_partition AS p
        WHERE p.partitioned AND p.day_to <= date_trunc('day', v_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
          AND NOT EXISTS (SELECT 1 FROM tickler_history_partition AS c
                          WHERE c.day_table = p.name AND c.queues IS NOT NULL)
        ORDER BY p.day_to, p.name
    LOOP
        EXECUTE format('SELECT array_agg(DISTINCT queue) FROM %I', v_part.name || '_rest') INTO v_queues;
        CONTINUE WHEN v_queues IS NOT NULL AND NOT v_part.day_to <= tickler_history_keep_from(v_now, v_queues, NULL);
        IF NOT v_locked THEN
            LOCK TABLE ONLY tickler_timeline IN ACCESS EXCLUSIVE MODE;
            LOCK TABLE ONLY tickler_event_history IN ACCESS EXCLUSIVE MODE;
            v_locked := true;
        END IF;
        IF v_part.parent = 'tickler_event_history' THEN
            PERFORM tickler_forget_history_counts(v_part.day_from, v_part.day_to, NULL);
        END IF;
        EXECUTE format('DROP TABLE %I', v_part.name);  -- and its `_rest`
        DELETE FROM tickler_history_partition WHERE name = v_part.name OR day_table = v_part.name;
        v_dropped := v_dropped || v_part.name::text;
    END LOOP;
    RETURN QUERY SELECT v_created, v_dropped;
END
$$;

-- What dropping history between p_from (NULL: the beginning) and p_to takes off the queue
-- counters, of these queues (NULL: all that are left of those days), from tickler_history_count:
-- the drop never reads the rows it drops.
CREATE FUNCTION tickler_forget_history_counts(p_from timestamptz, p_to timestamptz, p_queues text[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
    SELECT h.queue, h.outcome, pg_backend_pid() % 64, -sum(h.n)
    FROM tickler_history_count AS h
    WHERE h.day < (p_to AT TIME ZONE 'UTC')::date
      AND (p_from IS NULL OR h.day >= (p_from AT TIME ZONE 'UTC')::date)
      AND (p_queues IS NULL OR h.queue = ANY(p_queues))
    GROUP BY 1, 2 HAVING sum(h.n) <> 0 ORDER BY 1, 2
    ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    DELETE FROM tickler_history_count AS h
    WHERE h.day < (p_to AT TIME ZONE 'UTC')::date
      AND (p_from IS NULL OR h.day >= (p_from AT TIME ZONE 'UTC')::date)
      AND (p_queues IS NULL OR h.queue = ANY(p_queues));
$$;


-- The days made ahead before this upgrade are whole-day partitions; those still empty are made
-- again, by queue, by the pass below. (A day that holds rows stays as it is, and goes when every
-- queue allows, as before.) First, in the order every pass and writer takes them: the pass's
-- lock (a dispatcher's pass at work is waited for, and the pass below cannot find it taken and
-- skip its work, which would leave the days dropped here unmade), then both tables whole, so that
-- no writer of the previous release, running meanwhile, commits a row into a day between the
-- look that finds it empty and its DROP (the writers wait, then route their rows to the days
-- made below).
SELECT pg_advisory_xact_lock(hashtext('tickler.history'));
LOCK TABLE tickler_timeline, tickler_event_history IN ACCESS EXCLUSIVE MODE;
DO $$
DECLARE
    v_part record;
    v_empty boolean;
BEGIN
    FOR v_part IN
        SELECT p.name FROM tickler_history_partition AS p
        WHERE NOT p.partitioned AND p.day_table IS NULL AND p.day_from IS NOT NULL AND p.day_to > now()
        ORDER BY p.parent DESC, p.day_from  -- the timeline's first, as every dropper locks them
    LOOP
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', v_part.name) INTO v_empty;
        IF v_empty THEN
            EXECUTE format('DROP TABLE %I', v_part.name);
            DELETE FROM tickler_history_partition WHERE name = v_part.name;
        END IF;
    END LOOP;
END
$$;
SELECT tickler_maintain_history();
