-- The ack of the release before migration 0072 (scheduler/queries.sql's ack_leases then), frozen
-- for tests/test_upgrade.py: the upgrades to 0063 and 0065 write the state they upgrade with this
-- release's store on their older databases, which have no history entry_id (0072) for this
-- release's ack.

-- name: ack_leases
-- Finish every event of these live leases as delivered; returns the leases that were finished.
-- A lease that expired, was re-claimed or was already finished matches nothing (fencing).
-- The busiest finish moves its rows itself: deleted from the open events and inserted, finished,
-- into the history (no intermediate version of the row is written; see tickler_event_updated, 0065).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
finished AS (
    DELETE FROM tickler_event AS e
    USING clock
    -- the leases' events by the lease table's primary key (migration 0060), checked on the row.
    -- `outcome IS NULL` is "open" (check finished_has_outcome): said with dequeued_on, it would
    -- let the planner prefer a partial index of open events, scanned whole for these ids.
    WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l WHERE l.lease_id = ANY(CAST(:lease_ids AS uuid[]))))
      AND e.lease_id = ANY(CAST(:lease_ids AS uuid[])) AND e.outcome IS NULL
      AND e.lease_expires_on > clock.now
      -- a caller limited to some queues cannot finish another tenant's lease (NULL: any queue)
      AND (CAST(:queues AS text[]) IS NULL OR e.queue = ANY(CAST(:queues AS text[])))
    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.data, e.enqueued_on, e.enqueued_by,
              clock.now AS dequeued_on, e.claimed_by AS dequeued_by, 'delivered' AS outcome, e.claimed_on,
              e.claimed_by, e.lease_id, e.lease_expires_on, e.redeliver_count, e.max_attempts, e.last_error,
              e.version + 1 AS version, e.claimed_expires_on,
              e.traceparent, e.tracestate, e.priority, e.fairness_key
),
moved AS (
    INSERT INTO tickler_event_history (
        id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
        outcome, claimed_on, claimed_by, lease_id, lease_expires_on, redeliver_count, max_attempts, last_error,
        version, claimed_expires_on,
        traceparent, tracestate, priority, fairness_key)
    SELECT id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
           outcome, claimed_on, claimed_by, lease_id, lease_expires_on, redeliver_count, max_attempts, last_error,
           version, claimed_expires_on,
           traceparent, tracestate, priority, fairness_key
    FROM finished
),
logged AS (
    SELECT tickler_timeline_write(array_agg(ROW(
               queue, item_key, id, dequeued_on, 'delivered', dequeued_by, schedule_on,
               -- :trace_ids (SPEC §11): {lease_id: the trace id of the attempt}, or NULL (tracing off)
               tickler_with_claim(jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1)
                                  || jsonb_strip_nulls(jsonb_build_object(
                                         'trace_id', CAST(:trace_ids AS jsonb) ->> CAST(lease_id AS text))),
                                  dequeued_on, dequeued_by, schedule_on, claimed_on, claimed_by, claimed_expires_on,
                                  lease_id, redeliver_count + 1, group_key, schedule_on)
           )::tickler_timeline_row)) AS written
    FROM finished
),
wake AS (
    -- a group's lease ended: its other due events (scheduled meanwhile) are claimable now
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM finished WHERE group_key IS NOT NULL) AS q
)
SELECT f.lease_id, f.queue, count(*) AS events
FROM finished AS f CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged AS l
GROUP BY f.lease_id, f.queue;

