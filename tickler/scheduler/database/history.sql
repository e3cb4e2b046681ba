-- History and the timeline: the timeline's one writer, reads of a key's newest entries and of a
-- finished event, the day partitions (each divided by queue) with their maintenance pass, and the
-- views over open and finished events and over every timeline entry.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- A time as tickler's answers spell it: RFC 3339 in UTC with "Z", microseconds only when present.
CREATE OR REPLACE FUNCTION tickler_rfc3339(at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN date_part('microseconds', at)::bigint % 1000000 <> 0
                THEN to_char(at AT TIME ZONE 'UTC', '.US') ELSE '' END
        || 'Z'
$$;

-- The one writer of tickler_timeline: inserts these entries, in array order (their ids follow
-- it); NULL: nothing. Every writer builds its entries in its own statement and hands them over in
-- one array, one call per statement (never per row). A caller's CTE `logged AS (SELECT
-- tickler_timeline_write(array_agg(...)) FROM changed ...)` is a plain SELECT, which PostgreSQL
-- runs only when read: the statement's result reads it (CROSS JOIN logged: one row).
-- STRICT: a statement with nothing to log (array_agg over no rows is NULL) does not run it.
-- PL/pgSQL: a LANGUAGE sql function that cannot be inlined (it writes) parses and plans its
-- statement at every call, a third of a single-event schedule's time in it; PL/pgSQL keeps the
-- plan for the session.
CREATE OR REPLACE FUNCTION tickler_timeline_write(p_entries tickler_timeline_row[]) RETURNS void
LANGUAGE plpgsql STRICT VOLATILE AS $$
BEGIN
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details
    FROM unnest(p_entries) AS t;
END
$$;

-- The timeline is append-only: an UPDATE, DELETE or TRUNCATE of it is refused, except the
-- archive's removal of what it archived and an erasure's rewrite of an erased key's entries.
CREATE OR REPLACE FUNCTION tickler_timeline_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The archive job is the one writer allowed to remove history, and says so explicitly.
    IF TG_OP IN ('DELETE', 'TRUNCATE') AND current_setting('tickler.archiving', true) = 'on' THEN
        RETURN NULL;
    END IF;
    -- An erasure (tickler_erase_timeline, erasing.sql) replaces values in place, rows stay.
    IF TG_OP = 'UPDATE' AND current_setting('tickler.erasing', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'tickler_timeline is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- A key's newest entries (at most p_limit, below id p_before when given; of one event when
-- p_event_id is given; only events' entries, not a schedule's, when p_events_only), newest
-- first: what the key's latest event, a finished event by id, retry and the dashboard's timeline
-- page read. The view tickler_timeline_all cannot serve "newest first" by index:
-- PostgreSQL does not merge a UNION ALL branch that has a WHERE clause into the append of the
-- other one, so its history side would read and sort every delivery of the key. Here each side
-- reads its own index newest first (tickler_timeline_key; tickler_event_history_entry) and stops
-- at p_limit rows. A LANGUAGE sql STABLE function of one SELECT: the planner inlines it. The
-- collations are the indexes' own, said explicitly: inlined, the parameters take the call's input
-- collation, which a call with columns of both (queue: default, item_key: "C") leaves undecided,
-- and a comparison in another collation than an index's cannot use it.
CREATE OR REPLACE FUNCTION tickler_timeline_newest(
    p_queue text, p_item_key text, p_events_only boolean, p_event_id bigint, p_before bigint, p_limit integer
) RETURNS TABLE (id bigint, event_id bigint, at timestamptz, schedule_on timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT x.id, x.event_id, x.at, x.schedule_on
    FROM (
        (SELECT t.id, t.event_id, t.at, t.schedule_on
         FROM tickler_timeline AS t
         WHERE t.queue = p_queue COLLATE "default" AND t.item_key = p_item_key COLLATE "C"
           AND (NOT p_events_only OR t.event_id IS NOT NULL)
           AND (p_event_id IS NULL OR t.event_id = p_event_id)
           AND (p_before IS NULL OR t.id < p_before)
         ORDER BY t.id DESC LIMIT p_limit)
        UNION ALL
        (SELECT h.entry_id, h.id, h.dequeued_on, h.schedule_on
         FROM tickler_event_history AS h
         WHERE h.queue = p_queue COLLATE "default" AND h.item_key = p_item_key COLLATE "C" AND h.entry_id IS NOT NULL
           AND (p_event_id IS NULL OR h.id = p_event_id)
           AND (p_before IS NULL OR h.entry_id < p_before)
         ORDER BY h.entry_id DESC LIMIT p_limit)
    ) AS x
    ORDER BY x.id DESC LIMIT p_limit
$$;

-- A deleted queue's delivered entries, kept: its history rows are deleted with it, and its keys'
-- timelines stay (README: a queue deleted). Before that delete, the entries that are history
-- rows are written into tickler_timeline with the ids they have, as the view renders them. Not a
-- new entry (tickler_timeline_write writes those): the same entry moved. Returns how many.
CREATE OR REPLACE FUNCTION tickler_timeline_keep_entries(p_queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_kept bigint;
BEGIN
    INSERT INTO tickler_timeline (id, queue, item_key, event_id, at, action, actor, schedule_on, details)
    OVERRIDING SYSTEM VALUE
    SELECT a.id, a.queue, a.item_key, a.event_id, a.at, a.action, a.actor, a.schedule_on, a.details
    FROM tickler_timeline_all AS a
    WHERE a.queue = p_queue AND a.action = 'delivered'
      AND a.id IN (SELECT h.entry_id FROM tickler_event_history AS h WHERE h.queue = p_queue AND h.entry_id IS NOT NULL);
    GET DIAGNOSTICS v_kept = ROW_COUNT;
    RETURN v_kept;
END
$$;

-- A finished event by its queue, id and schedule_on, in the day (UTC) of its finish,
-- `finished_at` (the `at` of its finishing timeline entry, which the finishing statement writes
-- from the same clock as dequeued_on). History has no index by id alone: every reader knows these
-- from the key's timeline or from an archive run's item. One probe of the (queue, schedule_on, id)
-- index of that day's partition (the day bound prunes the others when the plan is built, or at
-- run time when the values come from another row of the query).
-- Inlined into its caller (a single-SELECT, STABLE SQL function) as a lateral subquery that is not
-- pulled up (OFFSET 0): flattened into a join, a planner that believes the history days are empty
-- (no statistics yet) would read the queue's whole range of each day and filter it.
CREATE OR REPLACE FUNCTION tickler_history_event(p_queue text, p_id bigint, p_schedule_on timestamptz, p_finished_at timestamptz)
RETURNS SETOF tickler_event_history
LANGUAGE sql STABLE AS $$
SELECT h.*
FROM tickler_event_history AS h
WHERE h.queue = p_queue AND h.schedule_on = p_schedule_on AND h.id = p_id
  AND h.dequeued_on >= (date_trunc('day', p_finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
  AND h.dequeued_on < (date_trunc('day', p_finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') + interval '24 hours'
OFFSET 0  -- kept a subquery of its own: its caller's row gives the values, each probe uses all three
$$;

-- Days that may be dropped, for partitions that hold every queue's history of their day (whole-day
-- partitions, not divided by queue): those before the start of (today − the longest
-- retention_days of any queue; 30 when there is none), so that such a day goes when the queue that
-- keeps history longest lets it go. When any queue asks for archive_before_prune, only days the
-- archive has written (before archived_through) go.
CREATE OR REPLACE FUNCTION tickler_history_keep_from(p_now timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT least(
        date_trunc('day', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
            - make_interval(days => coalesce((SELECT max(retention_days) FROM tickler_queue), 30)),
        CASE WHEN EXISTS (SELECT 1 FROM tickler_queue WHERE archive_before_prune)
             THEN coalesce((SELECT archived_through FROM tickler_archive_progress), '-infinity') END)
$$;

-- The start of the first day that must be kept, for the history of these queues: the day
-- (today − the longest retention_days of those queues); with archive_before_prune on any of
-- them, no later than what the archive has written. Queues since deleted have no say (their
-- events went with them; their timeline entries follow the queues they share a part with),
-- unless none of them is left: then p_class (the class the part was made for), else the longest
-- retention of any queue.
CREATE OR REPLACE FUNCTION tickler_history_keep_from(p_now timestamptz, p_queues text[], p_class integer)
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
-- `_rest`. Their rows move from `_rest` into the part, which is then attached. The lock on `_rest`
-- is taken first: a writer routing a row there either committed before (its row is moved) or
-- waits for the attach; a row committed between the move and the attach would make the attach
-- fail. Returns the parts made.
CREATE OR REPLACE FUNCTION tickler_add_history_parts(p_day_table text, p_every_queue boolean) RETURNS text[]
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

-- The table of one day (UTC) of p_parent (tickler_event_history or tickler_timeline), divided by
-- queue: its DEFAULT part `_rest` and a part per retention class (tickler_add_history_parts),
-- filled with the rows of that day that the parent's default partition took meanwhile, then
-- attached. The default partition is locked first, for the reason given at
-- tickler_add_history_parts. Returns the tables made (none when the day exists).
CREATE OR REPLACE FUNCTION tickler_add_history_day(p_parent text, p_day date) RETURNS text[]
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

-- The history's maintenance pass, every few minutes from the dispatcher (any number of
-- processes may call it; one at a time works, the others return at once): rows in the default
-- partitions given their day, the days of today and p_days_ahead days ahead made with their
-- parts, the parts days lack added, and the parts and days past their queues' retention dropped.
-- A drop subtracts its events from the queue counters (tickler_history_count) without reading
-- its rows. Nothing is dropped while an archive run is unfinished (its selected events must stay
-- until it deletes them): the SHARE lock on tickler_archive_run makes a run being created wait
-- for this pass, and this pass wait for it. Returns the tables it made and dropped.
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

    -- 1. The parts of a day whose queues all allow it, and the whole-day partitions (days not
    --    divided by queue, as an upgraded database has) that every queue allows.
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
CREATE OR REPLACE FUNCTION tickler_forget_history_counts(p_from timestamptz, p_to timestamptz, p_queues text[]) RETURNS void
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

CREATE OR REPLACE TRIGGER tickler_timeline_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tickler_timeline
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_timeline_append_only();

-- Any event, open or finished: what readers of "any event" read. An event is in exactly one of
-- the two tables (the move into history is one statement).
CREATE OR REPLACE VIEW tickler_event_all AS
SELECT * FROM tickler_event
UNION ALL
SELECT * FROM tickler_event_history;

-- Every timeline row: those of tickler_timeline, and the `delivered` row of each history row that
-- is its own entry. An ack writes no timeline row for a delivery: it gives the history row
-- `entry_id`, an id from the timeline's own sequence (so the entry keeps its place among the
-- key's entries), and this view builds the row from the history row's values (tickler_with_claim).
-- Read it wherever the timeline's rows are read (never written: tickler_timeline_write writes the
-- table).
CREATE OR REPLACE VIEW tickler_timeline_all AS
SELECT t.id, t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details
FROM tickler_timeline AS t
UNION ALL
SELECT h.entry_id, h.queue, h.item_key, h.id, h.dequeued_on, 'delivered', h.dequeued_by, h.schedule_on,
       tickler_with_claim(jsonb_build_object('lease_id', h.lease_id, 'attempt', h.redeliver_count + 1),
                          h.dequeued_on, h.dequeued_by, h.schedule_on, h.claimed_on, h.claimed_by,
                          h.claimed_expires_on, h.lease_id, h.redeliver_count + 1, h.group_key, h.schedule_on)
FROM tickler_event_history AS h
WHERE h.entry_id IS NOT NULL;

-- Every timeline entry as users read it, over tickler_timeline_all, ordered by (id, step): a row
-- that carries the claim it ended gives that `claimed` entry first (step 1), then itself without
-- it (step 2); an event under a lease gives its `claimed` entry from the event row (step 3, no id:
-- nothing follows it until the lease ends).
CREATE OR REPLACE VIEW tickler_timeline_entry AS
SELECT t.id, 1 AS step, t.queue, t.item_key, t.event_id, c.at, 'claimed' AS action,
       coalesce(t.details -> 'claim' ->> 'by', t.actor) AS actor,
       coalesce(CAST(t.details -> 'claim' ->> 'schedule_on' AS timestamptz), t.schedule_on) AS schedule_on,
       tickler_claim_details(
           CAST(coalesce(t.details -> 'claim' ->> 'lease_id', t.details ->> 'lease_id') AS uuid),
           CAST(coalesce(t.details -> 'claim' ->> 'attempt', t.details ->> 'attempt') AS integer),
           c.at + make_interval(secs => CAST(t.details -> 'claim' ->> 'lease_seconds' AS double precision)),
           t.details -> 'claim' ->> 'group_key') AS details
FROM tickler_timeline_all AS t
CROSS JOIN LATERAL (
    SELECT t.at - make_interval(secs => CAST(t.details -> 'claim' ->> 'ago' AS double precision)) AS at
) AS c
WHERE t.details ? 'claim'
UNION ALL
SELECT t.id, 2, t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details - 'claim'
FROM tickler_timeline_all AS t
UNION ALL
SELECT NULL, 3, e.queue, e.item_key, e.id, e.claimed_on, 'claimed', e.claimed_by, e.schedule_on,
       tickler_claim_details(e.lease_id, e.redeliver_count + 1, e.claimed_expires_on, e.group_key)
FROM tickler_event AS e
WHERE e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.claimed_expires_on IS NOT NULL;
