-- Issue #21: the plain claim planned once per session, not at every call.
--
-- claim_events (scheduler/queries.sql) ran as a prepared statement, and PostgreSQL planned it
-- anew at every call: a prepared statement keeps a generic plan only when it is estimated no
-- dearer than the plans made for the values, and a generic plan prices `LIMIT :limit` at a tenth
-- of the table. Planning the claim cost as much CPU as running it (bench/analysis.md, "Claims
-- planned without statistics, and at every call": 1,500 against 722 µs of backend CPU per claim
-- of 10 among 40,000 due events). The statement moves, unchanged but for its parameters, into
-- this PL/pgSQL function, whose plans are generic by its SET clause (as tickler_fair_pick's,
-- 0047): planned once per session, and again after each ANALYZE of the tables it reads.
-- tests/test_plans.py holds the plan to the claimable index. The end of the statement (died,
-- claimed, logged) is the text of the fragment claim_ended_leases, which the fair claim
-- (claim_events_round_robin) still shares from scheduler/queries.sql: change both together.
--
-- One row per claimed event (`event`, in claim order), with whether its claim ended an expired
-- lease; `died`: how many events died of an expired lease; one row with `event` NULL when
-- nothing was claimed.
CREATE OR REPLACE FUNCTION tickler_claim_events(
    p_queue text,
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_now timestamptz,
    p_flow boolean
) RETURNS TABLE (event tickler_event, lease_ended boolean, died bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE clock AS (SELECT coalesce(p_now, now()) AS now),
    levels AS (
        (SELECT e.priority FROM tickler_event AS e
         WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
         ORDER BY e.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT e.priority FROM tickler_event AS e
                WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
                  AND e.priority < l.priority
                ORDER BY e.priority DESC LIMIT 1)
        FROM levels AS l WHERE l.priority IS NOT NULL
    ),
    expired AS (
        SELECT e.id, e.lease_id, e.claimed_by, e.lease_expires_on, e.claimed_on, e.claimed_expires_on,
               e.redeliver_count + 1 AS attempt,
               tickler_attempts_used_up(e.redeliver_count + 1, e.max_attempts) AS dies
        FROM tickler_event AS e
        -- the queue's expired leases, from the lease table (migration 0060), then their rows
        WHERE e.id = ANY(ARRAY(
                SELECT l.event_id FROM tickler_lease AS l
                WHERE l.queue = p_queue AND l.group_key IS NULL AND l.expires_on <= (SELECT now FROM clock)
                ORDER BY l.expires_on LIMIT p_limit))
          AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.group_key IS NULL
          AND e.lease_expires_on <= (SELECT now FROM clock)
          AND (p_flow OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                                                 AND NOT q.fair_share AND q.max_in_flight_per_key IS NULL
                                          FROM tickler_queue AS q WHERE q.name = p_queue))
        ORDER BY e.lease_expires_on
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ),
    chosen AS (  -- the unleased due events, in claim order
        SELECT c.id FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT e.id FROM tickler_event AS e
            WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
              AND e.priority = l.priority AND e.schedule_on <= (SELECT now FROM clock)
              -- the fast path takes nothing from a paused or limited queue: those are claimed only under
              -- the queue's flow lock (:flow, see flow_room), whatever a caller believes the settings are
              AND (p_flow OR (
                  SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                         AND NOT q.fair_share AND q.max_in_flight_per_key IS NULL
                  FROM tickler_queue AS q WHERE q.name = p_queue))
            ORDER BY e.schedule_on, e.id
            LIMIT p_limit
            FOR UPDATE OF e SKIP LOCKED
        ) AS c
        WHERE l.priority IS NOT NULL
        LIMIT p_limit
    ),
    -- The end of claim_events and claim_events_round_robin, shared word for word: each defines `clock`,
    -- `expired` (the queue's expired leases it locked: id, the lease's columns, attempt, dies) and
    -- `chosen` (the unleased events it locked, in order: id) before it. `died` ends the expired leases
    -- that were their events' last attempt (tickler_end_expired_leases); `claimed` leases the others
    -- and the chosen events, at most p_limit; `logged` writes the 'lease_expired' entry of each
    -- expired lease the claim ended.
    died AS (  -- the function is called only when one dies (it is planned at every call)
        SELECT count(*) AS n
        FROM tickler_end_expired_leases(ARRAY(SELECT id FROM expired WHERE dies), 'tickler', (SELECT now FROM clock))
        WHERE EXISTS (SELECT 1 FROM expired WHERE dies)
    ),
    claimed AS (
        UPDATE tickler_event AS e
        SET claimed_on = clock.now,
            claimed_by = p_worker,
            lease_id = gen_random_uuid(),
            lease_expires_on = clock.now + make_interval(secs => p_lease_seconds),
            claimed_expires_on = clock.now + make_interval(secs => p_lease_seconds),
            -- an expired lease ends here: the attempt it was counts (see expired)
            redeliver_count = e.redeliver_count + CASE WHEN e.lease_id IS NULL THEN 0 ELSE 1 END,
            last_error = CASE WHEN e.lease_id IS NULL THEN e.last_error ELSE 'lease expired' END,
            version = e.version + 1
        FROM clock
        -- = ANY(ARRAY(...)) and not a join: a join lets the planner hash-join a sequential scan of
        -- the whole table once it believes the candidates are many; this is always primary-key lookups.
        WHERE e.id = ANY(ARRAY((SELECT id FROM expired WHERE NOT dies) UNION ALL (SELECT id FROM chosen) LIMIT p_limit))
        RETURNING e.*
    ),
    logged AS (  -- the expired leases this claim ended
        SELECT tickler_timeline_write(array_agg(ROW(
                   c.queue, c.item_key, c.id, c.claimed_on, 'lease_expired', 'tickler', c.schedule_on,
                   tickler_with_claim(tickler_lease_expired_details(x.lease_id, x.claimed_by, x.lease_expires_on),
                                      c.claimed_on, 'tickler', c.schedule_on, x.claimed_on, x.claimed_by,
                                      x.claimed_expires_on, x.lease_id, x.attempt, c.group_key, c.schedule_on)
               )::tickler_timeline_row ORDER BY c.id)) AS written
        FROM claimed AS c
        JOIN expired AS x ON x.id = c.id
    )
    -- One row per claimed event, with whether its claim ended an expired lease; `died`: how many
    -- events died of an expired lease (also on the one row of NULLs when nothing was claimed).
    SELECT CASE WHEN c.id IS NOT NULL THEN ROW(c.*)::tickler_event END, (x.id IS NOT NULL), d.n
    FROM died AS d CROSS JOIN logged AS l LEFT JOIN claimed AS c ON true LEFT JOIN expired AS x ON x.id = c.id
    ORDER BY c.priority DESC, c.schedule_on, c.id;
END
$$;
