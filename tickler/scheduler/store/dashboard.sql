-- Reads of the dashboard (/ui/). Every one goes through an index or a trigger-kept table:
-- nothing here counts finished events or scans the timeline by time.

-- name: no_jit
-- For the rest of this transaction: plans are executed, never compiled (see DashboardStore.overview).
SET LOCAL jit = off;

-- name: overview
-- Each queue (or those named) with its counts by state from the trigger-kept counters, and the
-- time-dependent counts and the oldest due, unleased event from tickler_live_counts
-- (scheduler/database/counters.sql, through indexes only).
SELECT q.name, q.delivery_mode, q.paused, q.max_in_flight, q.rate_per_second,
       coalesce(c.open, 0) AS open, coalesce(c.delivered, 0) AS delivered,
       coalesce(c.cancelled, 0) AS cancelled, coalesce(c.dead, 0) AS dead,
       live.in_flight, live.due, live.oldest_due,
       coalesce(CAST(:now AS timestamptz), now()) AS now
FROM tickler_queue AS q
LEFT JOIN LATERAL (
    SELECT sum(n) FILTER (WHERE state = 'open') AS open,
           sum(n) FILTER (WHERE state = 'delivered') AS delivered,
           sum(n) FILTER (WHERE state = 'cancelled') AS cancelled,
           sum(n) FILTER (WHERE state = 'dead') AS dead
    FROM tickler_queue_count WHERE queue = q.name
) AS c ON true
CROSS JOIN LATERAL tickler_live_counts(q.name, coalesce(CAST(:now AS timestamptz), now())) AS live
WHERE CAST(:names AS text[]) IS NULL OR q.name = ANY(CAST(:names AS text[]))
ORDER BY q.name;

-- name: minutes
-- Deliveries and failed attempts per minute of the last hour, from the rollup kept by the
-- triggers of the timeline and history (scheduler/database/counters.sql).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now)
SELECT s.queue, s.minute, sum(s.delivered)::bigint AS delivered, sum(s.failed)::bigint AS failed
FROM tickler_minute_stat AS s CROSS JOIN clock
WHERE (CAST(:names AS text[]) IS NULL OR s.queue = ANY(CAST(:names AS text[])))
  AND s.minute > date_trunc('minute', clock.now) - interval '60 minutes'
  AND s.minute <= clock.now
GROUP BY s.queue, s.minute;

-- name: live_leases
-- Leases in flight, oldest claim first, from the lease table (leased events only)
-- and their rows by primary key.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now)
SELECT e.lease_id, e.queue, min(e.claimed_by) AS claimed_by, min(e.claimed_on) AS claimed_on,
       max(e.lease_expires_on) AS expires_on, min(e.group_key) AS group_key,
       count(*) AS events, min(e.item_key) AS first_key, max(e.redeliver_count) AS redeliver_count
FROM tickler_event AS e CROSS JOIN clock
WHERE e.id = ANY(ARRAY(  -- primary-key lookups, never a join over a scan of the events
        SELECT l.event_id FROM tickler_lease AS l
        WHERE l.expires_on > coalesce(CAST(:now AS timestamptz), now())
          AND (CAST(:names AS text[]) IS NULL OR l.queue = ANY(CAST(:names AS text[])))))
  AND e.lease_id IS NOT NULL AND e.lease_expires_on > clock.now
GROUP BY e.lease_id, e.queue
ORDER BY min(e.claimed_on), e.lease_id
LIMIT :limit;

-- name: queue_paused
-- Whether a queue is paused (NULL: no such queue).
SELECT paused FROM tickler_queue WHERE name = :name;

-- name: principal_by_hash
-- The principal behind a token hash, unless revoked: the dashboard's session keeps the hash.
SELECT id, principal, is_admin, queues FROM tickler_token
WHERE token_hash = :token_hash AND revoked_on IS NULL;

-- name: create_ui_secret
-- The first process that needs the session key creates it; the others keep the first one.
INSERT INTO tickler_ui_secret (secret) VALUES (:secret) ON CONFLICT (id) DO NOTHING;

-- name: get_ui_secret
SELECT secret FROM tickler_ui_secret;
