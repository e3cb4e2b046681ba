-- Claims: the plain claim of a queue's ungrouped events, the fair pick across fairness keys,
-- whether a queue has group work, lease ids and the details a claim leaves in the timeline. The
-- lease table (tickler_lease) is kept by the triggers of event_triggers.sql; its TRUNCATE is here.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- The claim of a queue's ungrouped events without the flow lock: leases up to p_limit of them to
-- p_worker for p_lease_seconds, events whose lease expired first. An expired lease ends here, its
-- attempt counted; an event whose last attempt it was dies through tickler_end_expired_leases
-- instead of being claimed. p_now NULL: the database clock.
-- Which unleased events (`chosen`): for a plain queue (p_fair false), higher priority first, then
-- earlier due time, each priority level found by a skip scan and read from its first due event on;
-- for a fair-share queue without a cap (p_fair true), what tickler_fair_pick hands out (round robin
-- across fairness keys within a level), in that order. The fair cursor is a hint, not a limit,
-- so this claim takes no lock but the rows' own (SKIP LOCKED).
-- p_flow false: the statement takes nothing from a paused or limited queue, nor from a queue
-- whose fair_share is not p_fair, whatever a caller believes the settings are (those are claimed
-- only under the queue's flow lock, see flow_room and claim_events_fair in scheduler/queries.sql).
-- PL/pgSQL on generic plans (plan_cache_mode): planned once per session, and again after each
-- ANALYZE of the tables it reads. A prepared statement would be planned at every call (a generic
-- plan prices `LIMIT p_limit` at a tenth of the table, so it never looks cheaper than a custom
-- one), at as much CPU as running it; the branch of the other kind of queue is a one-time filter.
-- tests/test_plans.py holds the plans to the claimable indexes.
-- Returns one row per claimed event (claim order) with whether its claim ended an expired lease,
-- and `died`: how many events died of an expired lease; one row with `event` NULL when nothing
-- was claimed.
CREATE OR REPLACE FUNCTION tickler_claim_events(
    p_queue text,
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_now timestamptz,
    p_flow boolean,
    p_fair boolean
) RETURNS TABLE (event tickler_event, lease_ended boolean, died bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE clock AS (SELECT coalesce(p_now, now()) AS now),
    open_to_us AS (  -- without the flow lock: only a queue of this claim's kind with no limits
        SELECT p_flow OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                                 AND q.fair_share = p_fair AND q.max_in_flight_per_key IS NULL
                          FROM tickler_queue AS q WHERE q.name = p_queue) AS ok
    ),
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
        -- the queue's expired leases, from the lease table (in-flight events only), then their rows
        WHERE e.id = ANY(ARRAY(
                SELECT l.event_id FROM tickler_lease AS l
                WHERE l.queue = p_queue AND l.group_key IS NULL AND l.expires_on <= (SELECT now FROM clock)
                ORDER BY l.expires_on LIMIT p_limit))
          AND e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.group_key IS NULL
          AND e.lease_expires_on <= (SELECT now FROM clock)
          AND (SELECT ok FROM open_to_us)
        ORDER BY e.lease_expires_on
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ),
    picked AS MATERIALIZED (  -- a fair queue's unleased events, in the order handed out
        SELECT tickler_fair_pick(p_queue, clock.now, (p_limit - (SELECT count(*) FROM expired WHERE NOT dies))::integer,
                                 NULL) AS ids
        FROM clock WHERE p_fair AND (SELECT ok FROM open_to_us)
    ),
    chosen AS (  -- the unleased due events, in claim order
        (SELECT c.id FROM levels AS l
         CROSS JOIN LATERAL (
             SELECT e.id FROM tickler_event AS e
             WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
               AND e.priority = l.priority AND e.schedule_on <= (SELECT now FROM clock)
               AND (SELECT ok FROM open_to_us)
             ORDER BY e.schedule_on, e.id
             LIMIT p_limit
             FOR UPDATE OF e SKIP LOCKED
         ) AS c
         WHERE NOT p_fair AND l.priority IS NOT NULL
         LIMIT p_limit)
        UNION ALL
        SELECT unnest(p.ids) FROM picked AS p
    ),
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
            version = e.version + 1, changed_on = clock.now
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
    -- A fair claim's order: its expired leases first, then as handed out.
    SELECT CASE WHEN c.id IS NOT NULL THEN ROW(c.*)::tickler_event END, (x.id IS NOT NULL), d.n
    FROM died AS d CROSS JOIN logged AS l LEFT JOIN claimed AS c ON true LEFT JOIN expired AS x ON x.id = c.id
    LEFT JOIN picked AS p ON true
    ORDER BY CASE WHEN p_fair THEN x.id IS NULL END, CASE WHEN p_fair THEN array_position(p.ids, c.id) END,
             c.priority DESC, c.schedule_on, c.id;
