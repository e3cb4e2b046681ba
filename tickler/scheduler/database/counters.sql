-- Counting: an event's status as users see it, a queue's time-dependent counts, the trigger-kept
-- counters (tickler_queue_count, tickler_history_count) and the dashboard's per-minute rollup
-- (tickler_minute_stat), with the triggers on history and the timeline that keep them.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- The status users see, derived the same way everywhere: an outcome, a live lease, or pending.
CREATE OR REPLACE FUNCTION tickler_status(outcome text, lease_expires_on timestamptz, at timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN outcome IS NOT NULL THEN outcome
        WHEN lease_expires_on > at THEN 'in_flight'
        ELSE 'pending'
    END
$$;

-- The time-dependent counts of a queue at p_at, for the queue endpoint, the /metrics gauges and
-- the dashboard:
--   in_flight   events under a live lease, counted in tickler_lease (the events in flight only);
--   due         open events whose time has come and that are not under a live lease: every open
--               due event (one range of tickler_event_open_schedule) less the due ones under a
--               live lease, so that a large due backlog is an index range, not a heap read per row;
--   oldest_due  the schedule_on of the first of those.
-- A SQL function of one SELECT, neither STRICT nor VOLATILE: the planner inlines it, so p_at is
-- the caller's expression in each condition. Callers pass the clock as an expression
-- (coalesce(:now, now())), never a CTE's column: the planner then estimates each range from its
-- value (a CTE's column is an unknown priced at a third of the table, which makes the due count a
-- scan of every future event).
CREATE OR REPLACE FUNCTION tickler_live_counts(p_queue text, p_at timestamptz)
RETURNS TABLE (in_flight bigint, due bigint, oldest_due timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT live.in_flight, live.open_due - live.in_flight_due, oldest.schedule_on
    FROM (
        SELECT
            (SELECT count(*) FROM tickler_lease AS l
             WHERE l.queue = p_queue AND l.expires_on > p_at) AS in_flight,
            -- their rows by primary key (= ANY(ARRAY(...)), never a join the planner could make
            -- a hash join over a scan of the events)
            (SELECT count(*) FROM tickler_event AS e
             WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l
                                    WHERE l.queue = p_queue AND l.expires_on > p_at))
               AND e.schedule_on <= p_at) AS in_flight_due,
            (SELECT count(*) FROM tickler_event AS e
             WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.schedule_on <= p_at) AS open_due
    ) AS live
    LEFT JOIN LATERAL (
        SELECT e.schedule_on FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.schedule_on <= p_at
          AND NOT coalesce(e.lease_expires_on > p_at, false)
        ORDER BY e.schedule_on, e.id
        LIMIT 1
    ) AS oldest ON true
$$;

