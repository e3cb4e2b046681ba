-- Every runtime query of tickler, by name. Loaded once by scheduler/sql.py.
-- Conventions:
--   * `:now` is the time to act at; NULL means the database clock (now()). Tests bind it to move
--     the clock; production code leaves it NULL, so time never comes from a worker's clock.
--   * Every statement that changes an event writes its timeline entry in the same statement
--     (a data-modifying CTE), so no change can happen without its history.
--   * Statements that return events return whole rows plus `status` (tickler_status()).

-- name: schedule_events
-- Insert events from a JSON array; keys that already have an open event are left alone.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
incoming AS (
    SELECT * FROM jsonb_to_recordset(CAST(:events AS jsonb)) AS x(
        ord integer, item_key text COLLATE "C", group_key text COLLATE "C",
        schedule_on timestamptz, delay_seconds double precision, data jsonb, max_attempts integer)
),
inserted AS (
    INSERT INTO tickler_event AS e
        (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
    SELECT :queue, i.item_key, i.group_key,
           coalesce(i.schedule_on, clock.now + make_interval(secs => coalesce(i.delay_seconds, 0))),
           coalesce(i.data, '{}'), clock.now, :actor, coalesce(i.max_attempts, :default_max_attempts)
    FROM incoming AS i CROSS JOIN clock
    ORDER BY i.ord
    ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, enqueued_on, 'enqueued', enqueued_by, schedule_on,
           jsonb_strip_nulls(jsonb_build_object('group_key', group_key, 'max_attempts', max_attempts))
    FROM inserted
),
hint AS (
    -- FOR KEY SHARE always (not only when notifying): see tickler_queue.next_wake
    SELECT q.next_wake FROM tickler_queue AS q WHERE q.name = :queue FOR KEY SHARE
),
wake AS (
    SELECT pg_notify('tickler_wake', :queue) FROM hint
    WHERE hint.next_wake > (SELECT min(schedule_on) FROM inserted)
)
SELECT i.ord, i.item_key, n.id AS id, (n.id IS NOT NULL) AS written, false AS replaced
FROM incoming AS i LEFT JOIN inserted AS n ON n.item_key = i.item_key
CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
ORDER BY i.ord;

-- name: schedule_event
-- Insert one event unless its key has an open event; returns the new event (no row: the key is
-- taken). The API's hot path: one statement, one round trip. Same effects as schedule_events.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
inserted AS (
    INSERT INTO tickler_event AS e
        (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
    SELECT :queue, :item_key, :group_key,
           coalesce(CAST(:schedule_on AS timestamptz),
                    clock.now + make_interval(secs => coalesce(CAST(:delay_seconds AS double precision), 0))),
           CAST(:data AS jsonb), clock.now, :actor,
           coalesce(CAST(:max_attempts AS integer), :default_max_attempts)
    FROM clock
    ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, enqueued_on, 'enqueued', enqueued_by, schedule_on,
           jsonb_strip_nulls(jsonb_build_object('group_key', group_key, 'max_attempts', max_attempts))
    FROM inserted
),
hint AS (
    SELECT q.next_wake FROM tickler_queue AS q WHERE q.name = :queue FOR KEY SHARE
),
wake AS (
    SELECT pg_notify('tickler_wake', :queue) FROM hint
    WHERE hint.next_wake > (SELECT schedule_on FROM inserted)
)
SELECT n.*, tickler_status(n.outcome, n.lease_expires_on, clock.now) AS status
FROM inserted AS n CROSS JOIN clock CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: schedule_events_replacing
-- Insert events from a JSON array; an open event with the same key that is not held under a
-- lease is replaced (same id, new schedule, data, group and max_attempts). Leased ones are left.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
incoming AS (
    SELECT * FROM jsonb_to_recordset(CAST(:events AS jsonb)) AS x(
        ord integer, item_key text COLLATE "C", group_key text COLLATE "C",
        schedule_on timestamptz, delay_seconds double precision, data jsonb, max_attempts integer)
),
upserted AS (
    INSERT INTO tickler_event AS e
        (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
    SELECT :queue, i.item_key, i.group_key,
           coalesce(i.schedule_on, clock.now + make_interval(secs => coalesce(i.delay_seconds, 0))),
           coalesce(i.data, '{}'), clock.now, :actor, coalesce(i.max_attempts, :default_max_attempts)
    FROM incoming AS i CROSS JOIN clock
    ORDER BY i.ord
    ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO UPDATE
        SET group_key = excluded.group_key,
            schedule_on = excluded.schedule_on,
            data = excluded.data,
            max_attempts = excluded.max_attempts,
            version = e.version + 1
        WHERE e.lease_id IS NULL
    RETURNING e.*, (e.xmax <> 0) AS replaced
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT u.queue, u.item_key, u.id, clock.now,
           CASE WHEN u.replaced THEN 'replaced' ELSE 'enqueued' END, :actor, u.schedule_on,
           jsonb_strip_nulls(jsonb_build_object('group_key', u.group_key, 'max_attempts', u.max_attempts))
    FROM upserted AS u CROSS JOIN clock
),
hint AS (
    SELECT q.next_wake FROM tickler_queue AS q WHERE q.name = :queue FOR KEY SHARE
),
wake AS (
    SELECT pg_notify('tickler_wake', :queue) FROM hint
    WHERE hint.next_wake > (SELECT min(schedule_on) FROM upserted)
)
SELECT i.ord, i.item_key, u.id AS id, (u.id IS NOT NULL) AS written, coalesce(u.replaced, false) AS replaced
FROM incoming AS i LEFT JOIN upserted AS u ON u.item_key = i.item_key
CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
ORDER BY i.ord;

-- name: open_event_ids
-- Ids of the open events with these keys (to report what a batch conflicted with).
SELECT item_key, id FROM tickler_event
WHERE queue = :queue AND item_key = ANY(CAST(:item_keys AS text[])) AND dequeued_on IS NULL;

-- name: get_open_event
-- The open event of a key, if any.
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, coalesce(CAST(:now AS timestamptz), now())) AS status
FROM tickler_event AS e
WHERE e.queue = :queue AND e.item_key = :item_key AND e.dequeued_on IS NULL;

-- name: get_latest_event
-- The open event of a key, else its most recent one (found through the key's timeline).
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, coalesce(CAST(:now AS timestamptz), now())) AS status
FROM tickler_event AS e
WHERE e.id = coalesce(
    (SELECT id FROM tickler_event
     WHERE queue = :queue AND item_key = :item_key AND dequeued_on IS NULL),
    (SELECT event_id FROM tickler_timeline
     WHERE queue = :queue AND item_key = :item_key ORDER BY id DESC LIMIT 1));

-- name: get_events_by_id
-- Events by id, in no particular order.
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, coalesce(CAST(:now AS timestamptz), now())) AS status
FROM tickler_event AS e
WHERE e.id = ANY(CAST(:ids AS bigint[]));

-- name: lock_open_event
-- The open event of a key, locked for a change in this transaction, with the time to act at.
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, clock.now) AS status, clock.now AS db_now
FROM tickler_event AS e
CROSS JOIN (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
WHERE e.queue = :queue AND e.item_key = :item_key AND e.dequeued_on IS NULL
FOR UPDATE OF e;

-- name: change_event
-- Reschedule or change a locked, open, unleased event.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
changed AS (
    UPDATE tickler_event AS e
    SET schedule_on = :schedule_on,
        data = CAST(:data AS jsonb),
        group_key = :group_key,
        version = e.version + 1
    WHERE e.id = :id AND e.dequeued_on IS NULL AND e.lease_id IS NULL
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, clock.now, :action, :actor, c.schedule_on, CAST(:details AS jsonb)
    FROM changed AS c CROSS JOIN clock
),
hint AS (
    SELECT q.name, q.next_wake FROM tickler_queue AS q WHERE q.name = (SELECT queue FROM changed) FOR KEY SHARE
),
wake AS (
    SELECT pg_notify('tickler_wake', hint.name) FROM hint
    WHERE hint.next_wake > (SELECT schedule_on FROM changed)
)
SELECT c.*, tickler_status(c.outcome, c.lease_expires_on, clock.now) AS status
FROM changed AS c CROSS JOIN clock CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: cancel_event
-- Cancel a locked, open, unleased event.
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

-- name: cancel_matching
-- Cancel every open, unleased event of a queue with this group and/or key prefix.
-- The prefix is a range [prefix, prefix_end) on the "C"-collated key (prefix_end NULL: no end).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
changed AS (
    UPDATE tickler_event AS e
    SET dequeued_on = clock.now, dequeued_by = :actor, outcome = 'cancelled', version = e.version + 1
    FROM clock
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL
      AND (CAST(:group_key AS text) IS NULL OR e.group_key = CAST(:group_key AS text))
      AND (CAST(:prefix AS text) IS NULL OR e.item_key >= CAST(:prefix AS text) COLLATE "C")
      AND (CAST(:prefix_end AS text) IS NULL OR e.item_key < CAST(:prefix_end AS text) COLLATE "C")
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, c.dequeued_on, 'cancelled', c.dequeued_by, c.schedule_on,
           jsonb_strip_nulls(jsonb_build_object('reason', CAST(:reason AS text), 'bulk', true))
    FROM changed AS c
)
SELECT count(*) AS cancelled FROM changed;

-- name: expire_leases
-- End leases whose time is up (optionally only in one queue, or for one key): the events are
-- claimable again and the attempt counts as a redelivery; an event whose last allowed attempt
-- it was is finished as dead.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
expired AS (
    SELECT e.id, e.lease_id, e.claimed_by, e.lease_expires_on,
           (e.redeliver_count + 1 >= e.max_attempts) AS exhausted
    FROM tickler_event AS e CROSS JOIN clock
    WHERE e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.lease_expires_on <= clock.now
      AND (CAST(:queue AS text) IS NULL OR e.queue = CAST(:queue AS text))
      AND (CAST(:item_key AS text) IS NULL OR e.item_key = CAST(:item_key AS text) COLLATE "C")
    FOR UPDATE OF e SKIP LOCKED
),
changed AS (
    UPDATE tickler_event AS e
    SET lease_id = NULL,
        lease_expires_on = NULL,
        redeliver_count = CASE WHEN x.exhausted THEN e.redeliver_count ELSE e.redeliver_count + 1 END,
        last_error = 'lease expired',
        dequeued_on = CASE WHEN x.exhausted THEN clock.now END,
        dequeued_by = CASE WHEN x.exhausted THEN :actor END,
        outcome = CASE WHEN x.exhausted THEN 'dead' END,
        version = e.version + 1
    FROM expired AS x CROSS JOIN clock
    WHERE e.id = x.id AND e.id = ANY(ARRAY(SELECT id FROM expired))  -- primary-key lookups (see claim_events)
    RETURNING e.*, x.lease_id AS old_lease_id, x.claimed_by AS old_claimed_by,
              x.lease_expires_on AS old_lease_expires_on, x.exhausted
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, clock.now, a.action, :actor, c.schedule_on, a.details
    FROM changed AS c CROSS JOIN clock
    CROSS JOIN LATERAL (VALUES
        (1, 'lease_expired', jsonb_build_object(
            'lease_id', c.old_lease_id, 'claimed_by', c.old_claimed_by,
            'expired_at', c.old_lease_expires_on)),
        (2, 'dead', jsonb_build_object('reason', 'attempts exhausted', 'attempts', c.redeliver_count + 1))
    ) AS a (step, action, details)
    WHERE a.step = 1 OR c.exhausted
    ORDER BY c.id, a.step
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM changed WHERE NOT exhausted) AS q
)
SELECT c.id, c.queue, c.exhausted FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: timeline
-- Every timeline entry of a key, across all its events, oldest first.
SELECT at, action, actor, event_id, schedule_on, details
FROM tickler_timeline
WHERE queue = :queue AND item_key = :item_key
ORDER BY id;