END
$$;

-- The previous release's call of the plain claim (its workers run on during an upgrade).
CREATE OR REPLACE FUNCTION tickler_claim_events(
    p_queue text,
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_now timestamptz,
    p_flow boolean
) RETURNS TABLE (event tickler_event, lease_ended boolean, died bigint)
LANGUAGE sql AS $$
    SELECT * FROM tickler_claim_events(p_queue, p_worker, p_limit, p_lease_seconds, p_now, p_flow, false)
$$;

-- Whether a group claim of this queue would find work now (p_flow false: and the queue is
-- one claimed without the flow lock). A dispatcher serves groups and ungrouped events in turns (groups first
-- every other round, so neither starves the other); the ungrouped claims (claim_events,
-- claim_events_fair) return this answer with their rows, and the dispatcher runs a group
-- claim only when the claim before it saw group work (scheduler/store/leases.py). That spares a
-- queue without groups, the common case, a statement and a round trip of its own every other claim.
-- PL/pgSQL, so that its two probes are planned once per session (a LANGUAGE sql function with
-- sub-selects is not inlined and would be planned at every call of the statement that calls it).
-- The expired-lease probe reads tickler_lease_grouped, which a queue without groups leaves empty.
CREATE OR REPLACE FUNCTION tickler_groups_due(p_queue text, p_now timestamptz, p_flow boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- due, unleased grouped events, or grouped events whose lease expired (a group claim takes
    -- both); `p_flow` false: the question of a claim without the flow lock, which a paused or limited queue answers
    -- "no" (such queues are claimed only under their flow lock, see flow_room).
    RETURN (EXISTS (
        SELECT 1 FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
          AND e.schedule_on <= coalesce(p_now, now())
    ) OR EXISTS (
        SELECT 1 FROM tickler_lease AS l
        WHERE l.queue = p_queue AND l.group_key IS NOT NULL AND l.expires_on <= coalesce(p_now, now())
    )) AND (p_flow OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                              AND q.max_in_flight_per_key IS NULL
                       FROM tickler_queue AS q WHERE q.name = p_queue));
END
$$;

