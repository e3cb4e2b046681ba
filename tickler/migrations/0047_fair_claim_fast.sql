-- Fair share at the speed of the plain claim (issue #22's targets).
--
-- A queue with fair_share and no cap (no max_in_flight_per_key, max_in_flight or rate) is claimed
-- without the queue's flow lock, in one autocommit statement like the plain claim
-- (claim_events_round_robin in scheduler/queries.sql): its cursor is a hint, not a limit. A capped
-- queue keeps the lock (claim_events_fair). Both call tickler_fair_pick(), made cheaper here:
--
--   * one index probe per key: the next key's first claimable entry in
--     tickler_event_claimable_fair (queue, priority, fairness_key, schedule_on, id) is that key's
--     earliest event, so the probe that finds the key also tells whether it has a due event;
--   * the keys of a level are served in passes: each key gets an equal share of what the batch
--     has left (at most its room under a cap); keys that gave their whole share may have more and
--     share what is still left. So one key holding nearly every due event gets the whole batch in
--     one range read, and a level is left for a lower one only when it has nothing more to give;
--   * the cursor is moved only when it changed, and a claim that finds it being moved by a
--     concurrent claim leaves it to that claim (SKIP LOCKED): without the lock, two claims that
--     start together start from the same key; SKIP LOCKED hands each of them other events.
--
-- For the lease-table port, two tests live in one place each:
--   * "unleased" (a claimable event): the view tickler_fair_claimable below;
--   * "live leases of key K" (max_in_flight_per_key): the function tickler_fair_live_leases below.

-- The events a fair claim may take: open, UNLEASED, ungrouped. The same predicate as the partial
-- indexes tickler_event_claimable_priority and tickler_event_claimable_fair (migration 0045), so
-- that every read through this view uses them. The only place where the fair pick says "unleased".
CREATE VIEW tickler_fair_claimable AS
SELECT * FROM tickler_event AS e
WHERE e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL;

-- The LIVE LEASES OF KEY p_key in a queue at p_now (a group's lease once), on the small index of
-- leased rows tickler_event_leased_fair. The only place where the fair pick counts them.
CREATE FUNCTION tickler_fair_live_leases(p_queue text, p_key text, p_now timestamptz)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(DISTINCT l.lease_id)::integer FROM tickler_event AS l
    WHERE l.fairness_key = p_key AND l.queue = p_queue AND l.dequeued_on IS NULL
      AND l.lease_id IS NOT NULL AND l.lease_expires_on > p_now
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
    v_taken    bigint[] := '{}';
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
                SELECT array_agg(x.id ORDER BY x.round, x.pos), array_agg(x.pos::integer ORDER BY x.round, x.pos)
                INTO v_ids, v_pos
                FROM (
                    SELECT c.id, k.pos, row_number() OVER (PARTITION BY k.pos ORDER BY c.schedule_on, c.id) AS round
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