-- name: queue_state_counts
-- Events per state of a queue, from the trigger-kept counters (no scan of events).
SELECT state, sum(n)::bigint AS n FROM tickler_queue_count WHERE queue = :queue GROUP BY state;

-- name: queue_live_counts
-- The time-dependent counts of a queue: events under a live lease, and open events whose time
-- has come (due) that are not under a live lease. Both read only open events, through indexes.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now)
SELECT
    (SELECT count(*) FROM tickler_event AS e, clock
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL
       AND e.lease_expires_on > clock.now) AS in_flight,
    (SELECT count(*) FROM tickler_event AS e, clock
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.schedule_on <= clock.now
       AND NOT coalesce(e.lease_expires_on > clock.now, false)) AS due;

-- name: upsert_queue
-- Create a queue or change its settings; `created` tells which. Dispatchers are woken, so that
-- they start serving a new webhook queue at once.
WITH upserted AS (
INSERT INTO tickler_queue AS q (
    name, delivery_mode, webhook_url, webhook_timeout_seconds, signing_secret,
    lease_seconds, max_attempts, backoff_initial_seconds, backoff_max_seconds, backoff_multiplier)
VALUES (
    :name, :delivery_mode, :webhook_url, :webhook_timeout_seconds, :signing_secret,
    :lease_seconds, :max_attempts, :backoff_initial_seconds, :backoff_max_seconds, :backoff_multiplier)
ON CONFLICT (name) DO UPDATE SET
    delivery_mode = excluded.delivery_mode,
    webhook_url = excluded.webhook_url,
    webhook_timeout_seconds = excluded.webhook_timeout_seconds,
    -- a rotated secret keeps signing beside the new one for a day, so receivers can switch over
    previous_signing_secret = CASE
        WHEN q.signing_secret IS DISTINCT FROM excluded.signing_secret THEN q.signing_secret
        ELSE q.previous_signing_secret END,
    previous_secret_until = CASE
        WHEN q.signing_secret IS DISTINCT FROM excluded.signing_secret AND q.signing_secret IS NOT NULL
            THEN now() + interval '24 hours'
        ELSE q.previous_secret_until END,
    signing_secret = excluded.signing_secret,
    lease_seconds = excluded.lease_seconds,
    max_attempts = excluded.max_attempts,
    backoff_initial_seconds = excluded.backoff_initial_seconds,
    backoff_max_seconds = excluded.backoff_max_seconds,
    backoff_multiplier = excluded.backoff_multiplier,
    updated_on = now()
RETURNING q.*, (q.xmax = 0) AS created
),
wake AS (SELECT pg_notify('tickler_wake', '~' || name) FROM upserted)  -- '~': settings changed
SELECT u.* FROM upserted AS u CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: get_queue
-- One queue's settings.
SELECT * FROM tickler_queue WHERE name = :name;

