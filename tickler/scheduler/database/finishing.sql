-- How attempts end: expired leases ended, and the rules and timeline details that acks, nacks,
-- the reaper and retries share (attempts left, backoff, `lease_expired` and `retried` details).
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- Ends the expired leases of these events (p_ids: candidates, checked again here and locked,
-- rows other transactions hold skipped), exactly as the reaper does wherever such a lease is met
-- (the reaper, claims, replace, debounce, reschedule, cancel): one more redelivery, last_error
-- 'lease expired', and dead, finished by p_actor, when it was the last attempt. Each ended lease
-- gets its 'lease_expired' entry, carrying the claim it ends (tickler_with_claim), and an event
-- that died a 'dead' entry after it; the queues with events claimable again are woken.
-- Returns the events it ended and whether each died.
CREATE OR REPLACE FUNCTION tickler_end_expired_leases(p_ids bigint[], p_actor text, p_now timestamptz)
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
        version = e.version + 1, changed_on = clock.now
    FROM expired AS x CROSS JOIN clock
    WHERE e.id = x.id AND e.id = ANY(ARRAY(SELECT id FROM expired))  -- primary-key lookups
    RETURNING e.*, x.lease_id AS old_lease_id, x.claimed_by AS old_claimed_by,
              x.lease_expires_on AS old_lease_expires_on, x.exhausted
),
logged AS (
    SELECT tickler_timeline_write(array_agg(
               ROW(c.queue, c.item_key, c.id, clock.now, a.action, p_actor, c.schedule_on, a.details)::tickler_timeline_row
               ORDER BY c.id, a.step)) AS written
    FROM changed AS c CROSS JOIN clock
    CROSS JOIN LATERAL (VALUES
        (1, 'lease_expired', tickler_with_claim(
            tickler_lease_expired_details(c.old_lease_id, c.old_claimed_by, c.old_lease_expires_on),
            clock.now, p_actor, c.schedule_on, c.claimed_on, c.claimed_by, c.claimed_expires_on, c.old_lease_id,
            c.redeliver_count, c.group_key, c.schedule_on)),
        (2, 'dead', jsonb_build_object('reason', 'attempts exhausted', 'attempts', c.redeliver_count))
    ) AS a (step, action, details)
    WHERE a.step = 1 OR c.exhausted
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM changed WHERE NOT exhausted) AS q
)
SELECT c.id, c.queue, c.exhausted FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w
CROSS JOIN logged AS l
$$;

-- The details of a 'lease_expired' timeline entry (the reaper's and every statement's that ends a lease).
CREATE OR REPLACE FUNCTION tickler_lease_expired_details(lease_id uuid, claimed_by text, expired_at timestamptz)
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('lease_id', lease_id, 'claimed_by', claimed_by, 'expired_at', expired_at)
$$;

-- The details of a `retried` timeline entry, written by a retry by key and by a retry by filter
-- (which adds "bulk": true): the budget the event starts again with, its new and previous
-- max_attempts, and how it had died.
CREATE OR REPLACE FUNCTION tickler_retried_details(
    p_budget integer, p_max_attempts integer, p_previous_max_attempts integer, p_redeliver_count integer,
    p_dead_since timestamptz, p_last_error text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$  -- STABLE: a timestamptz is written in the session's time zone
    SELECT jsonb_build_object('attempts', p_budget, 'max_attempts', p_max_attempts,
                              'previous_max_attempts', p_previous_max_attempts,
                              'redeliver_count', p_redeliver_count, 'dead_since', p_dead_since,
                              'last_error', p_last_error)
$$;

-- The one rule for "no attempt is left": the attempt just made (counted from 1) was the last.
CREATE OR REPLACE FUNCTION tickler_attempts_used_up(attempt integer, max_attempts integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT attempt >= max_attempts
$$;

-- The one rule for the wait before a failed event is tried again: the queue's exponential backoff
-- after `failed_before` earlier failures, capped, with up to 25% jitter (retries of events that
-- failed together spread out).
CREATE OR REPLACE FUNCTION tickler_backoff_seconds(
    initial_seconds double precision, max_seconds double precision, multiplier double precision,
    failed_before integer
) RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT least(max_seconds, initial_seconds * power(multiplier, failed_before)) * (1 - 0.25 * random())
$$;
