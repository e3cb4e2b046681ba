-- The claim statements of the release before priorities (scheduler/queries.sql before migration
-- 0045), frozen for tests/test_upgrade.py: its "previous release" database (migrations 0001 to
-- 0020) has no priority or fairness_key, and the previous release's workers claim with these.

-- name: claim_events
-- Lease up to :limit due, ungrouped events of a queue, one lease each, skipping rows that other
-- transactions hold. Returns the claimed events. An event whose lease expired and was not ended
-- yet is claimed first: its lease ends here as the reaper would end it (one more redelivery,
-- 'lease expired', a 'lease_expired' entry), or, when that was its last attempt, it dies through
-- tickler_end_expired_leases() instead of being claimed. A claim writes no `claimed` row: that
-- entry is read from the event while the lease runs, and written with the entry that ends it.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
expired AS (
    SELECT e.id, e.lease_id, e.claimed_by, e.lease_expires_on, e.claimed_on, e.claimed_expires_on,
           e.redeliver_count + 1 AS attempt,
           tickler_attempts_used_up(e.redeliver_count + 1, e.max_attempts) AS dies
    FROM tickler_event AS e
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.group_key IS NULL
      AND e.lease_expires_on <= (SELECT now FROM clock)
      AND (CAST(:flow AS boolean) OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                                      FROM tickler_queue AS q WHERE q.name = :queue))
    ORDER BY e.lease_expires_on
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
died AS (  -- the function is called only when one dies (it is planned at every call)
    SELECT count(*) AS n
    FROM tickler_end_expired_leases(ARRAY(SELECT id FROM expired WHERE dies), 'tickler', (SELECT now FROM clock))
    WHERE EXISTS (SELECT 1 FROM expired WHERE dies)
),
candidates AS (
    SELECT e.id FROM tickler_event AS e
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
      AND e.schedule_on <= (SELECT now FROM clock)
      -- the fast path takes nothing from a paused or limited queue: those are claimed only under
      -- the queue's flow lock (:flow, see flow_room), whatever a caller believes the settings are
      AND (CAST(:flow AS boolean) OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                                      FROM tickler_queue AS q WHERE q.name = :queue))
    ORDER BY e.schedule_on, e.id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE tickler_event AS e
    SET claimed_on = clock.now,
        claimed_by = :worker,
        lease_id = gen_random_uuid(),
        lease_expires_on = clock.now + make_interval(secs => :lease_seconds),
        claimed_expires_on = clock.now + make_interval(secs => :lease_seconds),
        -- an expired lease ends here: the attempt it was counts (see expired)
        redeliver_count = e.redeliver_count + CASE WHEN e.lease_id IS NULL THEN 0 ELSE 1 END,
        last_error = CASE WHEN e.lease_id IS NULL THEN e.last_error ELSE 'lease expired' END,
        version = e.version + 1
    FROM clock
    -- = ANY(ARRAY(...)) and not a join: a join lets the planner hash-join a sequential scan of
    -- the whole table once it believes the candidates are many; this is always primary-key lookups.
    WHERE e.id = ANY(ARRAY((SELECT id FROM expired WHERE NOT dies) UNION ALL (SELECT id FROM candidates) LIMIT :limit))
    RETURNING e.*
),
logged AS (  -- the expired leases this claim ended
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, c.claimed_on, 'lease_expired', 'tickler', c.schedule_on,
           tickler_with_claim(tickler_lease_expired_details(x.lease_id, x.claimed_by, x.lease_expires_on),
                              c.claimed_on, 'tickler', c.schedule_on, x.claimed_on, x.claimed_by,
                              x.claimed_expires_on, x.lease_id, x.attempt, c.group_key, c.schedule_on)
    FROM claimed AS c
    JOIN expired AS x ON x.id = c.id
    ORDER BY c.id
)
-- One row per claimed event, with whether its claim ended an expired lease; `died`: how many
-- events died of an expired lease (also on the one row of NULLs when nothing was claimed).
SELECT c.*, 'in_flight' AS status, (x.id IS NOT NULL) AS lease_ended, d.n AS died
FROM died AS d LEFT JOIN claimed AS c ON true LEFT JOIN expired AS x ON x.id = c.id
ORDER BY c.schedule_on, c.id;

