-- Issue #21 (drain rows): whether a queue has group work, answered by the claim that is running
-- anyway instead of by a statement of its own.
--
-- A dispatcher serves groups and ungrouped events in turns (groups first every other round, so
-- neither starves the other). Before each group claim it asked has_due_groups, an autocommit
-- statement of its own: on a queue without groups, the common case, one round trip and one
-- statement for every other claim — at batch 1, a third of the statements of a drain (claim, ack,
-- and half a probe per event). The ungrouped claims (claim_events, claim_events_round_robin) now
-- return this function's answer with their rows, and the dispatcher keeps the latest per queue:
-- a group claim runs when the claim before it saw group work (scheduler/store/leases.py).
--
-- PL/pgSQL, so that its two probes are planned once per session (a LANGUAGE sql function with
-- sub-selects is not inlined and would be planned at every call of the statement that calls it).
-- CREATE OR REPLACE: tests give it to databases of earlier releases before migrating them.
CREATE OR REPLACE FUNCTION tickler_groups_due(p_queue text, p_now timestamptz, p_flow boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- due, unleased grouped events, or grouped events whose lease expired (a group claim takes
    -- both); `p_flow` false: the fast path's question, which a paused or limited queue answers
    -- "no" (such queues are claimed only under their flow lock, see flow_room).
    RETURN (EXISTS (
        SELECT 1 FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
          AND e.schedule_on <= coalesce(p_now, now())
    ) OR EXISTS (
        SELECT 1 FROM tickler_lease AS l
        WHERE l.queue = p_queue AND l.group_key IS NOT NULL AND l.expires_on <= coalesce(p_now, now())
    )) AND (p_flow OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                              AND q.max_in_flight_per_key IS NULL
                       FROM tickler_queue AS q WHERE q.name = p_queue));
END
$$;

COMMENT ON FUNCTION tickler_groups_due(text, timestamptz, boolean) IS
    'Whether a group claim of this queue would find work now (p_flow false: and the queue is claimed on the fast path).';