-- The earliest due time among the queue's open, unleased, ungrouped events (NULL: none): one
-- probe of tickler_event_claimable_priority per priority level that has such events, lowest
-- level first (each probe finds the next level and its earliest event at once), one more to
-- find there is none above. Generic plans: each statement is one index probe whatever the values.
-- Read by the dispatcher's next_due, has_due_events and the dashboard's fair backlogs.
CREATE OR REPLACE FUNCTION tickler_first_claimable(p_queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_level  smallint;
    v_first  timestamptz;
    v_min    timestamptz;
BEGIN
    SELECT e.priority, e.schedule_on INTO v_level, v_first FROM tickler_event AS e
    WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
    ORDER BY e.priority, e.schedule_on, e.id
    LIMIT 1;
    WHILE FOUND LOOP
        v_min := least(v_min, v_first);
        SELECT e.priority, e.schedule_on INTO v_level, v_first FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
          AND e.priority > v_level
        ORDER BY e.priority, e.schedule_on, e.id
        LIMIT 1;
    END LOOP;
    RETURN v_min;
END
$$;

-- The ids a fair claim of a queue takes (at most p_limit), locked (FOR UPDATE SKIP LOCKED), in the
-- order handed out: each priority level from the highest; within a level, the keys with a due
-- event from the one after the cursor on (wrapping around once), round r handing out every key's
-- r-th due event, until the batch is full. With p_cap, a key gets at most its room (p_cap less its
-- live leases); called with p_cap only under the queue's flow lock, which makes the room exact.
-- A lower level is served only when the higher one has nothing more to give this claim (strict
-- priority), or when the claim looked at 10 x p_limit keys of the level (it then moves the cursor
-- to the last key it looked at, so the next claim goes on from there).
--
-- Generic plans always (plan_cache_mode): PL/pgSQL plans a statement for its values on each of its
-- first five calls in a session, and at 1,000,000 events of one key those plans cost 35-270 ms a
-- call (the generic ones: 2-7 ms), which every new connection paid on its first fair claims. Every
-- statement here is a probe or a range read of one index whatever the values.
CREATE OR REPLACE FUNCTION tickler_fair_pick(p_queue text, p_now timestamptz, p_limit integer, p_cap integer)
RETURNS bigint[] LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_cursor   text;                 -- the cursor as read
    v_after    text;                 -- where the next level (and the next claim) starts
    v_start    text;                 -- where this level's walk started (NULL: the first key)
    v_level    smallint;
    v_from     text;                 -- the last key looked at (NULL: none yet, or wrapped)
    v_wrapped  boolean;
    v_done     boolean;              -- every key of the level seen once, or the look budget spent
    v_budget   boolean;              -- the look budget spent
    v_looked   integer;
    v_seen     text;                 -- the last key looked at in this level
    v_served   text;                 -- the last key served in this level
    v_key      text;
    v_walked   text[];               -- the keys one walk statement looked at, in order
    v_firsts   timestamptz[];        -- each one's earliest claimable event at this level
    v_found    integer;              -- how many of them have a due event
    v_want     integer;
    v_hi       text;                 -- after the wrap: the last key to look at (the start key)
    v_room     integer;
    v_keys     text[];               -- a stretch of keys with due events, in cursor order
    v_rooms    integer[];
    v_quota    integer;
    v_ids      bigint[];
    v_pos      integer[];             -- the position (in v_keys) of each id
    v_id_keys  text[];               -- the fairness key of each id
    v_id_dues  timestamptz[];        -- the due time of each id
    v_taken    bigint[] := '{}';
    v_taken_keys text[] := '{}';     -- the fairness key of each taken id
    v_taken_dues timestamptz[] := '{}';  -- the due time of each taken id
    v_level_at integer;              -- where this level's ids start in v_taken
    v_left     integer := p_limit;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN v_taken;
    END IF;
    SELECT c.after_key INTO v_cursor FROM tickler_fair_cursor AS c WHERE c.queue = p_queue;
    v_after := v_cursor;
    SELECT e.priority INTO v_level FROM tickler_fair_claimable AS e
    WHERE e.queue = p_queue ORDER BY e.priority DESC LIMIT 1;
    WHILE v_level IS NOT NULL AND v_left > 0 LOOP
        v_start := v_after; v_from := v_after; v_wrapped := v_after IS NULL;
        v_done := false; v_budget := false; v_looked := 0; v_seen := NULL; v_served := NULL;
        v_level_at := cardinality(v_taken) + 1;
        LOOP  -- walk a stretch of keys (as many with due events as the batch has room), serve it
            v_keys := '{}'; v_rooms := '{}';
            LOOP
                EXIT WHEN cardinality(v_keys) >= v_left;
                IF v_looked >= p_limit * 10 THEN
                    v_done := true; v_budget := true;
                    EXIT;
                END IF;
                -- One statement walks on from v_from (after the wrap: up to the start key): one
                -- probe per key, the next key's first entry, which is its earliest claimable event;
                -- until it found as many keys with a due event as wanted, or spent the look budget.
                -- ('' is the least key; in COLLATE "C", k > f is k >= f || chr(1): one index bound.)
                v_want := v_left - cardinality(v_keys);
                v_hi := CASE WHEN v_wrapped THEN v_start END;
                WITH RECURSIVE w (key, first, looked, due) AS (
                    (SELECT e.fairness_key, e.schedule_on, 1, (e.schedule_on <= p_now)::integer
                     FROM tickler_fair_claimable AS e
                     WHERE e.queue = p_queue AND e.priority = v_level
                       AND e.fairness_key >= CASE WHEN v_from IS NULL THEN '' ELSE v_from || chr(1) END
                     ORDER BY e.fairness_key, e.schedule_on, e.id LIMIT 1)
                    UNION ALL
                    SELECT n.fairness_key, n.schedule_on, w.looked + 1, w.due + (n.schedule_on <= p_now)::integer
                    FROM w CROSS JOIN LATERAL (
                        SELECT e.fairness_key, e.schedule_on FROM tickler_fair_claimable AS e
                        WHERE e.queue = p_queue AND e.priority = v_level AND e.fairness_key > w.key
                        ORDER BY e.fairness_key, e.schedule_on, e.id LIMIT 1
                    ) AS n
                    WHERE w.due < v_want AND w.looked < p_limit * 10 - v_looked AND (v_hi IS NULL OR w.key < v_hi)
                )
                SELECT array_agg(w.key ORDER BY w.looked), array_agg(w.first ORDER BY w.looked), max(w.due)
                INTO v_walked, v_firsts, v_found
                FROM w WHERE v_hi IS NULL OR w.key <= v_hi;
                FOR i IN 1..coalesce(cardinality(v_walked), 0) LOOP
                    v_key := v_walked[i];
                    v_from := v_key; v_seen := v_key; v_looked := v_looked + 1;
                    IF v_firsts[i] <= p_now THEN
                        v_room := CASE WHEN p_cap IS NULL THEN p_limit
                                       ELSE p_cap - tickler_fair_live_leases(p_queue, v_key, p_now) END;
                        IF v_room > 0 THEN
                            v_keys := v_keys || v_key; v_rooms := v_rooms || v_room;
                        END IF;
                    END IF;
                END LOOP;
                CONTINUE WHEN coalesce(v_found, 0) >= v_want;  -- found what it wanted: walk on if needed
                CONTINUE WHEN v_looked >= p_limit * 10;         -- the budget: the next turn says so
                -- The walk ran out of keys (or, after the wrap, reached the start key): wrap once.
                IF v_wrapped THEN
                    v_done := true;
                    EXIT;
                END IF;
                v_wrapped := true; v_from := NULL;
            END LOOP;
            -- Passes over the stretch: each key an equal share of what is left (at most its room);
            -- the keys that gave their whole share may have more, and share what is then left.
            WHILE cardinality(v_keys) > 0 AND v_left > 0 LOOP
                v_quota := ceil(v_left::numeric / cardinality(v_keys))::integer;
                SELECT array_agg(x.id ORDER BY x.round, x.pos), array_agg(x.pos::integer ORDER BY x.round, x.pos),
                       array_agg(x.key ORDER BY x.round, x.pos), array_agg(x.schedule_on ORDER BY x.round, x.pos)
                INTO v_ids, v_pos, v_id_keys, v_id_dues
                FROM (
                    SELECT c.id, c.schedule_on, k.pos, k.key,
                           row_number() OVER (PARTITION BY k.pos ORDER BY c.schedule_on, c.id) AS round
                    FROM unnest(v_keys, v_rooms) WITH ORDINALITY AS k (key, room, pos)
                    CROSS JOIN LATERAL (
                        SELECT e.id, e.schedule_on FROM tickler_fair_claimable AS e
                        WHERE e.queue = p_queue AND e.priority = v_level AND e.fairness_key = k.key
                          AND e.schedule_on <= p_now
                          AND e.id <> ALL (v_taken)  -- an earlier pass's (ours: not skipped as locked)
                        ORDER BY e.schedule_on, e.id
                        LIMIT least(k.room, v_quota)
                        FOR UPDATE OF e SKIP LOCKED
                    ) AS c
                    ORDER BY round, pos
                    LIMIT v_left
                ) AS x;
                EXIT WHEN v_ids IS NULL;
                v_taken := v_taken || v_ids;
                v_taken_keys := v_taken_keys || v_id_keys;
                v_taken_dues := v_taken_dues || v_id_dues;
                v_left := v_left - cardinality(v_ids);
                v_served := v_keys[v_pos[cardinality(v_pos)]];
                EXIT WHEN v_left <= 0;
                -- the next pass: keys that gave their whole share and have room left
                SELECT coalesce(array_agg(k.key ORDER BY k.pos), '{}'), coalesce(array_agg(k.room - n.n ORDER BY k.pos), '{}')
                INTO v_keys, v_rooms
                FROM unnest(v_keys, v_rooms) WITH ORDINALITY AS k (key, room, pos)
                CROSS JOIN LATERAL (SELECT count(*)::integer AS n FROM unnest(v_pos) AS p (pos) WHERE p.pos = k.pos) AS n
                WHERE n.n = least(k.room, v_quota) AND k.room > n.n;
            END LOOP;
            EXIT WHEN v_done OR v_left <= 0;
        END LOOP;
        -- The level's hand-out order, round robin over all its passes and stretches: a pass or a
        -- stretch that found fewer keys than it wanted (another claim held their events) gave some
        -- keys more than one event, so round r of a key may come after round r + 1 of another; and
        -- an event another claim held during one pass may be taken in a later one, after the key's
        -- later events. Round r of every key it served comes before round r + 1, each key in the
        -- order first served, and a key's round r is its r-th event in due order.
        IF cardinality(v_taken) >= v_level_at THEN
            SELECT v_taken[1:v_level_at - 1] || array_agg(t.id ORDER BY t.round, t.first),
                   v_taken_keys[1:v_level_at - 1] || array_agg(t.key ORDER BY t.round, t.first),
                   v_taken_dues[1:v_level_at - 1] || array_agg(t.due ORDER BY t.round, t.first)
            INTO v_taken, v_taken_keys, v_taken_dues
            FROM (
                SELECT u.id, u.key, u.due,
                       row_number() OVER (PARTITION BY u.key ORDER BY u.due, u.id) AS round,
                       min(u.at) OVER (PARTITION BY u.key) AS first
                FROM unnest(v_taken[v_level_at:], v_taken_keys[v_level_at:], v_taken_dues[v_level_at:])
                     WITH ORDINALITY AS u (id, key, due, at)
            ) AS t;
        END IF;
        -- the next claim goes on after the last key served, or (when the look budget ran out)
        -- after the last key looked at
        IF v_budget AND v_seen IS NOT NULL THEN
            v_after := v_seen;
        ELSIF v_served IS NOT NULL THEN
            v_after := v_served;
        END IF;
        SELECT e.priority INTO v_level FROM tickler_fair_claimable AS e
        WHERE e.queue = p_queue AND e.priority < v_level ORDER BY e.priority DESC LIMIT 1;
        IF NOT FOUND THEN
            v_level := NULL;
        END IF;
    END LOOP;
    IF v_after IS DISTINCT FROM v_cursor THEN
        IF v_cursor IS NULL THEN
            INSERT INTO tickler_fair_cursor AS c (queue, after_key) VALUES (p_queue, v_after)
            ON CONFLICT (queue) DO NOTHING;
        ELSE
            -- a concurrent claim moving the cursor right now: its hint is as good as ours
            UPDATE tickler_fair_cursor AS c SET after_key = v_after
            WHERE c.queue = p_queue
              AND c.queue = (SELECT l.queue FROM tickler_fair_cursor AS l WHERE l.queue = p_queue
                             FOR UPDATE SKIP LOCKED);
        END IF;
    END IF;
    RETURN v_taken;
END
$$;

-- The live leases of fairness key p_key in a queue at p_now (a group's lease counts once), from
-- the lease table: what max_in_flight_per_key caps. The fair pick counts them only through this
-- function, and says "unleased" only through the view tickler_fair_claimable (e.lease_id IS NULL
-- on the row, which the pick locks anyway).
CREATE OR REPLACE FUNCTION tickler_fair_live_leases(p_queue text, p_key text, p_now timestamptz)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(DISTINCT l.lease_id)::integer FROM tickler_lease AS l
    WHERE l.queue = p_queue AND l.fairness_key = p_key AND l.expires_on > p_now
$$;

-- A new lease id: 48 bits of Unix time in milliseconds, then gen_random_uuid()'s bits, with the
-- version nibble set to 7 (the variant bits stay those of version 4, RFC 9562's "10"): the layout
-- of RFC 9562's version 7. Time first, so that new ids go to the right end of the lease table's
-- primary key (lease_id, event_id): the pages of ended leases empty out on the left for VACUUM to
-- recycle, and a page split writes only the new right page, not half a page in the middle of the
-- key. The other 74 bits are random (the operating system's source): a lease id stays
-- unguessable, which is what fences a stale ack (SPEC §4). Nothing reads the time back out: to a
-- client a lease id is an opaque uuid.
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

-- The details of a `claimed` entry: lease id, attempt, the lease's expiry as the claim set it
-- (lease_expires_at), and the group key of a group's claim. A claim writes no timeline row: its
-- entry is built from the event row while the lease runs, and from the `claim` that the entry
-- ending the lease carries (tickler_with_claim, tickler_timeline_entry).
CREATE OR REPLACE FUNCTION tickler_claim_details(lease_id uuid, attempt integer, lease_expires_on timestamptz, group_key text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('lease_id', lease_id, 'attempt', attempt, 'lease_expires_at', lease_expires_on)
           || CASE WHEN group_key IS NULL THEN '{}' ELSE jsonb_build_object('group_key', group_key) END
$$;

-- A lease-ending entry's details with the claim it ends under "claim", which the readers
-- (tickler_timeline_entry, the pipeline's report) show as the `claimed` entry before it. Only what
-- the row does not say already, and times as seconds (exact to the microsecond): the claim's time
-- before the row's `at` (ago), the lease it took (lease_seconds), and its attempt, lease id, actor
-- and schedule when they differ from the row's. No claimed_expires_on (a claim whose `claimed`
-- entry is a timeline row of its own): the details as they are.
CREATE OR REPLACE FUNCTION tickler_with_claim(
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

-- A TRUNCATE of the events (tests, a reset) empties the leases too.
CREATE OR REPLACE FUNCTION tickler_keep_leases_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE tickler_lease;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tickler_keep_leases_truncated AFTER TRUNCATE ON tickler_event
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_keep_leases_truncated();

-- The events a fair claim may take: open, UNLEASED, ungrouped. The partial indexes
-- tickler_event_claimable_priority and tickler_event_claimable_fair hold the open, ungrouped
-- events, so every read through this view uses them and tests "unleased" on the row. The only
-- place where the fair pick says "unleased".
CREATE OR REPLACE VIEW tickler_fair_claimable AS
SELECT * FROM tickler_event AS e
WHERE e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL;