-- name: get_queue_for_update
-- One queue's settings, locked while they are changed.
SELECT * FROM tickler_queue WHERE name = :name FOR UPDATE;

-- name: list_queues
-- Every queue (or those named), by name.
SELECT * FROM tickler_queue
WHERE CAST(:names AS text[]) IS NULL OR name = ANY(CAST(:names AS text[]))
ORDER BY name;

-- name: create_token
-- Store a new token's hash.
INSERT INTO tickler_token (principal, token_hash, is_admin, queues)
VALUES (:principal, :token_hash, :is_admin, CAST(:queues AS text[]))
RETURNING id, principal, is_admin, queues, created_on, revoked_on;

-- name: find_token
-- The principal behind a token hash, unless revoked.
SELECT principal, is_admin, queues FROM tickler_token
WHERE token_hash = :token_hash AND revoked_on IS NULL;

-- name: prepare_to_sleep
-- A dispatcher about to sleep: lock its queues' rows (waiting for writers that hold them), then
-- (next statement, fresh snapshot) find the next due time. See tickler_queue.next_wake.
SELECT name FROM tickler_queue WHERE name = ANY(CAST(:queues AS text[])) ORDER BY name FOR UPDATE;

-- name: next_due
-- The earliest schedule_on among claimable events of these queues (NULL: none). Events of a
-- group that holds a live lease are not claimable until it ends (its end wakes dispatchers).
-- Also the database's clock at the time of the read.
SELECT min(next_on) AS next_on, clock_timestamp() AS db_now FROM (
    SELECT (SELECT e.schedule_on FROM tickler_event AS e
            WHERE e.queue = q AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
            ORDER BY e.schedule_on, e.id LIMIT 1) AS next_on
    FROM unnest(CAST(:queues AS text[])) AS q
    UNION ALL
    SELECT (SELECT e.schedule_on FROM tickler_event AS e
            WHERE e.queue = q AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
              AND NOT EXISTS (
                  SELECT 1 FROM tickler_event AS l
                  WHERE l.queue = e.queue AND l.group_key = e.group_key
                    AND l.dequeued_on IS NULL AND l.lease_id IS NOT NULL)
            ORDER BY e.schedule_on, e.id LIMIT 1)
    FROM unnest(CAST(:queues AS text[])) AS q
) AS candidates;

