-- A claim that does not write the event row (issue #21): the PROTOTYPE measured in bench/analysis.md,
-- "A claim that writes only the lease (2026-11-24)". NOT a migration and not applied anywhere: it
-- changes the claim and the ack only (what bench.walprofile runs), so every other reader of the
-- lease columns (status, event JSON, version, search, the dashboard, the counts, flow room, the
-- fair pick, group leases, nack/extend/release, the reaper, the timeline) would still read the
-- event row's columns, which this claim leaves NULL. An expired lease is not re-claimed here.
--
-- To measure it: copy the first part to migrations/0062_*.sql, put the two queries in place of
-- their namesakes in scheduler/queries.sql, run `python -m bench.walprofile --server private`,
-- and undo both.
--
-- Variants measured (bench/analysis.md has the bytes):
--   A  as written: the rows locked FOR UPDATE SKIP LOCKED, INSERT ... ON CONFLICT (event_id) DO
--      NOTHING (correct under concurrency: a claimer that locks a row after another one's claim
--      committed, with a snapshot from before it, conflicts instead of leasing it twice), the
--      lease table keyed by event_id with a second index on lease_id (ack, nack, extend).
--   B  A without FOR UPDATE SKIP LOCKED (ON CONFLICT alone; concurrent claimers of a queue then
--      all try the same first rows).
--   D  A with a plain INSERT (a unique violation would have to be caught and the claim retried)
--      and without the lease_id index (the ack then scans the lease table: in a real design the
--      lease id would carry its event id, so that the ack finds it on the primary key).
--   E  D without FOR UPDATE SKIP LOCKED (a floor: not usable with more than one claimer).

-- ---- migration part ---------------------------------------------------------------------------
LOCK TABLE tickler_event IN ACCESS EXCLUSIVE MODE;
ALTER TABLE tickler_lease
    ADD COLUMN claimed_on timestamptz,
    ADD COLUMN claimed_by text,
    ADD COLUMN claimed_expires_on timestamptz;
ALTER TABLE tickler_lease DROP CONSTRAINT tickler_lease_pkey;
ALTER TABLE tickler_lease ADD PRIMARY KEY (event_id);
CREATE INDEX tickler_lease_lease_id ON tickler_lease (lease_id);  -- not in D and E
ALTER TABLE tickler_event SET (fillfactor = 70);

-- ---- queries part (scheduler/queries.sql) -----------------------------------------------------
-- name: claim_events
WITH RECURSIVE clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
levels AS (
    (SELECT e.priority FROM tickler_event AS e
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.group_key IS NULL
     ORDER BY e.priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT e.priority FROM tickler_event AS e
            WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.group_key IS NULL
              AND e.priority < l.priority
            ORDER BY e.priority DESC LIMIT 1)
    FROM levels AS l WHERE l.priority IS NOT NULL
),
candidates AS (
    SELECT c.id FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT e.id FROM tickler_event AS e
        WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.group_key IS NULL
          AND e.priority = l.priority AND e.schedule_on <= (SELECT now FROM clock)
          AND NOT EXISTS (SELECT 1 FROM tickler_lease AS k WHERE k.event_id = e.id)
          AND (CAST(:flow AS boolean) OR (
              SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                     AND NOT q.fair_share AND q.max_in_flight_per_key IS NULL
              FROM tickler_queue AS q WHERE q.name = :queue))
        ORDER BY e.schedule_on, e.id
        LIMIT :limit
        FOR UPDATE OF e SKIP LOCKED  -- not in B and E
    ) AS c
    WHERE l.priority IS NOT NULL
    LIMIT :limit
),
claimed AS (
    INSERT INTO tickler_lease AS l (event_id, lease_id, queue, group_key, fairness_key, expires_on,
                                    claimed_on, claimed_by, claimed_expires_on)
    SELECT e.id, gen_random_uuid(), e.queue, e.group_key, e.fairness_key,
           clock.now + make_interval(secs => :lease_seconds), clock.now, :worker,
           clock.now + make_interval(secs => :lease_seconds)
    FROM tickler_event AS e, clock
    WHERE e.id = ANY(ARRAY(SELECT id FROM candidates))
    ON CONFLICT (event_id) DO NOTHING  -- not in D and E
    RETURNING l.*
)
SELECT e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.data, e.enqueued_on, e.enqueued_by,
       e.dequeued_on, e.dequeued_by, e.outcome, c.claimed_on, c.claimed_by, c.lease_id,
       c.expires_on AS lease_expires_on, e.redeliver_count, e.max_attempts, e.last_error,
       e.version + 1 AS version, c.claimed_expires_on, e.traceparent, e.tracestate, e.priority,
       e.fairness_key, 'in_flight' AS status, false AS lease_ended, 0 AS died
FROM (SELECT 1) AS one LEFT JOIN (claimed AS c JOIN tickler_event AS e ON e.id = c.event_id) ON true
ORDER BY e.priority DESC, e.schedule_on, e.id;

-- name: ack_leases
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
gone AS (
    DELETE FROM tickler_lease AS l USING clock
    WHERE l.lease_id = ANY(CAST(:lease_ids AS uuid[])) AND l.expires_on > clock.now
      AND (CAST(:queues AS text[]) IS NULL OR l.queue = ANY(CAST(:queues AS text[])))
    RETURNING l.*
),
finished AS (
    DELETE FROM tickler_event AS e
    USING clock, gone AS l
    WHERE e.id = ANY(ARRAY(SELECT event_id FROM gone)) AND l.event_id = e.id AND e.outcome IS NULL
    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.data, e.enqueued_on, e.enqueued_by,
              clock.now AS dequeued_on, l.claimed_by AS dequeued_by, 'delivered' AS outcome, l.claimed_on,
              l.claimed_by, l.lease_id, l.expires_on AS lease_expires_on, e.redeliver_count, e.max_attempts, e.last_error,
              e.version + 2 AS version, l.claimed_expires_on,
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
               tickler_with_claim(jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1)
                                  || jsonb_strip_nulls(jsonb_build_object(
                                         'trace_id', CAST(:trace_ids AS jsonb) ->> CAST(lease_id AS text))),
                                  dequeued_on, dequeued_by, schedule_on, claimed_on, claimed_by, claimed_expires_on,
                                  lease_id, redeliver_count + 1, group_key, schedule_on)
           )::tickler_timeline_row)) AS written
    FROM finished
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM finished WHERE group_key IS NOT NULL) AS q
)
SELECT f.lease_id, f.queue, count(*) AS events
FROM finished AS f CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged AS l
GROUP BY f.lease_id, f.queue;
