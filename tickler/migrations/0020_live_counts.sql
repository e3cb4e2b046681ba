-- The time-dependent counts of a queue, in one place: the queue endpoint (queue_live_counts),
-- the /metrics gauges (queue_gauges) and the dashboard's overview read them from here.
--   in_flight:  events under a live lease (the two lease-expiry indexes: small, leased rows only)
--   due:        open events whose time has come and that are not under a live lease — counted as
--               all open due events (tickler_event_open_schedule) less the due ones under a live
--               lease, so that a large due backlog is one index range, not a heap read per row
--   oldest_due: the schedule_on of the first of those (the first entries of the same index)
-- A SQL function of one SELECT, neither STRICT nor VOLATILE: the planner inlines it, so p_at is
-- the caller's expression in each condition. Callers pass the clock as an expression
-- (coalesce(:now, now())), never a CTE's column: the planner then estimates each range from its
-- value (a CTE's column is an unknown priced at a third of the table: at 10,000,000 future
-- events that made the due count a scan of all of them).
CREATE FUNCTION tickler_live_counts(p_queue text, p_at timestamptz)
RETURNS TABLE (in_flight bigint, due bigint, oldest_due timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT live.in_flight, live.open_due - live.in_flight_due, oldest.schedule_on
    FROM (
        SELECT
            (SELECT count(*) FROM tickler_event AS e
             WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL
               AND e.group_key IS NULL AND e.lease_expires_on > p_at)
            + (SELECT count(*) FROM tickler_event AS e
               WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL
                 AND e.group_key IS NOT NULL AND e.lease_expires_on > p_at) AS in_flight,
            (SELECT count(*) FROM tickler_event AS e
             WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL
               AND e.group_key IS NULL AND e.lease_expires_on > p_at AND e.schedule_on <= p_at)
            + (SELECT count(*) FROM tickler_event AS e
               WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL
                 AND e.group_key IS NOT NULL AND e.lease_expires_on > p_at AND e.schedule_on <= p_at)
              AS in_flight_due,
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
