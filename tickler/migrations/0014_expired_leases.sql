-- Expired leases end wherever they are met. A lease whose time is up is over (ack, nack and
-- extend refuse it), but until the reaper ended it, its event was neither in flight nor changeable,
-- and every caller had to remember to end expired leases first. Now the statements end them
-- themselves, exactly as the reaper does (one more redelivery, 'lease expired', a 'lease_expired'
-- timeline entry, dead when it was the last attempt): claims take such events, replace, debounce,
-- reschedule and cancel change them. The reaper stays, for events nobody touches.

-- The one rule for "no attempt is left": the attempt just made (counted from 1) was the last.
CREATE FUNCTION tickler_attempts_used_up(attempt integer, max_attempts integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT attempt >= max_attempts
$$;

-- The one rule for the wait before a failed event is tried again: the queue's exponential backoff
-- after `failed_before` earlier failures, capped, with up to 25% jitter (retries of events that
-- failed together spread out).
CREATE FUNCTION tickler_backoff_seconds(
    initial_seconds double precision, max_seconds double precision, multiplier double precision,
    failed_before integer
) RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT least(max_seconds, initial_seconds * power(multiplier, failed_before)) * (1 - 0.25 * random())
$$;

-- The details of a 'lease_expired' timeline entry (the reaper's and every statement's that ends a lease).
CREATE FUNCTION tickler_lease_expired_details(lease_id uuid, claimed_by text, expired_at timestamptz)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('lease_id', lease_id, 'claimed_by', claimed_by, 'expired_at', expired_at)
$$;

-- Leases of a queue by expiry, ungrouped and grouped apart (like the claimable indexes): claims
-- find the expired leases of their queue (almost always none) without reading the live ones. The
-- group_key condition also keeps them out of plans by lease id (ack, nack, extend: a scan of
-- every live lease by expiry would look cheap to a planner without statistics).
CREATE INDEX tickler_event_lease_expiry
    ON tickler_event (queue, lease_expires_on) WHERE dequeued_on IS NULL AND lease_id IS NOT NULL AND group_key IS NULL;
CREATE INDEX tickler_event_lease_expiry_group
    ON tickler_event (queue, lease_expires_on)
    WHERE dequeued_on IS NULL AND lease_id IS NOT NULL AND group_key IS NOT NULL;

-- End the expired leases of these events (those still open, leased and expired at p_now; rows
-- another transaction holds are skipped, it will have ended them or will): the event is claimable
-- again and the attempt counts as a redelivery; an event whose last allowed attempt it was is
-- finished as dead. Dispatchers of the queues of released events are woken.
CREATE FUNCTION tickler_end_expired_leases(p_ids bigint[], p_actor text, p_now timestamptz)
RETURNS TABLE (id bigint, queue text, exhausted boolean)
LANGUAGE sql AS $$
WITH clock AS (SELECT coalesce(p_now, now()) AS now),
expired AS (
    SELECT e.id, e.lease_id, e.claimed_by, e.lease_expires_on,
           tickler_attempts_used_up(e.redeliver_count + 1, e.max_attempts) AS exhausted
    FROM tickler_event AS e CROSS JOIN clock
    WHERE e.id = ANY(p_ids)
      AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.lease_expires_on <= clock.now
    FOR UPDATE OF e SKIP LOCKED
),
changed AS (
    UPDATE tickler_event AS e
    SET lease_id = NULL,
        lease_expires_on = NULL,
        redeliver_count = e.redeliver_count + 1,  -- the expired attempt counts, the last one too
        last_error = 'lease expired',
        dequeued_on = CASE WHEN x.exhausted THEN clock.now END,
        dequeued_by = CASE WHEN x.exhausted THEN p_actor END,
        outcome = CASE WHEN x.exhausted THEN 'dead' END,
        version = e.version + 1
    FROM expired AS x CROSS JOIN clock
    WHERE e.id = x.id AND e.id = ANY(ARRAY(SELECT id FROM expired))  -- primary-key lookups
    RETURNING e.*, x.lease_id AS old_lease_id, x.claimed_by AS old_claimed_by,
              x.lease_expires_on AS old_lease_expires_on, x.exhausted
),
logged AS (
    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
    SELECT c.queue, c.item_key, c.id, clock.now, a.action, p_actor, c.schedule_on, a.details
    FROM changed AS c CROSS JOIN clock
    CROSS JOIN LATERAL (VALUES
        (1, 'lease_expired', tickler_lease_expired_details(c.old_lease_id, c.old_claimed_by, c.old_lease_expires_on)),
        (2, 'dead', jsonb_build_object('reason', 'attempts exhausted', 'attempts', c.redeliver_count))
    ) AS a (step, action, details)
    WHERE a.step = 1 OR c.exhausted
    ORDER BY c.id, a.step
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM changed WHERE NOT exhausted) AS q
)
SELECT c.id, c.queue, c.exhausted FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
$$;

