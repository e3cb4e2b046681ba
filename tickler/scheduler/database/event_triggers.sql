-- The statement triggers of tickler_event, one per operation: each looks at its transition tables
-- once, then keeps the counters (tickler_queue_count, and tickler_due_count: the open events by the
-- minute they fall due, which forecasts read), the lease table (tickler_lease) and the move
-- of finished rows into tickler_event_history, in that order, doing only what the statement needs.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- INSERT: the counters, the lease rows of leased open rows, the move of finished rows.
CREATE OR REPLACE FUNCTION tickler_event_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_leased    boolean;
    v_finished  boolean;
BEGIN
    INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
    SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, count(*)
    FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    PERFORM tickler_count_due(array_agg(queue), array_agg(minute), array_agg(n))
    FROM (SELECT queue, tickler_due_minute(schedule_on) AS minute, count(*) AS n
          FROM new_rows WHERE outcome IS NULL GROUP BY 1, 2) AS due;
    -- schedules and revivals write open, unleased rows: nothing more to do
    SELECT bool_or(lease_id IS NOT NULL AND dequeued_on IS NULL), bool_or(dequeued_on IS NOT NULL)
    INTO v_leased, v_finished
    FROM new_rows;
    IF v_leased THEN
        INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
        SELECT n.lease_id, n.id, n.queue, n.group_key, n.fairness_key, n.lease_expires_on
        FROM new_rows AS n WHERE n.lease_id IS NOT NULL AND n.dequeued_on IS NULL;
    END IF;
    IF v_finished THEN
        WITH moved AS (
            DELETE FROM tickler_event AS e
            WHERE e.id = ANY(ARRAY(SELECT n.id FROM new_rows AS n WHERE n.dequeued_on IS NOT NULL))
              AND e.dequeued_on IS NOT NULL
            RETURNING e.*
        )
        INSERT INTO tickler_event_history SELECT * FROM moved;
    END IF;
    RETURN NULL;
END
$$;

-- UPDATE: the counters, the lease rows, the move of finished rows.
-- The lease table is kept from every change of the event row (claim, ack, nack, extension,
-- release, reaper), so no statement can leave the two disagreeing. A statement that finishes
-- events (sets dequeued_on) has them moved into history in the same statement: every finishing
-- statement keeps its guard and its RETURNING, none can forget the move, and a concurrent
-- statement waiting on such a row finds it deleted and skips it.
-- A row's count changes only with its queue or its outcome (its state, coalesce(outcome,
-- 'open')): when no row had or has an outcome and every row, before and after, is of one and the
-- same queue (a claim, an extension, a release, a change, a retry that stays open), the counters
-- cannot change and their query is not run. The leases: with no lease before there is no lease
-- row to end or change, and every leased open row is a new lease (a claim inserts its lease rows
-- without joining the old rows to the new); with none after, none to insert or change.
CREATE OR REPLACE FUNCTION tickler_event_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_new_outcome   boolean;
    v_new_leased    boolean;
    v_finished      boolean;
    v_new_first     text;
    v_new_last      text;
    v_old_outcome   boolean;
    v_old_leased    boolean;
    v_old_first     text;
    v_old_last      text;
    v_rows          bigint;
    -- the three lease statements of the branch below, as text for EXECUTE (planned for each statement)
    c_ended CONSTANT text := $q$
        DELETE FROM tickler_lease AS l
        USING old_rows AS o JOIN new_rows AS n ON n.id = o.id
        WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id
          AND (n.lease_id IS DISTINCT FROM o.lease_id OR n.dequeued_on IS NOT NULL)$q$;
    c_going_on CONSTANT text := $q$
        UPDATE tickler_lease AS l
        SET expires_on = n.lease_expires_on, queue = n.queue, group_key = n.group_key, fairness_key = n.fairness_key
        FROM old_rows AS o JOIN new_rows AS n ON n.id = o.id
        WHERE n.lease_id = o.lease_id AND n.dequeued_on IS NULL AND l.lease_id = n.lease_id AND l.event_id = n.id
          AND (n.lease_expires_on, n.queue, n.group_key, n.fairness_key)
              IS DISTINCT FROM (o.lease_expires_on, o.queue, o.group_key, o.fairness_key)$q$;
    c_new CONSTANT text := $q$
        INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
        SELECT n.lease_id, n.id, n.queue, n.group_key, n.fairness_key, n.lease_expires_on
        FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE n.lease_id IS NOT NULL AND n.dequeued_on IS NULL AND n.lease_id IS DISTINCT FROM o.lease_id$q$;