-- name: set_next_wake
-- Record when the dispatchers of these queues will look next (under prepare_to_sleep's lock).
UPDATE tickler_queue SET next_wake = :next_wake WHERE name = ANY(CAST(:queues AS text[]));

-- name: claim_events
-- Lease up to :limit due, ungrouped events of a queue, one lease each, skipping rows that other
-- transactions hold. Returns the claimed events.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
candidates AS (
    SELECT e.id FROM tickler_event AS e
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
      AND e.schedule_on <= (SELECT now FROM clock)
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
        version = e.version + 1
    FROM clock
    -- = ANY(ARRAY(...)) and not a join: a join lets the planner hash-join a sequential scan of
    -- the whole table once it believes the candidates are many; this is always primary-key lookups.
    WHERE e.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, claimed_on, 'claimed', claimed_by, schedule_on,
           jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1,
                              'lease_expires_at', lease_expires_on)
    FROM claimed
)
SELECT c.*, 'in_flight' AS status FROM claimed AS c ORDER BY c.schedule_on, c.id;

-- name: has_due_groups
-- Whether a queue has due, unleased grouped events: a group claim opens its transaction only then.
SELECT EXISTS (
    SELECT 1 FROM tickler_event
    WHERE queue = :queue AND dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NOT NULL
      AND schedule_on <= coalesce(CAST(:now AS timestamptz), now())
) AS found;

