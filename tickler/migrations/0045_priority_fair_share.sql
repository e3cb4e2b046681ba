-- Priority and fair share (SPEC §10).
--
--   tickler_event.priority      -100..100, default 0: claims take higher priority first, then the
--                               earlier due time (strict within ungrouped events; see claim_events).
--   tickler_event.fairness_key  '' when none (the API shows null): with the queue's fair_share on,
--                               a claim hands out due events of equal priority round robin across
--                               keys (tickler_fair_pick below); max_in_flight_per_key caps the
--                               live leases of each key, cluster-wide, under the queue's flow lock.
--   tickler_queue.fair_share, tickler_queue.max_in_flight_per_key: the queue settings.
--
-- Both event tables get the two columns, in the same order (a finish moves whole rows), and the
-- view of both is made again so that it has them.

LOCK TABLE tickler_queue, tickler_event, tickler_event_history IN ACCESS EXCLUSIVE MODE;

ALTER TABLE tickler_queue
    ADD COLUMN fair_share boolean NOT NULL DEFAULT false,
    ADD COLUMN max_in_flight_per_key integer CHECK (max_in_flight_per_key >= 1);

-- Constant defaults: no table rewrite, whatever the size of either table.
ALTER TABLE tickler_event
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CONSTRAINT priority_range CHECK (priority BETWEEN -100 AND 100),
    ADD COLUMN fairness_key text COLLATE "C" NOT NULL DEFAULT ''
        CONSTRAINT fairness_key_syntax CHECK (char_length(fairness_key) <= 255 AND strpos(fairness_key, '/') = 0);
ALTER TABLE tickler_event_history
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN fairness_key text COLLATE "C" NOT NULL DEFAULT '';

CREATE OR REPLACE VIEW tickler_event_all AS
SELECT * FROM tickler_event
UNION ALL
SELECT * FROM tickler_event_history;

-- The claimable ungrouped events by priority, then due time: a claim reads each priority level
-- that exists (found by a skip scan: one probe per level) from its first due event on, and stops
-- once it has its batch — never stepping over future events or lower levels it does not need.
CREATE INDEX tickler_event_claimable_priority
    ON tickler_event (queue, priority, schedule_on, id)
    WHERE dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NULL;

-- The same rows by fairness key within a level: a fair claim finds the next key with a due event
-- in one probe, and a key's first due events in one range.
CREATE INDEX tickler_event_claimable_fair
    ON tickler_event (queue, priority, fairness_key, schedule_on, id)
    WHERE dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NULL;

-- Live leases by fairness key (leased rows only: small): max_in_flight_per_key. The key leads,
-- so that this index is no candidate for the counts of a whole queue's leases (flow_room, the
-- gauges), which keep the lease-expiry indexes.
CREATE INDEX tickler_event_leased_fair
    ON tickler_event (fairness_key, queue) INCLUDE (lease_id, lease_expires_on)
    WHERE dequeued_on IS NULL AND lease_id IS NOT NULL;

-- The events of a group share one fairness key (a group is claimed as one unit, under one lease,
-- and that lease counts once against its key). A write that would mix keys in a group is
-- refused; the API answers 400 naming fairness_key.
CREATE FUNCTION tickler_check_group_fairness() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM tickler_event AS e
        WHERE e.queue = NEW.queue AND e.group_key = NEW.group_key AND e.dequeued_on IS NULL
          AND e.id <> NEW.id AND e.fairness_key <> NEW.fairness_key
    ) THEN
        RAISE EXCEPTION 'the open events of group % have another fairness_key', NEW.group_key
            USING ERRCODE = 'check_violation', CONSTRAINT = 'tickler_event_group_fairness';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER tickler_event_group_fairness
    BEFORE INSERT OR UPDATE OF group_key, fairness_key ON tickler_event
    FOR EACH ROW WHEN (NEW.group_key IS NOT NULL AND NEW.dequeued_on IS NULL)
    EXECUTE FUNCTION tickler_check_group_fairness();

-- Where the round robin of a fair queue goes on: the last fairness key a claim served.
CREATE TABLE tickler_fair_cursor (
    queue      text PRIMARY KEY REFERENCES tickler_queue (name) ON DELETE CASCADE,
    after_key  text COLLATE "C" NOT NULL
);