-- The open event of a key, locked for a change in this transaction; a lease of it whose time is
-- up is ended first (reschedule, update and cancel by key then change it as the pending event it is).
CREATE FUNCTION tickler_lock_open_event(p_queue text, p_item_key text, p_now timestamptz)
RETURNS SETOF tickler_event
LANGUAGE plpgsql AS $$
DECLARE
    v_event tickler_event;
BEGIN
    SELECT e.* INTO v_event FROM tickler_event AS e
    WHERE e.queue = p_queue AND e.item_key = p_item_key AND e.dequeued_on IS NULL
    FOR UPDATE OF e;
    IF v_event.lease_id IS NOT NULL AND v_event.lease_expires_on <= coalesce(p_now, now()) THEN
        PERFORM tickler_end_expired_leases(ARRAY[v_event.id], 'tickler', p_now);
        -- still locked by us; gone when it died
        SELECT e.* INTO v_event FROM tickler_event AS e WHERE e.id = v_event.id AND e.dequeued_on IS NULL;
    END IF;
    IF v_event.id IS NOT NULL THEN
        RETURN NEXT v_event;
    END IF;
END
$$;

-- tickler_schedule() (migration 0008) counts a lease until it is ended, and leaves ending expired
-- ones to its caller: it becomes tickler_schedule_write(), and tickler_schedule() — the name every
-- caller uses — ends the expired leases of the keys first for replace and debounce (an event whose
-- last attempt it was is then dead, and its key free). The leases are found through the expiry
-- indexes (almost always none, however many keys), then locked — waiting for a writer that holds
-- one, and re-checked after it — and ended.
ALTER FUNCTION tickler_schedule(text, jsonb, text, text, timestamptz, double precision, boolean)
    RENAME TO tickler_schedule_write;

CREATE FUNCTION tickler_schedule(
    p_queue text,
    p_events jsonb,
    p_actor text,
    p_on_conflict text DEFAULT 'reject',
    p_now timestamptz DEFAULT NULL,
    p_debounce_max_seconds double precision DEFAULT NULL,
    p_with_events boolean DEFAULT false
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_expired bigint[];
BEGIN
    IF p_on_conflict IN ('replace', 'debounce') THEN
        SELECT array_agg(x.id) INTO v_expired FROM (
            SELECT e.id, e.item_key FROM tickler_event AS e
            WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.group_key IS NULL
              AND e.lease_expires_on <= v_now
            UNION ALL
            SELECT e.id, e.item_key FROM tickler_event AS e
            WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.group_key IS NOT NULL
              AND e.lease_expires_on <= v_now
        ) AS x
        WHERE x.item_key = ANY(ARRAY(SELECT k.item_key FROM jsonb_to_recordset(p_events) AS k(item_key text)));
        IF v_expired IS NOT NULL THEN
            SELECT array_agg(l.id) INTO v_expired FROM (
                SELECT e.id FROM tickler_event AS e
                WHERE e.id = ANY(v_expired) AND e.dequeued_on IS NULL AND e.lease_expires_on <= v_now
                ORDER BY e.id
                FOR UPDATE OF e
            ) AS l;
            PERFORM tickler_end_expired_leases(v_expired, 'tickler', v_now);
        END IF;
    END IF;
    RETURN QUERY
    SELECT * FROM tickler_schedule_write(p_queue, p_events, p_actor, p_on_conflict, p_now, p_debounce_max_seconds,
                                         p_with_events);
END
$$;