-- name: lock_due_groups
-- Choose up to :limit groups of a queue that have due events and no live lease, and take a
-- transaction-level advisory lock on each (skipping groups another claimer is locking now).
-- Only the chosen candidates are locked: the lock runs on the limited, ordered candidate list.
-- A group whose lease expired without being ended yet is a candidate too: the lease of each
-- chosen group ends here (tickler_end_expired_leases(), as the reaper would end it), so that
-- claim_groups, the next statement, finds its events claimable (or dead).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
open_queue AS (
    SELECT CAST(:flow AS boolean) OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                                      FROM tickler_queue AS q WHERE q.name = :queue) AS open
),
due AS (
    (SELECT e.group_key, e.schedule_on, e.id FROM tickler_event AS e
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
       AND e.schedule_on <= (SELECT now FROM clock) AND (SELECT open FROM open_queue)
     ORDER BY e.schedule_on, e.id
     LIMIT :scan)
    UNION ALL
    (SELECT e.group_key, e.schedule_on, e.id FROM tickler_event AS e
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.group_key IS NOT NULL
       AND e.lease_expires_on <= (SELECT now FROM clock) AND (SELECT open FROM open_queue)
     ORDER BY e.lease_expires_on
     LIMIT :scan)
),
groups AS MATERIALIZED (
    SELECT d.group_key, min(d.schedule_on) AS first_due FROM due AS d
    WHERE NOT EXISTS (
        SELECT 1 FROM tickler_event AS l
        WHERE l.queue = :queue AND l.group_key = d.group_key
          AND l.dequeued_on IS NULL AND l.lease_id IS NOT NULL AND l.lease_expires_on > (SELECT now FROM clock))
    GROUP BY d.group_key
    ORDER BY first_due, d.group_key
),
chosen AS MATERIALIZED (
    SELECT g.group_key FROM groups AS g
    WHERE pg_try_advisory_xact_lock(hashtextextended(:queue || '/' || g.group_key, 0))
    LIMIT :limit
),
leased AS MATERIALIZED (  -- a chosen group's leased rows: its lease is over (live ones are not chosen)
    SELECT l.id FROM tickler_event AS l JOIN chosen AS c ON l.group_key = c.group_key
    WHERE l.queue = :queue AND l.dequeued_on IS NULL AND l.lease_id IS NOT NULL
),
ended AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM leased) THEN (
        SELECT count(*) FROM tickler_end_expired_leases(ARRAY(SELECT id FROM leased), 'tickler', (SELECT now FROM clock))
    ) ELSE 0 END AS n
)
SELECT c.group_key, e.n AS leases_ended FROM chosen AS c CROSS JOIN ended AS e;

-- name: claim_groups
-- Lease every due event of each locked group, one lease per group. Runs after lock_due_groups in
-- the same transaction, in a new statement: its snapshot sees every lease committed before the
-- advisory locks were taken, so a group that got a lease meanwhile is left alone.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
locked AS (
    SELECT g.group_key FROM unnest(CAST(:groups AS text[])) AS g (group_key)
    WHERE NOT EXISTS (
        SELECT 1 FROM tickler_event AS l
        WHERE l.queue = :queue AND l.group_key = g.group_key COLLATE "C"
          AND l.dequeued_on IS NULL AND l.lease_id IS NOT NULL)
),
leases AS (
    SELECT group_key, gen_random_uuid() AS lease_id FROM locked
),
members AS (
    SELECT e.id, s.lease_id FROM tickler_event AS e
    JOIN leases AS s ON e.group_key = s.group_key COLLATE "C"
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL
      AND e.schedule_on <= (SELECT now FROM clock)
    FOR UPDATE OF e SKIP LOCKED
),
claimed AS (
    UPDATE tickler_event AS e
    SET claimed_on = clock.now,
        claimed_by = :worker,
        lease_id = m.lease_id,
        lease_expires_on = clock.now + make_interval(secs => :lease_seconds),
        claimed_expires_on = clock.now + make_interval(secs => :lease_seconds),
        version = e.version + 1
    FROM members AS m CROSS JOIN clock
    WHERE e.id = m.id AND e.id = ANY(ARRAY(SELECT id FROM members))  -- primary-key lookups (see claim_events)
    RETURNING e.*
)
SELECT c.*, 'in_flight' AS status FROM claimed AS c ORDER BY c.group_key, c.schedule_on, c.id;