-- The ids a fair claim of a queue takes (at most p_limit), locked, in the order handed out: each
-- priority level from the highest; within a level, the keys with a due event from the one after
-- the cursor on (wrapping around once), one event per key per round, rounds until the batch is
-- full. With p_cap, a key gets at most its room (p_cap less its live leases; none when full).
-- Called only under the queue's flow lock (one claimer of the queue at a time, cluster-wide), so
-- the cursor and the per-key room are never read by two claims at once.
CREATE FUNCTION tickler_fair_pick(p_queue text, p_now timestamptz, p_limit integer, p_cap integer)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    v_after    text;                 -- the cursor (NULL: start from the first key)
    v_level    smallint;
    v_from     text;                 -- the last key looked at in this level (NULL: none yet)
    v_wrapped  boolean;
    v_key      text;
    v_live     integer;
    v_keys     text[];
    v_room     integer[];
    v_ids      bigint[];
    v_last     text;
    v_taken    bigint[] := '{}';
    v_left     integer := p_limit;
    v_looked   integer;              -- keys looked at in this level
    v_seen     text;                 -- the last of them
BEGIN
    SELECT c.after_key INTO v_after FROM tickler_fair_cursor AS c WHERE c.queue = p_queue;
    SELECT e.priority INTO v_level FROM tickler_event AS e
    WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
    ORDER BY e.priority DESC LIMIT 1;
    WHILE v_level IS NOT NULL AND v_left > 0 LOOP
        v_keys := '{}'; v_room := '{}';
        v_from := v_after; v_wrapped := v_after IS NULL; v_looked := 0; v_seen := NULL;
        LOOP
            EXIT WHEN cardinality(v_keys) >= v_left;
            EXIT WHEN v_looked >= p_limit * 10;  -- a bounded claim: the next one goes on from here
            -- The next key with claimable events at this level, then whether one of them is due:
            -- two index probes per key, whatever number of future events each key holds.
            v_key := NULL;
            IF v_from IS NULL THEN
                SELECT e.fairness_key INTO v_key FROM tickler_event AS e
                WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
                  AND e.priority = v_level
                ORDER BY e.fairness_key LIMIT 1;
            ELSE
                SELECT e.fairness_key INTO v_key FROM tickler_event AS e
                WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
                  AND e.priority = v_level AND e.fairness_key > v_from
                ORDER BY e.fairness_key LIMIT 1;
            END IF;
            IF v_key IS NULL THEN           -- past the last key: once more from the first
                EXIT WHEN v_wrapped;
                v_wrapped := true; v_from := NULL;
                CONTINUE;
            END IF;
            EXIT WHEN v_wrapped AND v_after IS NOT NULL AND v_key > v_after;  -- every key seen once
            v_from := v_key;
            v_looked := v_looked + 1;
            v_seen := v_key;
            IF NOT EXISTS (
                SELECT 1 FROM tickler_event AS e
                WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
                  AND e.priority = v_level AND e.fairness_key = v_key AND e.schedule_on <= p_now
            ) THEN
                CONTINUE;
            ELSIF p_cap IS NULL THEN
                v_keys := v_keys || v_key; v_room := v_room || v_left;
            ELSE
                SELECT count(DISTINCT l.lease_id) INTO v_live FROM tickler_event AS l
                WHERE l.queue = p_queue AND l.fairness_key = v_key AND l.dequeued_on IS NULL
                  AND l.lease_id IS NOT NULL AND l.lease_expires_on > p_now;
                IF v_live < p_cap THEN
                    v_keys := v_keys || v_key; v_room := v_room || (p_cap - v_live);
                END IF;
            END IF;
            EXIT WHEN v_wrapped AND v_key = v_after;
        END LOOP;
        v_ids := NULL;
        IF cardinality(v_keys) > 0 THEN
            -- round r hands out every key's r-th due event, keys in cursor order
            SELECT array_agg(x.id ORDER BY x.round, x.pos), (array_agg(x.key ORDER BY x.round DESC, x.pos DESC))[1]
            INTO v_ids, v_last
            FROM (
                SELECT c.id, k.pos, k.key,
                       row_number() OVER (PARTITION BY k.pos ORDER BY c.schedule_on, c.id) AS round
                FROM unnest(v_keys, v_room) WITH ORDINALITY AS k (key, room, pos)
                CROSS JOIN LATERAL (
                    SELECT e.id, e.schedule_on FROM tickler_event AS e
                    WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
                      AND e.priority = v_level AND e.fairness_key = k.key AND e.schedule_on <= p_now
                    ORDER BY e.schedule_on, e.id
                    LIMIT least(k.room, ceil(v_left::numeric / cardinality(v_keys))::integer)
                    FOR UPDATE OF e SKIP LOCKED
                ) AS c
                ORDER BY round, pos
                LIMIT v_left
            ) AS x;
            IF v_ids IS NOT NULL THEN
                v_taken := v_taken || v_ids;
                v_left := v_left - cardinality(v_ids);
            END IF;
        END IF;
        -- the next claim goes on after the last key served, or (when the look budget ran out
        -- before the batch filled) after the last key looked at
        IF v_looked >= p_limit * 10 AND v_seen IS NOT NULL THEN
            v_after := v_seen;
        ELSIF v_ids IS NOT NULL AND cardinality(v_keys) > 0 THEN
            v_after := v_last;
        END IF;
        SELECT e.priority INTO v_level FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NULL
          AND e.priority < v_level
        ORDER BY e.priority DESC LIMIT 1;
        IF NOT FOUND THEN
            v_level := NULL;
        END IF;
    END LOOP;
    IF v_after IS NOT NULL THEN
        INSERT INTO tickler_fair_cursor AS c (queue, after_key) VALUES (p_queue, v_after)
        ON CONFLICT (queue) DO UPDATE SET after_key = excluded.after_key
        WHERE c.after_key IS DISTINCT FROM excluded.after_key;
    END IF;
    RETURN v_taken;
