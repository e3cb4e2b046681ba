-- One path writes events: tickler_schedule() inserts, replaces or debounces a set of events of
-- one queue, writes their timeline entries and keeps the wake-up handshake (tickler_queue.next_wake)
-- — for the API's single call, its batch and the importer alike. Before it, five statements
-- repeated these steps, and a miss in one copy would only have shown up as a lost wake-up.
--
-- p_events: a JSON array of {"ord", "item_key", "group_key"?, "schedule_on"?, "delay_seconds"?,
--   "data", "max_attempts"?}, keys distinct, already checked by scheduler/rules.py; `ord` is the
--   caller's number for the item and comes back with its result.
-- p_on_conflict, when an open event has the key:
--   reject / ignore  it is left alone (outcome 'conflict', with its id);
--   replace          unless in flight, it takes the new schedule_on, data, group_key and
--                    max_attempts (outcome 'replaced', timeline 'replaced');
--   debounce         unless in flight, it takes the new data, group_key and schedule_on — never
--                    later than its enqueued_on + p_debounce_max_seconds when that is given
--                    (outcome 'debounced', timeline 'debounced' with the previous time).
--   An open event under a live lease: outcome 'in_flight' (replace, debounce).
-- p_now: the time to act at (NULL: the database clock). p_with_events: also return the rows.
-- Results: one row per item, in the order given: ord, item_key, outcome ('created', 'replaced',
-- 'debounced', 'conflict', 'in_flight'), id (the written or the conflicting event), event.
-- A time as tickler's answers spell it: RFC 3339 in UTC with "Z", microseconds only when present.
CREATE FUNCTION tickler_rfc3339(at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN date_part('microseconds', at)::bigint % 1000000 <> 0
                THEN to_char(at AT TIME ZONE 'UTC', '.US') ELSE '' END
        || 'Z'
$$;

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
    r_outcome text[];  r_id bigint[];  -- results, by position
    s_pos integer[];  s_ids bigint[];  s_earliest timestamptz;  s_previous timestamptz[];  s_leased boolean[];
    -- the unleased open events to change, and what they take
    u_ids bigint[];  u_group text[];  u_data jsonb[];  u_when timestamptz[];  u_attempts integer[];
    u_previous timestamptz[];
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
           array_agg(coalesce(x.data, '{}')), array_agg(x.max_attempts)
    INTO a_ord, a_key, a_group, a_when, a_data, a_attempts
    FROM jsonb_to_recordset(p_events) AS x(
        ord bigint, item_key text, group_key text, schedule_on timestamptz, delay_seconds double precision,
        data jsonb, max_attempts integer);
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
                        version = e.version + 1
                    FROM unnest($4::bigint[], $5::text[], $6::jsonb[], $7::timestamptz[], $8::integer[],
                                $9::timestamptz[]) AS t(id, group_key, data, asked, max_attempts, previous)
                    WHERE e.id = t.id
                    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.max_attempts, t.previous
                ),
                logged AS (
                    INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
                    SELECT c.queue, c.item_key, c.id, $10, $11, $12, c.schedule_on,
                           jsonb_strip_nulls(jsonb_build_object(
                               'group_key', c.group_key, 'max_attempts', c.max_attempts,
                               'previous_schedule_on', CASE WHEN $1 = 'debounce' THEN tickler_rfc3339(c.previous) END))
                    FROM changed AS c
                )
                SELECT min(c.schedule_on) FROM changed AS c
            $q$ INTO s_earliest
            USING p_on_conflict, p_debounce_max_seconds, v_attempts, u_ids, u_group, u_data, u_when, u_attempts,
                  u_previous, v_now, v_written, p_actor;
            v_earliest := least(v_earliest, s_earliest);
        END IF;

        -- Insert where the key is free (for replace and debounce: where no open event was found).
        WITH inserted AS (
            INSERT INTO tickler_event AS e
                (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts)
            SELECT p_queue, i.item_key, i.group_key, i.schedule_on, i.data, v_now, p_actor,
                   coalesce(i.max_attempts, v_attempts)
            FROM unnest(a_key, a_group, a_when, a_data, a_attempts, r_outcome)
                 AS i(item_key, group_key, schedule_on, data, max_attempts, settled)
            WHERE i.settled IS NULL
            ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
            RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.enqueued_on, e.enqueued_by,
                      e.max_attempts
        ),
        logged AS (
            INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
            SELECT n.queue, n.item_key, n.id, n.enqueued_on, 'enqueued', n.enqueued_by, n.schedule_on,
                   jsonb_strip_nulls(jsonb_build_object('group_key', n.group_key, 'max_attempts', n.max_attempts))
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