-- name: fail_lease
-- (The previous release's nack: this release's finds the lease in tickler_lease, migration 0060.)
-- A failed attempt for every event of a live lease: count the redelivery, keep the error and
-- schedule the retry with the queue's backoff (or :retry_in_seconds), or finish the event as
-- dead when its attempts are used up or :dead says so.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
failing AS (
    SELECT e.id, e.schedule_on AS claim_schedule_on,
           (CAST(:dead AS boolean) OR tickler_attempts_used_up(e.redeliver_count + 1, e.max_attempts)) AS is_dead,
           coalesce(
               CAST(:retry_in_seconds AS double precision),
               tickler_backoff_seconds(q.backoff_initial_seconds, q.backoff_max_seconds, q.backoff_multiplier,
                                       e.redeliver_count)
           ) AS retry_in
    FROM tickler_event AS e
    JOIN tickler_queue AS q ON q.name = e.queue
    CROSS JOIN clock
    WHERE e.lease_id = CAST(:lease_id AS uuid) AND e.dequeued_on IS NULL AND e.lease_expires_on > clock.now
    FOR UPDATE OF e
),
changed AS (
    UPDATE tickler_event AS e
    SET lease_id = NULL,
        lease_expires_on = NULL,
        last_error = CAST(:error AS text),
        redeliver_count = e.redeliver_count + 1,  -- every failed attempt, the last one included
        schedule_on = CASE WHEN f.is_dead THEN e.schedule_on
                           ELSE clock.now + make_interval(secs => f.retry_in) END,
        dequeued_on = CASE WHEN f.is_dead THEN clock.now END,
        dequeued_by = CASE WHEN f.is_dead THEN e.claimed_by END,
        outcome = CASE WHEN f.is_dead THEN 'dead' END,
        version = e.version + 1
    FROM failing AS f CROSS JOIN clock
    WHERE e.id = f.id AND e.id = ANY(ARRAY(SELECT id FROM failing))  -- primary-key lookups (see claim_events)
    RETURNING e.*, f.is_dead, f.claim_schedule_on, CAST(:lease_id AS uuid) AS old_lease_id
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, clock.now,
           CASE WHEN c.is_dead THEN 'dead' ELSE 'failed' END, c.claimed_by, c.schedule_on,
           tickler_with_claim(jsonb_strip_nulls(jsonb_build_object(
               'lease_id', c.old_lease_id,
               'attempt', c.redeliver_count,
               'trace_id', CAST(:trace_id AS text),  -- the attempt's trace (SPEC §11), when traced
               'error', c.last_error,
               'retry_at', CASE WHEN c.is_dead THEN NULL ELSE c.schedule_on END,
               'reason', CASE WHEN NOT c.is_dead THEN NULL
                              WHEN CAST(:dead AS boolean) THEN 'receiver said stop'
                              ELSE 'attempts exhausted' END)),
               clock.now, c.claimed_by, c.schedule_on, c.claimed_on, c.claimed_by, c.claimed_expires_on,
               c.old_lease_id, c.redeliver_count, c.group_key, c.claim_schedule_on)
    FROM changed AS c CROSS JOIN clock
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM changed WHERE group_key IS NOT NULL) AS q
)
SELECT c.id, c.queue, c.is_dead, c.schedule_on, c.redeliver_count
FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: cancel_event
-- The cancel of a locked, open, unleased event before migration 0061 (its own timeline insert;
-- this release's hands its entry to tickler_timeline_write(), which the previous schema lacks).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
changed AS (
    UPDATE tickler_event AS e
    SET dequeued_on = clock.now, dequeued_by = :actor, outcome = 'cancelled', version = e.version + 1
    FROM clock
    WHERE e.id = :id AND e.dequeued_on IS NULL AND e.lease_id IS NULL
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, c.dequeued_on, 'cancelled', c.dequeued_by, c.schedule_on,
           jsonb_strip_nulls(jsonb_build_object('reason', CAST(:reason AS text)))
    FROM changed AS c
)
SELECT c.*, tickler_status(c.outcome, c.lease_expires_on, clock.now) AS status
FROM changed AS c CROSS JOIN clock;