BEGIN
    -- one statement, one pass over each transition table
    SELECT n.outcome, n.leased, n.finished, n.first, n.last, n.rows, o.outcome, o.leased, o.first, o.last
    INTO v_new_outcome, v_new_leased, v_finished, v_new_first, v_new_last, v_rows,
         v_old_outcome, v_old_leased, v_old_first, v_old_last
    FROM (SELECT bool_or(outcome IS NOT NULL) AS outcome, bool_or(lease_id IS NOT NULL) AS leased,
                 bool_or(dequeued_on IS NOT NULL) AS finished, min(queue) AS first, max(queue) AS last,
                 count(*) AS rows
          FROM new_rows) AS n,
         (SELECT bool_or(outcome IS NOT NULL) AS outcome, bool_or(lease_id IS NOT NULL) AS leased,
                 min(queue) AS first, max(queue) AS last
          FROM old_rows) AS o;
    IF v_new_first IS NULL THEN  -- no row changed
        RETURN NULL;
    END IF;

    IF v_new_outcome OR v_old_outcome
       OR v_new_first <> v_new_last OR v_old_first <> v_old_last OR v_new_first <> v_old_first THEN
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, state, pg_backend_pid() % 64, sum(delta)
        FROM (
            SELECT queue, coalesce(outcome, 'open') AS state, 1 AS delta FROM new_rows
            UNION ALL
            SELECT queue, coalesce(outcome, 'open'), -1 FROM old_rows
        ) AS changes
        GROUP BY 1, 2 HAVING sum(delta) <> 0 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    -- The open events that moved between minutes (a reschedule, a retry's backoff), queues or out
    -- of the open set: a claim or an extension moves none, and nothing is written then.
    PERFORM tickler_count_due(array_agg(queue), array_agg(minute), array_agg(n))
    FROM (
        SELECT queue, minute, sum(delta) AS n
        FROM (
            SELECT queue, tickler_due_minute(schedule_on) AS minute, 1 AS delta FROM new_rows WHERE outcome IS NULL
            UNION ALL
            SELECT queue, tickler_due_minute(schedule_on), -1 FROM old_rows WHERE outcome IS NULL
        ) AS changes
        GROUP BY 1, 2 HAVING sum(delta) <> 0
    ) AS due;

    IF v_old_leased AND v_rows > 8 THEN
        -- Rows that had a lease, in a statement of more than a few rows (the reaper, a release or
        -- a re-claim of many): the three statements below, planned for this statement. A cached
        -- plan keeps the join of old_rows and new_rows it was made for; made for one row (a
        -- nested loop), it would rescan one transition table for each row of the other.
        EXECUTE c_ended;
        IF v_new_leased THEN
            EXECUTE c_going_on;
            EXECUTE c_new;
        END IF;
    ELSIF v_old_leased THEN
        -- leases that ended, were replaced, or whose event finished
        DELETE FROM tickler_lease AS l
        USING old_rows AS o JOIN new_rows AS n ON n.id = o.id
        WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id
          AND (n.lease_id IS DISTINCT FROM o.lease_id OR n.dequeued_on IS NOT NULL);
        IF v_new_leased THEN
            -- leases that go on with a new expiry (extend) or a changed group or key
            UPDATE tickler_lease AS l
            SET expires_on = n.lease_expires_on, queue = n.queue, group_key = n.group_key,
                fairness_key = n.fairness_key
            FROM old_rows AS o JOIN new_rows AS n ON n.id = o.id
            WHERE n.lease_id = o.lease_id AND n.dequeued_on IS NULL AND l.lease_id = n.lease_id
              AND l.event_id = n.id
              AND (n.lease_expires_on, n.queue, n.group_key, n.fairness_key)
                  IS DISTINCT FROM (o.lease_expires_on, o.queue, o.group_key, o.fairness_key);
            -- new leases (a re-claim)
            INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
            SELECT n.lease_id, n.id, n.queue, n.group_key, n.fairness_key, n.lease_expires_on
            FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
            WHERE n.lease_id IS NOT NULL AND n.dequeued_on IS NULL AND n.lease_id IS DISTINCT FROM o.lease_id;
        END IF;
    ELSIF v_new_leased THEN
        -- No row had a lease (a claim): every leased open row is a new lease, no join needed.
        INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
        SELECT n.lease_id, n.id, n.queue, n.group_key, n.fairness_key, n.lease_expires_on
        FROM new_rows AS n
        WHERE n.lease_id IS NOT NULL AND n.dequeued_on IS NULL;
    END IF;

    IF v_finished THEN
        WITH moved AS (
            DELETE FROM tickler_event AS e
            WHERE e.id = ANY(ARRAY(SELECT n.id FROM new_rows AS n WHERE n.dequeued_on IS NOT NULL))
              AND e.dequeued_on IS NOT NULL
            RETURNING e.*
        )
        INSERT INTO tickler_event_history SELECT * FROM moved;
    END IF;
    RETURN NULL;
END
$$;

-- DELETE (an ack moving its rows into history, a queue's deletion): the counters, and the lease
-- rows of the deleted events, by a statement planned once per session rather than at every ack
-- (planned for each statement, the DELETE would take most of an ack's time). The pairs (lease
-- id, event id) of the deleted rows come to the lease table as two arrays, aggregated in one pass
-- and unnested side by side: the planner sees a set of rows of its own (ten, by its default), not
-- the transition table, so the plan does not depend on how many rows a statement deleted and
-- PL/pgSQL keeps it: a probe of the lease table's primary key per pair (the same plan for 1, 10
-- and 2,000 rows, linear in them). Above 64 leased rows (the reaper, a queue's deletion) the join
-- is planned for the statement by EXECUTE: were the lease table nearly empty when the session
-- planned the statement (a scan of it then looks cheaper than its index), its rows would be read
-- once per pair, and 64 bounds that.
CREATE OR REPLACE FUNCTION tickler_event_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_leased  bigint;
BEGIN
    INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
    SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, -count(*)
    FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    PERFORM tickler_count_due(array_agg(queue), array_agg(minute), array_agg(n))
    FROM (SELECT queue, tickler_due_minute(schedule_on) AS minute, -count(*) AS n
          FROM old_rows WHERE outcome IS NULL GROUP BY 1, 2) AS due;
    SELECT count(*) INTO v_leased FROM old_rows WHERE lease_id IS NOT NULL;
    IF v_leased > 64 THEN
        EXECUTE 'DELETE FROM tickler_lease AS l USING old_rows AS o
                 WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id';
    ELSIF v_leased > 0 THEN
        DELETE FROM tickler_lease AS l
        USING (SELECT array_agg(o.lease_id) AS lease_ids, array_agg(o.id) AS event_ids
               FROM old_rows AS o WHERE o.lease_id IS NOT NULL) AS a,
              unnest(a.lease_ids, a.event_ids) AS p (lease_id, event_id)
        WHERE l.lease_id = p.lease_id AND l.event_id = p.event_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tickler_event_deleted AFTER DELETE ON tickler_event
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_event_deleted();

CREATE OR REPLACE TRIGGER tickler_event_inserted AFTER INSERT ON tickler_event
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_event_inserted();

CREATE OR REPLACE TRIGGER tickler_event_updated AFTER UPDATE ON tickler_event
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_event_updated();
