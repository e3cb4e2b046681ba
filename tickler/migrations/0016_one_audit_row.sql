-- One timeline row per delivery attempt instead of two.
--
-- A claim used to append its `claimed` entry at once and the finish another one (delivered,
-- failed, released, lease_expired, dead, cancelled): two heap tuples and two primary-key entries
-- of tickler_timeline per attempt, a fifth of a delivered event's WAL (bench/walprofile.py).
-- Now the claim writes no timeline row. While the lease runs, its `claimed` entry is read from
-- the event row itself (claimed_on, claimed_by, lease_id); the statement that ends the lease
-- puts the claim into its own row, under details -> 'claim', and the readers
-- (tickler_timeline_entry below, the pipeline's report) show it as the `claimed` entry it was.
-- What a user reads is the same as before: claimed, then how the attempt ended.

-- The lease's expiry as the claim set it (the `claimed` entry's lease_expires_at): extensions
-- move lease_expires_on, not this. Set by every claim since this migration, so it also tells
-- which claims left their entry to the finish: a lease taken before the upgrade (NULL here) has
-- its `claimed` row already, and its finish does not write another one.
ALTER TABLE tickler_event ADD COLUMN claimed_expires_on timestamptz;

-- The `claimed` entry's details, as claims have always written them.
CREATE FUNCTION tickler_claim_details(lease_id uuid, attempt integer, lease_expires_on timestamptz, group_key text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('lease_id', lease_id, 'attempt', attempt, 'lease_expires_at', lease_expires_on)
           || CASE WHEN group_key IS NULL THEN '{}' ELSE jsonb_build_object('group_key', group_key) END
$$;

-- A lease-ending row's details with the claim it ends under "claim" (unchanged for a claim
-- logged on its own, before this migration). Only what the row does not say already, and
-- times as seconds (exact to the microsecond): the claim's time before the row's `at` (ago),
-- the lease it took (lease_seconds), and its attempt, lease id, actor and schedule when they
-- differ from the row's.
CREATE FUNCTION tickler_with_claim(
    details jsonb, at timestamptz, actor text, schedule_on timestamptz,
    claimed_on timestamptz, claimed_by text, claimed_expires_on timestamptz, lease_id uuid, attempt integer,
    group_key text, claim_schedule_on timestamptz)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN claimed_expires_on IS NULL THEN details ELSE details || jsonb_build_object('claim',
        jsonb_build_object('ago', CAST(extract(epoch FROM at - claimed_on) AS double precision),
                           'lease_seconds', CAST(extract(epoch FROM claimed_expires_on - claimed_on) AS double precision))
        || CASE WHEN details -> 'attempt' = to_jsonb(attempt) THEN '{}' ELSE jsonb_build_object('attempt', attempt) END
        || CASE WHEN details ->> 'lease_id' = CAST(lease_id AS text) THEN '{}'
                ELSE jsonb_build_object('lease_id', lease_id) END
        || CASE WHEN claimed_by = actor THEN '{}' ELSE jsonb_build_object('by', claimed_by) END
        || CASE WHEN claim_schedule_on = schedule_on THEN '{}' ELSE jsonb_build_object('schedule_on', claim_schedule_on) END
        || CASE WHEN group_key IS NULL THEN '{}' ELSE jsonb_build_object('group_key', group_key) END)
    END
$$;

-- Every timeline entry as users read it, ordered by (id, step): a row that carries its claim
-- gives the `claimed` entry first (step 1); an event under a lease gives its `claimed` entry
-- last (no id: nothing follows it until the lease ends).
CREATE VIEW tickler_timeline_entry AS
SELECT t.id, 1 AS step, t.queue, t.item_key, t.event_id, c.at, 'claimed' AS action,
       coalesce(t.details -> 'claim' ->> 'by', t.actor) AS actor,
       coalesce(CAST(t.details -> 'claim' ->> 'schedule_on' AS timestamptz), t.schedule_on) AS schedule_on,
       tickler_claim_details(
           CAST(coalesce(t.details -> 'claim' ->> 'lease_id', t.details ->> 'lease_id') AS uuid),
           CAST(coalesce(t.details -> 'claim' ->> 'attempt', t.details ->> 'attempt') AS integer),
           c.at + make_interval(secs => CAST(t.details -> 'claim' ->> 'lease_seconds' AS double precision)),
           t.details -> 'claim' ->> 'group_key') AS details
FROM tickler_timeline AS t
CROSS JOIN LATERAL (
    SELECT t.at - make_interval(secs => CAST(t.details -> 'claim' ->> 'ago' AS double precision)) AS at
) AS c
WHERE t.details ? 'claim'
UNION ALL
SELECT t.id, 2, t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details - 'claim'
FROM tickler_timeline AS t
UNION ALL
SELECT NULL, 3, e.queue, e.item_key, e.id, e.claimed_on, 'claimed', e.claimed_by, e.schedule_on,
       tickler_claim_details(e.lease_id, e.redeliver_count + 1, e.claimed_expires_on, e.group_key)
FROM tickler_event AS e
WHERE e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.claimed_expires_on IS NOT NULL;

-- The ending of expired leases (migration 0014), the same but for the `claimed` entry that its
-- 'lease_expired' row now carries.
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
        (1, 'lease_expired', tickler_with_claim(
            tickler_lease_expired_details(c.old_lease_id, c.old_claimed_by, c.old_lease_expires_on),
            clock.now, p_actor, c.schedule_on, c.claimed_on, c.claimed_by, c.claimed_expires_on, c.old_lease_id,
            c.redeliver_count, c.group_key, c.schedule_on)),
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

-- Room on each page of events for the versions their claim and finish write. Neither update can
-- be HOT (both change columns that index predicates read), but a new version written on the old
-- one's page is logged as a delta of it and touches no other page: with 30% of each page left
-- free, a delivered event writes ~170 bytes less WAL (bench/walprofile.py; 50% saved only 13 more
-- and doubles the table). Applies to pages filled from now on; nothing is rewritten.
ALTER TABLE tickler_event SET (fillfactor = 70);