-- name: lock_due_groups
-- Choose up to :limit groups of a queue that have due events and no lease, and take a
-- transaction-level advisory lock on each (skipping groups another claimer is locking now).
-- Only the chosen candidates are locked: the lock runs on the limited, ordered candidate list.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
due AS (
    SELECT e.group_key, e.schedule_on, e.id FROM tickler_event AS e
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
      AND e.schedule_on <= (SELECT now FROM clock)
    ORDER BY e.schedule_on, e.id
    LIMIT :scan
),
groups AS MATERIALIZED (
    SELECT d.group_key, min(d.schedule_on) AS first_due FROM due AS d
    WHERE NOT EXISTS (
        SELECT 1 FROM tickler_event AS l
        WHERE l.queue = :queue AND l.group_key = d.group_key
          AND l.dequeued_on IS NULL AND l.lease_id IS NOT NULL)
    GROUP BY d.group_key
    ORDER BY first_due, d.group_key
)
SELECT g.group_key FROM groups AS g
WHERE pg_try_advisory_xact_lock(hashtextextended(:queue || '/' || g.group_key, 0))
LIMIT :limit;

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
        version = e.version + 1
    FROM members AS m CROSS JOIN clock
    WHERE e.id = m.id AND e.id = ANY(ARRAY(SELECT id FROM members))  -- primary-key lookups (see claim_events)
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, claimed_on, 'claimed', claimed_by, schedule_on,
           jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1,
                              'lease_expires_at', lease_expires_on, 'group_key', group_key)
    FROM claimed
)
SELECT c.*, 'in_flight' AS status FROM claimed AS c ORDER BY c.group_key, c.schedule_on, c.id;

-- name: ack_leases
-- Finish every event of these live leases as delivered; returns the leases that were finished.
-- A lease that expired, was re-claimed or was already finished matches nothing (fencing).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
finished AS (
    UPDATE tickler_event AS e
    SET dequeued_on = clock.now, dequeued_by = e.claimed_by, outcome = 'delivered', version = e.version + 1
    FROM clock
    WHERE e.lease_id = ANY(CAST(:lease_ids AS uuid[])) AND e.dequeued_on IS NULL
      AND e.lease_expires_on > clock.now
      -- a caller limited to some queues cannot finish another tenant's lease (NULL: any queue)
      AND (CAST(:queues AS text[]) IS NULL OR e.queue = ANY(CAST(:queues AS text[])))
    RETURNING e.*
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT queue, item_key, id, dequeued_on, 'delivered', dequeued_by, schedule_on,
           jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1)
    FROM finished
),
wake AS (
    -- a group's lease ended: its other due events (scheduled meanwhile) are claimable now
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM finished WHERE group_key IS NOT NULL) AS q
)
SELECT f.lease_id, f.queue, count(*) AS events
FROM finished AS f CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
GROUP BY f.lease_id, f.queue;

