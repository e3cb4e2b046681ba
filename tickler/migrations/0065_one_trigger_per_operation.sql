-- One statement trigger per operation on tickler_event (issues #21 and #24: the database's CPU per
-- event). Until now each INSERT, UPDATE and DELETE of the events ran two or three statement
-- triggers, each a PL/pgSQL call of its own that looked at the transition tables again:
--
--   INSERT  tickler_count_inserted (tickler_count_events, 0021), tickler_keep_leases_inserted
--           (0064), tickler_move_finished_inserted (tickler_move_finished, 0021);
--   UPDATE  tickler_count_updated, tickler_keep_leases_updated (tickler_keep_leases, 0060),
--           tickler_move_finished_updated;
--   DELETE  tickler_count_deleted, tickler_keep_leases_deleted.
--
-- Each operation now has one function that does the same work in the same order (PostgreSQL fired
-- the triggers of one event by name: the counters, then the leases, then the move; the move's own
-- DELETE of tickler_event and INSERT into the history fire the DELETE trigger below and the
-- history's counters, as they did), with one pass over each transition table first to learn what
-- there is to do: a schedule (INSERT of open, unleased rows) upserts its counter row and nothing
-- else; a claim (UPDATE of open rows of one queue that gain a lease) inserts its lease rows and
-- nothing else; a finish moves its rows. The bodies are those of the functions named above, copied
-- from their latest versions, with the changes said at each function below.
--
-- Not merged: tickler_event_group_fairness (0045, body 0060) stays a BEFORE ROW trigger. Its WHEN
-- keeps it from running for ungrouped events at all, and its semantics are a row's: it refuses a
-- row before it is written, seeing the rows the same statement wrote before it (also for an
-- INSERT ... ON CONFLICT DO NOTHING whose row is then not inserted, and for an UPDATE OF its
-- columns that leaves them as they were); a check after the statement would answer otherwise.
-- tickler_keep_leases_truncated (the one TRUNCATE trigger) stays as it is.
--
-- tickler_count_events() stays: the history's counters (tickler_count_history_inserted /
-- _deleted) call it.

-- Dropping a trigger takes the table's ACCESS EXCLUSIVE lock: taken first (no upgrade halfway); the
-- statements of every writer wait the few milliseconds of this migration.
LOCK TABLE tickler_event IN ACCESS EXCLUSIVE MODE;

-- INSERT: the counters (0021's INSERT branch), the lease rows of leased open rows (0064's
-- tickler_keep_leases_inserted), the move of finished rows (0021's tickler_move_finished).
CREATE FUNCTION tickler_event_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_leased    boolean;
    v_finished  boolean;
BEGIN
    INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
    SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, count(*)
    FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
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

-- UPDATE: the counters (0021's UPDATE branch), the lease rows (0060's tickler_keep_leases), the
-- move of finished rows (0021). A row's count changes only with its queue or its outcome (its
-- state, coalesce(outcome, 'open')): when no row had or has an outcome and every row, before and
-- after, is of one and the same queue (a claim, an extension, a release, a change, a retry that
-- stays open), the counters cannot change and their query is not run. The leases: with no lease
-- before there is no lease row to end or change, and every leased open row is a new lease (a
-- claim inserts its lease rows without joining the old rows to the new); with none after, none to
-- insert or change.
CREATE FUNCTION tickler_event_updated() RETURNS trigger LANGUAGE plpgsql AS $$
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
    -- 0060's three lease statements, the same as below (the text EXECUTE plans for each statement)
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

-- DELETE: the counters (0021's DELETE branch) and the lease rows of the deleted events (0060).
-- The lease rows of more than a few events (an ack of a batch) are deleted by a statement planned
-- for them: a cached plan made for one row may probe the lease table with a scan of it per row.
CREATE FUNCTION tickler_event_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_leased  bigint;
BEGIN
    INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
    SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, -count(*)
    FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    SELECT count(*) INTO v_leased FROM old_rows WHERE lease_id IS NOT NULL;
    IF v_leased > 8 THEN
        EXECUTE 'DELETE FROM tickler_lease AS l USING old_rows AS o
                 WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id';
    ELSIF v_leased > 0 THEN
        DELETE FROM tickler_lease AS l USING old_rows AS o
        WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER tickler_count_inserted ON tickler_event;
DROP TRIGGER tickler_keep_leases_inserted ON tickler_event;
DROP TRIGGER tickler_move_finished_inserted ON tickler_event;
DROP TRIGGER tickler_count_updated ON tickler_event;
DROP TRIGGER tickler_keep_leases_updated ON tickler_event;
DROP TRIGGER tickler_move_finished_updated ON tickler_event;
DROP TRIGGER tickler_count_deleted ON tickler_event;
DROP TRIGGER tickler_keep_leases_deleted ON tickler_event;
DROP FUNCTION tickler_keep_leases_inserted();
DROP FUNCTION tickler_keep_leases();
DROP FUNCTION tickler_move_finished();

CREATE TRIGGER tickler_event_inserted AFTER INSERT ON tickler_event
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_event_inserted();
CREATE TRIGGER tickler_event_updated AFTER UPDATE ON tickler_event
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_event_updated();
CREATE TRIGGER tickler_event_deleted AFTER DELETE ON tickler_event
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_event_deleted();