-- The counters, kept per statement from its transition table so that no reader counts rows:
-- tickler_queue_count by queue and state, and for history also tickler_history_count by day
-- (UTC), queue and outcome, which is what dropping a day of history subtracts without reading
-- the day's rows. Each backend writes its own slot (pg_backend_pid() % n), so concurrent writers
-- do not queue up behind one counter row; readers add the slots up.
-- Inserted history rows that are their own `delivered` timeline entry (entry_id set: an ack
-- writes no timeline row for them) are also added to the dashboard's per-minute rollup here, with
-- the statement tickler_count_minutes runs for timeline rows.
-- Only the triggers on tickler_event_history below call this function: the event triggers of
-- event_triggers.sql count tickler_event's rows themselves.
CREATE OR REPLACE FUNCTION tickler_count_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tickler_history_count AS c (day, queue, outcome, slot, n)
        SELECT (dequeued_on AT TIME ZONE 'UTC')::date, queue, outcome, pg_backend_pid() % 16, count(*)
        FROM new_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (day, queue, outcome, slot) DO UPDATE SET n = c.n + excluded.n;
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, outcome, pg_backend_pid() % 64, count(*)
        FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
        IF EXISTS (SELECT 1 FROM new_rows WHERE entry_id IS NOT NULL) THEN
            INSERT INTO tickler_minute_stat AS s (queue, ring, slot, minute, delivered, failed)
            SELECT DISTINCT ON (queue, ring) queue, ring, pg_backend_pid() % 16, minute, delivered, 0
            FROM (
                SELECT queue, date_trunc('minute', dequeued_on) AS minute,
                       (floor(extract(epoch FROM date_trunc('minute', dequeued_on)) / 60)::bigint % 120)::smallint
                           AS ring,
                       count(*) AS delivered
                FROM new_rows
                WHERE entry_id IS NOT NULL
                GROUP BY 1, 2
            ) AS m
            ORDER BY queue, ring, minute DESC
            ON CONFLICT (queue, ring, slot) DO UPDATE SET
                delivered = CASE WHEN s.minute = excluded.minute THEN s.delivered + excluded.delivered
                                 ELSE excluded.delivered END,
                failed = CASE WHEN s.minute = excluded.minute THEN s.failed ELSE 0 END,
                minute = excluded.minute
            WHERE s.minute <= excluded.minute;  -- an older minute never overwrites a newer one
        END IF;
    ELSE
        INSERT INTO tickler_history_count AS c (day, queue, outcome, slot, n)
        SELECT (dequeued_on AT TIME ZONE 'UTC')::date, queue, outcome, pg_backend_pid() % 16, -count(*)
        FROM old_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (day, queue, outcome, slot) DO UPDATE SET n = c.n + excluded.n;
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, outcome, pg_backend_pid() % 64, -count(*)
        FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

-- The dashboard's per-minute rollup, kept from each statement that writes timeline rows: per
-- queue and minute, the deliveries and the failed attempts (`failed`, `lease_expired`, and a
-- `dead` that ended a lease). The timeline has no index on time and an hour of a busy queue is
-- millions of rows, so the figures are kept as they happen. A ring of 120 minutes per queue:
-- minute m lands in position m mod 120 and a newer minute overwrites what the position held, so
-- the table stays under 120 x 16 rows per queue (each backend writes its own slot) and needs no
-- pruning. A statement with no entry it counts (an enqueue, a replace, a change: most of the
-- timeline's statements) returns after one look at its rows instead of running the upsert.
CREATE OR REPLACE FUNCTION tickler_count_minutes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE action IN ('delivered', 'failed', 'lease_expired', 'dead')) THEN
        RETURN NULL;
    END IF;
    INSERT INTO tickler_minute_stat AS s (queue, ring, slot, minute, delivered, failed)
    -- Only the newest minute of each ring position: a statement spanning more than two hours
    -- (a bulk import of history) must not update one row twice.
    SELECT DISTINCT ON (queue, ring) queue, ring, pg_backend_pid() % 16, minute, delivered, failed
    FROM (
        SELECT queue, date_trunc('minute', at) AS minute,
               (floor(extract(epoch FROM date_trunc('minute', at)) / 60)::bigint % 120)::smallint AS ring,
               count(*) FILTER (WHERE action = 'delivered') AS delivered,
               count(*) FILTER (WHERE action <> 'delivered') AS failed
        FROM new_rows
        WHERE action IN ('delivered', 'failed', 'lease_expired')
           OR (action = 'dead' AND details ? 'lease_id')
        GROUP BY 1, 2
    ) AS m
    ORDER BY queue, ring, minute DESC
    ON CONFLICT (queue, ring, slot) DO UPDATE SET
        delivered = CASE WHEN s.minute = excluded.minute THEN s.delivered + excluded.delivered
                         ELSE excluded.delivered END,
        failed = CASE WHEN s.minute = excluded.minute THEN s.failed + excluded.failed
                      ELSE excluded.failed END,
        minute = excluded.minute
    WHERE s.minute <= excluded.minute;  -- an older minute never overwrites a newer one
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tickler_count_history_deleted AFTER DELETE ON tickler_event_history
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();

CREATE OR REPLACE TRIGGER tickler_count_history_inserted AFTER INSERT ON tickler_event_history
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();

CREATE OR REPLACE TRIGGER tickler_count_minutes AFTER INSERT ON tickler_timeline
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_minutes();