-- name: fail_lease
-- A failed attempt for every event of a live lease: count the redelivery, keep the error and
-- schedule the retry with the queue's backoff (or :retry_in_seconds), or finish the event as
-- dead when its attempts are used up or :dead says so.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
failing AS (
    SELECT e.id,
           (CAST(:dead AS boolean) OR e.redeliver_count + 1 >= e.max_attempts) AS is_dead,
           coalesce(
               CAST(:retry_in_seconds AS double precision),
               least(q.backoff_max_seconds,
                     q.backoff_initial_seconds * power(q.backoff_multiplier, e.redeliver_count))
               * (1 - 0.25 * random())
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
        redeliver_count = CASE WHEN f.is_dead THEN e.redeliver_count ELSE e.redeliver_count + 1 END,
        schedule_on = CASE WHEN f.is_dead THEN e.schedule_on
                           ELSE clock.now + make_interval(secs => f.retry_in) END,
        dequeued_on = CASE WHEN f.is_dead THEN clock.now END,
        dequeued_by = CASE WHEN f.is_dead THEN e.claimed_by END,
        outcome = CASE WHEN f.is_dead THEN 'dead' END,
        version = e.version + 1
    FROM failing AS f CROSS JOIN clock
    WHERE e.id = f.id AND e.id = ANY(ARRAY(SELECT id FROM failing))  -- primary-key lookups (see claim_events)
    RETURNING e.*, f.is_dead, CAST(:lease_id AS uuid) AS old_lease_id
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, clock.now,
           CASE WHEN c.is_dead THEN 'dead' ELSE 'failed' END, c.claimed_by, c.schedule_on,
           jsonb_strip_nulls(jsonb_build_object(
               'lease_id', c.old_lease_id,
               'attempt', CASE WHEN c.is_dead THEN c.redeliver_count + 1 ELSE c.redeliver_count END,
               'error', c.last_error,
               'retry_at', CASE WHEN c.is_dead THEN NULL ELSE c.schedule_on END,
               'reason', CASE WHEN NOT c.is_dead THEN NULL
                              WHEN CAST(:dead AS boolean) THEN 'receiver said stop'
                              ELSE 'attempts exhausted' END))
    FROM changed AS c CROSS JOIN clock
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM changed WHERE group_key IS NOT NULL) AS q
)
SELECT c.id, c.queue, c.is_dead, c.schedule_on, c.redeliver_count
FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: extend_lease
-- Push a live lease's expiry to :seconds from now; returns the new expiry (no row: stale lease).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now)
UPDATE tickler_event AS e
SET lease_expires_on = clock.now + make_interval(secs => :seconds)
FROM clock
WHERE e.lease_id = CAST(:lease_id AS uuid) AND e.dequeued_on IS NULL AND e.lease_expires_on > clock.now
RETURNING e.lease_expires_on, e.queue;

-- name: release_leases
-- Give live leases back unfinished (a worker shutting down): the events are claimable at once,
-- and since no attempt was made, no redelivery is counted.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
released AS (
    UPDATE tickler_event AS e
    SET lease_id = NULL, lease_expires_on = NULL, version = e.version + 1
    FROM clock
    WHERE e.lease_id = ANY(CAST(:lease_ids AS uuid[])) AND e.dequeued_on IS NULL
      AND e.lease_expires_on > clock.now
    RETURNING e.*, CAST(:actor AS text) AS actor
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT r.queue, r.item_key, r.id, clock.now, 'released', r.actor, r.schedule_on, '{}'
    FROM released AS r CROSS JOIN clock
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT r.id FROM released AS r CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: lease_queue
-- The queue a live lease belongs to (NULL: no such live lease).
SELECT queue FROM tickler_event
WHERE lease_id = CAST(:lease_id AS uuid) AND dequeued_on IS NULL
  AND lease_expires_on > coalesce(CAST(:now AS timestamptz), now())
LIMIT 1;

-- name: webhook_queues
-- Queues whose events the dispatcher delivers by webhook.
SELECT * FROM tickler_queue WHERE delivery_mode = 'webhook' ORDER BY name;

-- name: list_tokens
-- Every token (never the token itself: only its hash is kept), newest first.
SELECT id, principal, is_admin, queues, created_on, revoked_on FROM tickler_token ORDER BY id DESC;

-- name: revoke_token
-- Revoke a token; returns it (no row: no such token).
UPDATE tickler_token SET revoked_on = coalesce(revoked_on, now()) WHERE id = :id
RETURNING id, principal, is_admin, queues, created_on, revoked_on;
