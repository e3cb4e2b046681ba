-- Issue #21 (drain rows): the lease rows of finished events deleted by a statement planned once per
-- session, not at every ack.
--
-- tickler_event_deleted (0065) deleted the lease rows of more than 8 deleted events by EXECUTE, so
-- that a plan cached for one row could not probe the lease table with a scan of it per row. An ack
-- of a batch of 10 therefore parsed and planned its lease DELETE at every call: ~95 µs of planning
-- of the ~150 µs the statement took (pg_stat_statements, a drain at batch 10), on every ack.
--
-- The pairs (lease id, event id) of the deleted rows now come to the lease table as two arrays,
-- aggregated in one pass and unnested side by side: the planner sees a set of rows of its own (ten, by its default), not the
-- transition table, so the plan does not depend on how many rows a statement deleted and PL/pgSQL
-- keeps it for the session: a probe of the lease table's primary key per pair (checked with
-- auto_explain: the same plan for 1, 10 and 2,000 rows, linear in them). Above 64 leased rows (the
-- reaper, a queue's deletion) the join is still planned for the statement, as before: were the
-- lease table nearly empty when the session planned the statement (a scan of it then looks cheaper
-- than its index), its rows would be read once per pair, and 64 bounds that.
CREATE OR REPLACE FUNCTION tickler_event_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_leased  bigint;
BEGIN
    INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
    SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, -count(*)
    FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
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