END
$$;


-- The one write path of events (tickler_schedule_write, 0008 and 0014) with priority and
-- fairness_key: read from each item, written on insert, replace (given or the default) and
-- debounce (given or kept), and shown in the `enqueued` / `replaced` / `debounced` details when
-- not the default.
CREATE OR REPLACE FUNCTION tickler_schedule_write(
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
-- The items live in arrays, by position (1..n), and every statement reads them by position
-- (zipped unnest) or looks keys up with `= ANY(keys)`: no statement joins two lists of items,
-- whose sizes the planner cannot know (a nested loop over two 10,000-item lists is quadratic).
-- The statements that look keys up run through EXECUTE, planned for the keys at hand.
DECLARE
    v_now        timestamptz := coalesce(p_now, now());
    v_changing   boolean := p_on_conflict IN ('replace', 'debounce');
    v_written    text := CASE p_on_conflict WHEN 'debounce' THEN 'debounced' ELSE 'replaced' END;
    v_attempts   integer;      -- the queue's default max_attempts
    v_next_wake  timestamptz;  -- when the queue's sleeping dispatchers look next
    v_earliest   timestamptz;  -- the earliest schedule_on written
    v_round      integer := 0;
    v_position   jsonb;        -- item_key -> position
    v_left       text[];       -- keys not settled yet
    a_ord bigint[];  a_key text[];  a_group text[];  a_when timestamptz[];  a_data jsonb[];  a_attempts integer[];
    a_priority smallint[];  a_fairness text[];  -- SPEC §10 (NULL: not given)
    r_outcome text[];  r_id bigint[];  -- results, by position
    s_pos integer[];  s_ids bigint[];  s_earliest timestamptz;  s_previous timestamptz[];  s_leased boolean[];
    -- the unleased open events to change, and what they take
    u_ids bigint[];  u_group text[];  u_data jsonb[];  u_when timestamptz[];  u_attempts integer[];
    u_previous timestamptz[];  u_priority smallint[];  u_fairness text[];
BEGIN
    IF p_on_conflict NOT IN ('reject', 'ignore', 'replace', 'debounce') THEN
        RAISE EXCEPTION 'tickler_schedule: unknown on_conflict %', p_on_conflict;
    END IF;
    -- FOR KEY SHARE, held to commit, whether or not we notify: a dispatcher that wants to sleep
    -- locks the row FOR UPDATE first, so either it waits for our commit and then sees our events,
    -- or it has committed its next_wake before we read it here (see tickler_queue.next_wake).
    SELECT q.max_attempts, q.next_wake INTO v_attempts, v_next_wake
    FROM tickler_queue AS q WHERE q.name = p_queue FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tickler_schedule: no queue %', p_queue USING ERRCODE = 'foreign_key_violation';
    END IF;

    -- One aggregate over one scan: the arrays are aligned by position.
    SELECT array_agg(x.ord), array_agg(x.item_key), array_agg(x.group_key),
           array_agg(coalesce(x.schedule_on, v_now + make_interval(secs => coalesce(x.delay_seconds, 0)))),
           array_agg(coalesce(x.data, '{}')), array_agg(x.max_attempts),
           array_agg(x.priority), array_agg(x.fairness_key)
    INTO a_ord, a_key, a_group, a_when, a_data, a_attempts, a_priority, a_fairness
    FROM jsonb_to_recordset(p_events) AS x(
        ord bigint, item_key text, group_key text, schedule_on timestamptz, delay_seconds double precision,
        data jsonb, max_attempts integer, priority smallint, fairness_key text);
    IF a_key IS NULL THEN
        RETURN;
    END IF;
    SELECT jsonb_object_agg(k.key, k.n) INTO v_position FROM unnest(a_key) WITH ORDINALITY AS k(key, n);
    r_outcome := array_fill(NULL::text, ARRAY[cardinality(a_key)]);
    r_id := array_fill(NULL::bigint, ARRAY[cardinality(a_key)]);
    v_left := a_key;

    WHILE v_left IS NOT NULL LOOP
        v_round := v_round + 1;
        IF v_round > 5 THEN  -- keys that keep finishing and reopening under our feet
            RAISE EXCEPTION 'tickler_schedule: keys kept changing state' USING ERRCODE = 'serialization_failure';
        END IF;

        IF v_changing THEN
            -- Lock the open events of these keys: FOR UPDATE waits for a concurrent writer and
            -- returns the row as it committed, so `previous` is the time this change replaces.
            -- A lease counts until it is ended (the caller ends expired ones first). EXECUTE: a
            -- plan for these very keys (a cached generic plan may filter the queue's rows by the
            -- key list instead of probing the index with it: quadratic for large batches).
            EXECUTE $q$
                SELECT array_agg(($3 ->> c.item_key)::integer), array_agg(c.id), array_agg(c.schedule_on),
                       array_agg(c.leased)
                FROM (
                    SELECT e.item_key, e.id, e.schedule_on, (e.lease_id IS NOT NULL) AS leased
                    FROM tickler_event AS e
                    WHERE e.queue = $1 AND e.item_key = ANY($2) AND e.dequeued_on IS NULL
                    ORDER BY e.id
                    FOR UPDATE OF e
                ) AS c
            $q$ INTO s_pos, s_ids, s_previous, s_leased USING p_queue, v_left, v_position;
            u_ids := '{}'; u_group := '{}'; u_data := '{}'; u_when := '{}'; u_attempts := '{}'; u_previous := '{}';
            u_priority := '{}'; u_fairness := '{}';
            FOR i IN 1..coalesce(cardinality(s_pos), 0) LOOP
                r_outcome[s_pos[i]] := CASE WHEN s_leased[i] THEN 'in_flight' ELSE v_written END;
                r_id[s_pos[i]] := s_ids[i];
                IF NOT s_leased[i] THEN
                    u_ids := u_ids || s_ids[i];
                    u_group := u_group || a_group[s_pos[i]];
                    u_data := u_data || a_data[s_pos[i]];
                    u_when := u_when || a_when[s_pos[i]];
                    u_attempts := u_attempts || a_attempts[s_pos[i]];
                    u_previous := u_previous || s_previous[i];
                    u_priority := u_priority || a_priority[s_pos[i]];
                    u_fairness := u_fairness || a_fairness[s_pos[i]];
                END IF;
            END LOOP;

            EXECUTE $q$
                WITH changed AS (
                    UPDATE tickler_event AS e
                    SET group_key = t.group_key,
                        data = t.data,
                        schedule_on = CASE
                            WHEN $1 = 'debounce' AND $2 IS NOT NULL
                            THEN least(t.asked, e.enqueued_on + make_interval(secs => $2))
                            ELSE t.asked END,
                        max_attempts = CASE
                            WHEN $1 = 'replace' THEN coalesce(t.max_attempts, $3)
                            ELSE coalesce(t.max_attempts, e.max_attempts) END,
                        -- replace: what the request says, or the default; debounce: what it says, or kept
                        priority = CASE
                            WHEN $1 = 'replace' THEN coalesce(t.priority, 0)
                            ELSE coalesce(t.priority, e.priority) END,
                        fairness_key = CASE
                            WHEN $1 = 'replace' THEN coalesce(t.fairness_key, '')
                            ELSE coalesce(t.fairness_key, e.fairness_key) END,
                        version = e.version + 1
                    FROM unnest($4::bigint[], $5::text[], $6::jsonb[], $7::timestamptz[], $8::integer[],
                                $9::timestamptz[], $13::smallint[], $14::text[])
                         AS t(id, group_key, data, asked, max_attempts, previous, priority, fairness_key)
                    WHERE e.id = t.id
                    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.max_attempts, t.previous,
                              e.priority, e.fairness_key
                ),
                logged AS (
                    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
                    SELECT c.queue, c.item_key, c.id, $10, $11, $12, c.schedule_on,
                           jsonb_strip_nulls(jsonb_build_object(
                               'group_key', c.group_key, 'max_attempts', c.max_attempts,
                               'priority', nullif(c.priority, 0), 'fairness_key', nullif(c.fairness_key, ''),
                               'previous_schedule_on', CASE WHEN $1 = 'debounce' THEN tickler_rfc3339(c.previous) END))
                    FROM changed AS c
                )
                SELECT min(c.schedule_on) FROM changed AS c
            $q$ INTO s_earliest
            USING p_on_conflict, p_debounce_max_seconds, v_attempts, u_ids, u_group, u_data, u_when, u_attempts,
                  u_previous, v_now, v_written, p_actor, u_priority, u_fairness;
            v_earliest := least(v_earliest, s_earliest);
        END IF;

        -- Insert where the key is free (for replace and debounce: where no open event was found).
        WITH inserted AS (
            INSERT INTO tickler_event AS e
                (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts,
                 priority, fairness_key)
            SELECT p_queue, i.item_key, i.group_key, i.schedule_on, i.data, v_now, p_actor,
                   coalesce(i.max_attempts, v_attempts), coalesce(i.priority, 0), coalesce(i.fairness_key, '')
            FROM unnest(a_key, a_group, a_when, a_data, a_attempts, r_outcome, a_priority, a_fairness)
                 AS i(item_key, group_key, schedule_on, data, max_attempts, settled, priority, fairness_key)
            WHERE i.settled IS NULL
            ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
            RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.enqueued_on, e.enqueued_by,
                      e.max_attempts, e.priority, e.fairness_key
        ),
        logged AS (
            INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
            SELECT n.queue, n.item_key, n.id, n.enqueued_on, 'enqueued', n.enqueued_by, n.schedule_on,
                   jsonb_strip_nulls(jsonb_build_object('group_key', n.group_key, 'max_attempts', n.max_attempts,
                                                        'priority', nullif(n.priority, 0),
                                                        'fairness_key', nullif(n.fairness_key, '')))
            FROM inserted AS n
        )
        SELECT array_agg((v_position ->> n.item_key)::integer), array_agg(n.id), min(n.schedule_on)
        INTO s_pos, s_ids, s_earliest
        FROM inserted AS n;
        FOR i IN 1..coalesce(cardinality(s_pos), 0) LOOP
            r_outcome[s_pos[i]] := 'created';
            r_id[s_pos[i]] := s_ids[i];
        END LOOP;
        v_earliest := least(v_earliest, s_earliest);

        -- What is left had its key taken by an open event this round did not see. For reject and
        -- ignore, a fresh read names that event; for replace and debounce, the next round locks
        -- it. A key whose event finished meanwhile is free again: the next round inserts it.
        SELECT array_agg(t.key) INTO v_left FROM unnest(a_key, r_outcome) AS t(key, settled) WHERE t.settled IS NULL;
        IF v_left IS NOT NULL AND NOT v_changing THEN
            EXECUTE $q$
                SELECT array_agg(($3 ->> e.item_key)::integer), array_agg(e.id)
                FROM tickler_event AS e
                WHERE e.queue = $1 AND e.item_key = ANY($2) AND e.dequeued_on IS NULL
            $q$ INTO s_pos, s_ids USING p_queue, v_left, v_position;
            FOR i IN 1..coalesce(cardinality(s_pos), 0) LOOP
                r_outcome[s_pos[i]] := 'conflict';
                r_id[s_pos[i]] := s_ids[i];
            END LOOP;
            SELECT array_agg(t.key) INTO v_left
            FROM unnest(a_key, r_outcome) AS t(key, settled) WHERE t.settled IS NULL;
        END IF;
    END LOOP;

    -- One NOTIFY at most, and only when a sleeping dispatcher would wake too late for our events
    -- (NOTIFY serialises commits cluster-wide).
    IF v_next_wake > v_earliest THEN
        PERFORM pg_notify('tickler_wake', p_queue);
    END IF;

    IF p_with_events THEN
        RETURN QUERY
        SELECT t.ord, t.key, t.outcome, t.id, (SELECT e FROM tickler_event AS e WHERE e.id = t.id)
        FROM unnest(a_ord, a_key, r_outcome, r_id) AS t(ord, key, outcome, id);
    ELSE
        RETURN QUERY
        SELECT t.ord, t.key, t.outcome, t.id, NULL::tickler_event
        FROM unnest(a_ord, a_key, r_outcome, r_id) AS t(ord, key, outcome, id);
    END IF;
END
$$;
