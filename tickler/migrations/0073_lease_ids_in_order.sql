-- Issue #21 (WAL per delivered event): lease ids in the order they are handed out.
--
-- A lease id was a random uuid (gen_random_uuid(), version 4). Its row in tickler_lease lives from
-- the claim to the ack, and the lease table's primary key (lease_id, event_id) took each new id at
-- a random place: the key's pages, full of the entries of leases already ended (a VACUUM removes
-- them; nothing else does, since no scan looks those ids up again), split in the middle, and each
-- such split wrote half a page of WAL (~3.7 KB; 17 bytes per delivered event in bench.walprofile).
-- Now the first 48 bits of a lease id are the time it was made, in milliseconds (the layout of
-- RFC 9562's version 7): new entries go to the right end of the key, the ended ones empty its left
-- pages for VACUUM to recycle, and a split there writes only the new right page.
--
-- The other 74 bits are gen_random_uuid()'s (random, from the operating system's source): a lease
-- id stays unguessable, which is what fences a stale ack (SPEC §4) — knowing when a lease was
-- made leaves 2^74 candidates. Nothing reads the time back out of an id: to a client it is an
-- opaque uuid as before, and ids of both kinds live side by side (leases taken before the upgrade).

-- A new lease id: 48 bits of Unix time in milliseconds, then gen_random_uuid()'s bits, with the
-- version nibble set to 7 (the variant bits stay those of version 4, RFC 9562's "10").
CREATE OR REPLACE FUNCTION tickler_new_lease_id() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT CAST(encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex') AS uuid)
$$;

COMMENT ON FUNCTION tickler_new_lease_id() IS
    'A lease id: its time of making in milliseconds first (RFC 9562 version 7 layout), 74 random bits after it (0073).';


-- tickler_claim_events() (latest: 0067), the same but for the lease id it hands out.
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
            lease_id = tickler_new_lease_id(),
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
