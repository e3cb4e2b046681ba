-- Writing events: tickler_schedule_events() and its jsonb form tickler_schedule(), the lock and
-- wake-up of the statements that change one event, and the check that a group's open events share
-- one fairness key.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- The ids of the open events of these keys of a queue, each looked up by itself in the open-key
-- index (tickler_event_open_key, unique): a plan that no statistics can turn into a read of the
-- queue's open events filtered by the key list (`item_key = ANY(keys)` may take
-- tickler_event_open_schedule that way when the table grew since its last ANALYZE). OFFSET 0
-- keeps the subquery a probe per key, never merged into a join of the queue (LIMIT 1 did too,
-- but costs a filtered scan as stopping at its first match). One case no wording fixes: before
-- a table's first ANALYZE its partial indexes count 0 rows, both indexes cost the same, and the
-- probe may take tickler_event_open_schedule (30,000 entries read per key: 2 s for a batch of
-- 1,000); the statistics jobs analyze such a table within seconds (store/statistics.py).
CREATE OR REPLACE FUNCTION tickler_schedule_key_ids(p_queue text, p_keys text[]) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
SELECT array_agg(o.id)
FROM unnest(p_keys) AS k(key)
CROSS JOIN LATERAL (
    SELECT e.id FROM tickler_event AS e WHERE e.queue = p_queue AND e.item_key = k.key AND e.dequeued_on IS NULL
    OFFSET 0
) AS o
$$;

-- The one path that writes events: tickler_schedule_events() inserts, replaces or debounces a set
-- of events of one queue — one event or ten thousand, under every on_conflict, with or without
-- groups and trace contexts — writes their timeline entries and keeps the wake-up handshake
-- (tickler_queue.next_wake), for the API's single call, its group commits, its batches, the
-- recurring schedules and the importer alike (the last two through tickler_schedule(), its jsonb
-- form), so that no copy of these steps can miss one (a miss would only show as a lost wake-up).
--
-- The items are arrays aligned by position (1..n), each field one typed array (the application
-- sends them as binary arrays): item_key (distinct, already checked by scheduler/rules.py),
-- group_key, schedule_on, delay_seconds (schedule_on NULL: now + delay_seconds, or now), data,
-- max_attempts, priority, fairness_key, traceparent, tracestate (NULL: not given).
-- p_on_conflict, when an open event has the key:
--   reject / ignore  it is left alone (outcome 'conflict', with its id);
--   replace          unless in flight, it takes the new schedule_on, data, group_key,
--                    max_attempts, priority and fairness_key, the defaults for those not given
--                    (outcome 'replaced', timeline 'replaced');
--   debounce         unless in flight, it takes the new data, group_key and schedule_on — never
--                    later than its enqueued_on + p_debounce_max_seconds when that is given — and
--                    keeps what is not given (outcome 'debounced', timeline 'debounced' with the
--                    previous time).
--   An open event under a live lease: outcome 'in_flight' (replace, debounce); a lease whose time
--   is up is ended first (tickler_end_expired_leases), and its event is then changed as the
--   pending event it is (or, when that was its last attempt, the key is free).
-- An event written keeps its item's trace context when one is given (SPEC §11).
-- p_now: the time to act at (NULL: the database clock). p_with_events: also return the rows (the
-- event written, or the open event that holds the key).
-- Results: one row per item, in the order given: ord (its position, from 0), item_key, outcome ('created',
-- 'replaced', 'debounced', 'conflict', 'in_flight'), id (the written or the conflicting event), event.
CREATE OR REPLACE FUNCTION tickler_schedule_events(
    p_queue text,
    p_actor text,
    p_on_conflict text,
    p_now timestamptz,
    p_debounce_max_seconds double precision,
    p_with_events boolean,
    a_key text[],
    a_group text[],
    a_schedule_on timestamptz[],
    a_delay double precision[],
    a_data jsonb[],
    a_attempts integer[],
    a_priority smallint[],
    a_fairness text[],
    a_traceparent text[],
    a_tracestate text[]
) RETURNS TABLE (ord integer, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
-- Every statement reads the items by position (zipped unnest) or looks keys up one by one
-- (tickler_schedule_key_ids): no statement joins two lists of items, whose sizes the planner
-- cannot know (a nested loop over two 10,000-item lists is quadratic).
DECLARE
    v_now        timestamptz := coalesce(p_now, now());
    v_n          integer := coalesce(cardinality(a_key), 0);
    v_changing   boolean := p_on_conflict IN ('replace', 'debounce');
    v_written    text := CASE p_on_conflict WHEN 'debounce' THEN 'debounced' ELSE 'replaced' END;
    v_attempts   integer;      -- the queue's default max_attempts
    v_next_wake  timestamptz;  -- when the queue's sleeping dispatchers look next
    v_earliest   timestamptz;  -- the earliest schedule_on written
    v_round      integer := 0;
    v_position   jsonb;        -- item_key -> position (more than one item)
    v_left       text[];       -- keys not settled yet
    v_grouped_fairness boolean;  -- a grouped event of the queue has had a fairness key
    v_checked    boolean;      -- the INSERT's groups agree on their fairness keys (see there)
    s_keys       text[];       -- the keys inserted, in the order of their rows
    r_outcome text[];  r_id bigint[];  r_event tickler_event[];  -- results, by position
    s_pos integer[];  s_ids bigint[];  s_earliest timestamptz;  s_previous timestamptz[];  s_leased boolean[];
    s_expired bigint[];  s_events tickler_event[];
    -- the unleased open events to change, and what they take
    u_pos integer[];  u_ids bigint[];  u_group text[];  u_data jsonb[];  u_when timestamptz[];  u_attempts integer[];
    u_previous timestamptz[];  u_priority smallint[];  u_fairness text[];  u_parent text[];  u_state text[];
    p integer;
BEGIN
    IF p_on_conflict IS NULL OR p_on_conflict NOT IN ('reject', 'ignore', 'replace', 'debounce') THEN
        RAISE EXCEPTION 'tickler_schedule: unknown on_conflict %', p_on_conflict;
    END IF;
    -- FOR KEY SHARE, held to commit, whether or not we notify: a dispatcher that wants to sleep
    -- locks the row FOR UPDATE first, so either it waits for our commit and then sees our events,
    -- or it has committed its next_wake before we read it here (see tickler_queue.next_wake).
    SELECT q.max_attempts, q.next_wake, q.grouped_fairness INTO v_attempts, v_next_wake, v_grouped_fairness
    FROM tickler_queue AS q WHERE q.name = p_queue FOR KEY SHARE;
    IF NOT FOUND THEN  -- deleted since the caller read it: the API answers 404 (api/problems.py)
        RAISE EXCEPTION 'tickler_schedule: no queue %', p_queue
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'tickler_event_queue';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF v_n > 1 AND v_changing THEN
        SELECT jsonb_object_agg(k.key, k.n) INTO v_position FROM unnest(a_key) WITH ORDINALITY AS k(key, n);
    END IF;
    r_outcome := array_fill(NULL::text, ARRAY[v_n]);
    r_id := array_fill(NULL::bigint, ARRAY[v_n]);
    IF p_with_events THEN
        r_event := array_fill(NULL::tickler_event, ARRAY[v_n]);
    END IF;
    v_left := a_key;

    WHILE v_left IS NOT NULL LOOP
        v_round := v_round + 1;
        IF v_round > 5 THEN  -- keys that keep finishing and reopening under our feet
            RAISE EXCEPTION 'tickler_schedule: keys kept changing state' USING ERRCODE = 'serialization_failure';
        END IF;

        IF v_changing THEN
            -- Lock the open events of these keys: FOR UPDATE waits for a concurrent writer and
            -- returns the row as it committed, so `previous` is the time this change replaces.
            -- Through the key's index, one probe per key. A lease counts until it is ended.
            IF v_n = 1 THEN
                SELECT array_agg(1), array_agg(c.id), array_agg(c.schedule_on), array_agg(c.leased),
                       array_agg(c.id) FILTER (WHERE c.expired), array_agg(c.e)
                INTO s_pos, s_ids, s_previous, s_leased, s_expired, s_events
                FROM (
                    SELECT e.id, e.schedule_on, (e.lease_id IS NOT NULL) AS leased,
                           (e.lease_id IS NOT NULL AND e.lease_expires_on <= v_now) AS expired,
                           CASE WHEN p_with_events THEN e END AS e
                    FROM tickler_event AS e
                    WHERE e.queue = p_queue AND e.item_key = a_key[1] AND e.dequeued_on IS NULL
                    FOR UPDATE OF e
                ) AS c;
            ELSE
                -- The keys' open events by tickler_schedule_key_ids() (one probe of the key's
                -- index each), locked in the order of their ids.
                s_ids := tickler_schedule_key_ids(p_queue, v_left);
                EXECUTE $q$
                    SELECT array_agg(($3 ->> c.item_key)::integer), array_agg(c.id), array_agg(c.schedule_on),
                           array_agg(c.leased), array_agg(c.id) FILTER (WHERE c.expired), array_agg(c.e)
                    FROM (
                        SELECT e.item_key, e.id, e.schedule_on, (e.lease_id IS NOT NULL) AS leased,
                               (e.lease_id IS NOT NULL AND e.lease_expires_on <= $4) AS expired,
                               CASE WHEN $5 THEN e END AS e
                        FROM tickler_event AS e
                        WHERE e.id = ANY($2) AND e.dequeued_on IS NULL
                        ORDER BY e.id
                        FOR UPDATE OF e
                    ) AS c
                $q$ INTO s_pos, s_ids, s_previous, s_leased, s_expired, s_events
                USING p_queue, s_ids, v_position, v_now, p_with_events;
            END IF;
            IF s_expired IS NOT NULL THEN
                -- Leases whose time is up end first (their events stay locked by us); the next
                -- round sees those events as they are then.
                PERFORM tickler_end_expired_leases(s_expired, 'tickler', v_now);
                CONTINUE;
            END IF;
            u_pos := '{}'; u_ids := '{}'; u_group := '{}'; u_data := '{}'; u_when := '{}'; u_attempts := '{}'; u_previous := '{}';
            u_priority := '{}'; u_fairness := '{}'; u_parent := '{}'; u_state := '{}';
            FOR i IN 1..coalesce(cardinality(s_pos), 0) LOOP
                p := s_pos[i];
                r_outcome[p] := CASE WHEN s_leased[i] THEN 'in_flight' ELSE v_written END;
                r_id[p] := s_ids[i];
                IF s_leased[i] THEN
                    IF p_with_events THEN
                        r_event[p] := s_events[i];
                    END IF;
                ELSE
                    u_pos := u_pos || p;
                    u_ids := u_ids || s_ids[i];
                    u_group := u_group || a_group[p];
                    u_data := u_data || coalesce(a_data[p], '{}');
                    u_when := u_when || coalesce(a_schedule_on[p], v_now + make_interval(secs => coalesce(a_delay[p], 0)));
                    u_attempts := u_attempts || a_attempts[p];
                    u_previous := u_previous || s_previous[i];
                    u_priority := u_priority || a_priority[p];
                    u_fairness := u_fairness || a_fairness[p];
                    u_parent := u_parent || a_traceparent[p];
                    u_state := u_state || a_tracestate[p];
                END IF;
            END LOOP;

            IF cardinality(u_ids) = 1 THEN
                -- One event: the same statement, static (its plan kept), by its primary key.
                WITH changed AS (
                    UPDATE tickler_event AS e
                    SET group_key = t.group_key,
                        data = t.data,
                        schedule_on = CASE
                            WHEN p_on_conflict = 'debounce' AND p_debounce_max_seconds IS NOT NULL
                            THEN least(t.asked, e.enqueued_on + make_interval(secs => p_debounce_max_seconds))
                            ELSE t.asked END,
                        max_attempts = CASE
                            WHEN p_on_conflict = 'replace' THEN coalesce(t.max_attempts, v_attempts)
                            ELSE coalesce(t.max_attempts, e.max_attempts) END,
                        -- replace: what the request says, or the default; debounce: what it says, or kept
                        priority = CASE
                            WHEN p_on_conflict = 'replace' THEN coalesce(t.priority, 0)
                            ELSE coalesce(t.priority, e.priority) END,
                        fairness_key = CASE
                            WHEN p_on_conflict = 'replace' THEN coalesce(t.fairness_key, '')
                            ELSE coalesce(t.fairness_key, e.fairness_key) END,
                        -- a trace context given is kept; none given leaves the event's
                        traceparent = coalesce(t.traceparent, e.traceparent),
                        tracestate = CASE WHEN t.traceparent IS NOT NULL THEN t.tracestate ELSE e.tracestate END,
                        version = e.version + 1, changed_on = v_now
                    FROM unnest(u_ids, u_group, u_data, u_when, u_attempts,
                                u_previous, u_priority, u_fairness, u_parent, u_state,
                                u_pos)
                         AS t(id, group_key, data, asked, max_attempts, previous, priority, fairness_key,
                              traceparent, tracestate, pos)
                    WHERE e.id = u_ids[1] AND e.id = t.id
                    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.max_attempts, t.previous,
                              e.priority, e.fairness_key, t.pos, CASE WHEN p_with_events THEN e END AS ev
                ),
                logged AS (
                    SELECT tickler_timeline_write(array_agg(ROW(
                               c.queue, c.item_key, c.id, v_now, v_written, p_actor, c.schedule_on,
                               jsonb_strip_nulls(jsonb_build_object(
                                   'group_key', c.group_key, 'max_attempts', c.max_attempts,
                                   'priority', nullif(c.priority, 0), 'fairness_key', nullif(c.fairness_key, ''),
                                   'previous_schedule_on',
                                   CASE WHEN p_on_conflict = 'debounce' THEN tickler_rfc3339(c.previous) END))
                           )::tickler_timeline_row)) AS written
                    FROM changed AS c
                )
                SELECT min(c.schedule_on), array_agg(c.pos), array_agg(c.ev) INTO s_earliest, s_pos, s_events
                FROM changed AS c CROSS JOIN logged AS l;
            ELSIF cardinality(u_ids) > 1 THEN
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
                            -- a trace context given is kept; none given leaves the event's
                            traceparent = coalesce(t.traceparent, e.traceparent),
                            tracestate = CASE WHEN t.traceparent IS NOT NULL THEN t.tracestate ELSE e.tracestate END,
                            version = e.version + 1, changed_on = $10
                        FROM unnest($4::bigint[], $5::text[], $6::jsonb[], $7::timestamptz[], $8::integer[],
                                    $9::timestamptz[], $13::smallint[], $14::text[], $15::text[], $16::text[],
                                    $18::integer[])
                             AS t(id, group_key, data, asked, max_attempts, previous, priority, fairness_key,
                                  traceparent, tracestate, pos)
                        WHERE e.id = t.id AND e.id = ANY($4::bigint[])  -- primary-key lookups, whatever the join
                        RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.max_attempts, t.previous,
                                  e.priority, e.fairness_key, t.pos, CASE WHEN $17 THEN e END AS ev
                    ),
                    logged AS (
                        SELECT tickler_timeline_write(array_agg(ROW(
                                   c.queue, c.item_key, c.id, $10, $11, $12, c.schedule_on,
                                   jsonb_strip_nulls(jsonb_build_object(
                                       'group_key', c.group_key, 'max_attempts', c.max_attempts,
                                       'priority', nullif(c.priority, 0), 'fairness_key', nullif(c.fairness_key, ''),
                                       'previous_schedule_on',
                                       CASE WHEN $1 = 'debounce' THEN tickler_rfc3339(c.previous) END))
                               )::tickler_timeline_row)) AS written
                        FROM changed AS c
                    )
                    SELECT min(c.schedule_on), array_agg(c.pos), array_agg(c.ev)
                    FROM changed AS c CROSS JOIN logged AS l
                $q$ INTO s_earliest, s_pos, s_events
                USING p_on_conflict, p_debounce_max_seconds, v_attempts, u_ids, u_group, u_data, u_when, u_attempts,
                      u_previous, v_now, v_written, p_actor, u_priority, u_fairness, u_parent, u_state, p_with_events,
                      u_pos;
            END IF;
            IF cardinality(u_ids) > 0 THEN
                v_earliest := least(v_earliest, s_earliest);
                IF p_with_events THEN
                    FOR i IN 1..cardinality(s_pos) LOOP
                        r_event[s_pos[i]] := s_events[i];
                    END LOOP;
                END IF;
            END IF;
            IF array_position(r_outcome, NULL) IS NULL THEN
                EXIT;  -- every key had its open event: nothing to insert
            END IF;
        END IF;

        -- The groups' one fairness key (tickler_check_group_fairness, BEFORE ROW) for the rows
        -- this INSERT may write, settled once for the statement instead of by the trigger's
        -- statement per grouped row (its probe of the group's first open event, a random read
        -- of the index and the heap, was what a grouped batch cost more than an ungrouped one):
        -- no grouped event of the queue ever had a key (tickler_queue.grouped_fairness) and no
        -- item has one, so no group can mix keys; or, for a batch, every item of a group asks
        -- one key and the group's first open event has it (or there is none), one probe per
        -- group. Only such a clean answer is taken: the trigger, told for this one statement
        -- (tickler.group_fairness_checked), then has nothing to refuse; otherwise it checks each
        -- row as ever and refuses what it refuses.
        v_checked := false;
        IF coalesce(cardinality(array_remove(a_group, NULL)), 0) > 0 THEN
            IF v_changing AND NOT v_grouped_fairness THEN  -- the changes above may have given a group a key
                SELECT q.grouped_fairness INTO v_grouped_fairness FROM tickler_queue AS q WHERE q.name = p_queue;
            END IF;
            IF NOT v_grouped_fairness AND coalesce(cardinality(array_remove(array_remove(a_fairness, NULL), '')), 0) = 0 THEN
                v_checked := true;
            ELSIF v_n > 1 THEN
                SELECT NOT EXISTS (
                    SELECT FROM (
                        SELECT i.group_key, min(coalesce(i.fairness_key, '')) AS fairness_key,
                               max(coalesce(i.fairness_key, '')) AS highest
                        FROM unnest(a_group, a_fairness, r_outcome) AS i(group_key, fairness_key, settled)
                        WHERE i.settled IS NULL AND i.group_key IS NOT NULL
                        GROUP BY i.group_key
                    ) AS b
                    LEFT JOIN LATERAL (  -- the trigger's probe: the group's range of tickler_event_open_group
                        SELECT e.fairness_key FROM tickler_event AS e
                        WHERE e.queue = p_queue AND e.group_key >= b.group_key AND e.group_key <= b.group_key
                          AND e.dequeued_on IS NULL
                        ORDER BY e.group_key, e.schedule_on, e.id
                        LIMIT 1
                    ) AS o ON true
                    WHERE b.fairness_key <> b.highest OR o.fairness_key <> b.fairness_key
                ) INTO v_checked;
                IF v_checked AND NOT v_grouped_fairness THEN  -- what the trigger, now told, would do
                    UPDATE tickler_queue AS q SET grouped_fairness = true WHERE q.name = p_queue AND NOT q.grouped_fairness;
                    v_grouped_fairness := true;
                END IF;
            END IF;
        END IF;
        IF v_checked THEN
            PERFORM set_config('tickler.group_fairness_checked', 'on', true);
        END IF;

        -- Insert where the key is free (for replace and debounce: where no open event was found),
        -- in the order given.
        WITH inserted AS (
            INSERT INTO tickler_event AS e
                (queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, max_attempts,
                 priority, fairness_key, traceparent, tracestate, changed_on)
            SELECT p_queue, i.item_key, i.group_key,
                   coalesce(i.schedule_on, v_now + make_interval(secs => coalesce(i.delay_seconds, 0))),
                   coalesce(i.data, '{}'), v_now, p_actor, coalesce(i.max_attempts, v_attempts),
                   coalesce(i.priority, 0), coalesce(i.fairness_key, ''), i.traceparent,
                   CASE WHEN i.traceparent IS NOT NULL THEN i.tracestate END, v_now
            FROM unnest(a_key, a_group, a_schedule_on, a_delay, a_data, a_attempts, r_outcome, a_priority, a_fairness,
                        a_traceparent, a_tracestate)
                 AS i(item_key, group_key, schedule_on, delay_seconds, data, max_attempts, settled, priority,
                      fairness_key, traceparent, tracestate)
            WHERE i.settled IS NULL
            ON CONFLICT (queue, item_key) WHERE dequeued_on IS NULL DO NOTHING
            RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.enqueued_on, e.enqueued_by,
                      e.max_attempts, e.priority, e.fairness_key, CASE WHEN p_with_events THEN e END AS ev
        ),
        logged AS (
            SELECT tickler_timeline_write(array_agg(ROW(
                       n.queue, n.item_key, n.id, n.enqueued_on, 'enqueued', n.enqueued_by, n.schedule_on,
                       jsonb_strip_nulls(jsonb_build_object('group_key', n.group_key, 'max_attempts', n.max_attempts,
                                                            'priority', nullif(n.priority, 0),
                                                            'fairness_key', nullif(n.fairness_key, '')))
                   )::tickler_timeline_row ORDER BY n.id)) AS written
            FROM inserted AS n
        )
        SELECT array_agg(n.item_key), array_agg(n.id), min(n.schedule_on), array_agg(n.ev)
        INTO s_keys, s_ids, s_earliest, s_events
        FROM inserted AS n CROSS JOIN logged AS l;
        IF v_checked THEN
            PERFORM set_config('tickler.group_fairness_checked', 'off', true);
        END IF;
        IF v_round = 1 AND s_keys = a_key THEN
            -- Every key was free (the first round inserts every item, in the order given): the
            -- items' results are the rows inserted, position by position.
            r_outcome := array_fill('created'::text, ARRAY[v_n]);
            r_id := s_ids;
            r_event := s_events;
            v_earliest := s_earliest;
            EXIT;
        END IF;
        IF v_n = 1 THEN
            s_pos := CASE WHEN s_keys IS NOT NULL THEN ARRAY[1] END;
        ELSE
            IF v_position IS NULL THEN
                SELECT jsonb_object_agg(k.key, k.n) INTO v_position FROM unnest(a_key) WITH ORDINALITY AS k(key, n);
            END IF;
            SELECT array_agg((v_position ->> k.key)::integer ORDER BY k.n) INTO s_pos
            FROM unnest(s_keys) WITH ORDINALITY AS k(key, n);
        END IF;
        FOR i IN 1..coalesce(cardinality(s_pos), 0) LOOP
            r_outcome[s_pos[i]] := 'created';
            r_id[s_pos[i]] := s_ids[i];
            IF p_with_events THEN
                r_event[s_pos[i]] := s_events[i];
            END IF;
        END LOOP;
        v_earliest := least(v_earliest, s_earliest);

        -- What is left had its key taken by an open event this round did not see. For reject and
        -- ignore, a fresh read names that event; for replace and debounce, the next round locks
        -- it. A key whose event finished meanwhile is free again: the next round inserts it.
        IF v_n = 1 THEN
            v_left := CASE WHEN r_outcome[1] IS NULL THEN a_key END;
        ELSE
            SELECT array_agg(t.key) INTO v_left FROM unnest(a_key, r_outcome) AS t(key, settled) WHERE t.settled IS NULL;
        END IF;
        IF v_left IS NOT NULL AND NOT v_changing THEN
            IF v_n = 1 THEN
                SELECT array_agg(1), array_agg(e.id), array_agg(CASE WHEN p_with_events THEN e END)
                INTO s_pos, s_ids, s_events
                FROM tickler_event AS e
                WHERE e.queue = p_queue AND e.item_key = a_key[1] AND e.dequeued_on IS NULL;
            ELSE
                s_ids := tickler_schedule_key_ids(p_queue, v_left);
                EXECUTE $q$
                    SELECT array_agg(($2 ->> e.item_key)::integer), array_agg(e.id), array_agg(CASE WHEN $3 THEN e END)
                    FROM tickler_event AS e
                    WHERE e.id = ANY($1) AND e.dequeued_on IS NULL
                $q$ INTO s_pos, s_ids, s_events USING s_ids, v_position, p_with_events;
            END IF;
            FOR i IN 1..coalesce(cardinality(s_pos), 0) LOOP
                r_outcome[s_pos[i]] := 'conflict';
                r_id[s_pos[i]] := s_ids[i];
                IF p_with_events THEN
                    r_event[s_pos[i]] := s_events[i];
                END IF;
            END LOOP;
            IF v_n = 1 THEN
                v_left := CASE WHEN r_outcome[1] IS NULL THEN a_key END;
            ELSE
                SELECT array_agg(t.key) INTO v_left
                FROM unnest(a_key, r_outcome) AS t(key, settled) WHERE t.settled IS NULL;
            END IF;
        END IF;
    END LOOP;

    -- One NOTIFY at most, and only when a sleeping dispatcher would wake too late for our events
    -- (NOTIFY serialises commits cluster-wide).
    IF v_next_wake > v_earliest THEN
        PERFORM pg_notify('tickler_wake', p_queue);
    END IF;

    IF p_with_events THEN
        RETURN QUERY
        SELECT (t.n - 1)::integer, t.key, t.outcome, t.id, r_event[t.n]  -- unnest would spread the rows' columns
        FROM unnest(a_key, r_outcome, r_id) WITH ORDINALITY AS t(key, outcome, id, n);
    ELSE
        RETURN QUERY
        SELECT (t.n - 1)::integer, t.key, t.outcome, t.id, NULL::tickler_event
        FROM unnest(a_key, r_outcome, r_id) WITH ORDINALITY AS t(key, outcome, id, n);
    END IF;
END
$$;

-- tickler_schedule_events() for callers that hold their items as one JSON array (the recurring
-- schedules and the importer): p_events, an array of {"ord", "item_key", "group_key"?,
-- "schedule_on"?, "delay_seconds"?, "data", "max_attempts"?, "priority"?, "fairness_key"?}, where
-- `ord` is the caller's number for the item and comes back with its result (with item_key).
CREATE OR REPLACE FUNCTION tickler_schedule(
    p_queue text,
    p_events jsonb,
    p_actor text,
    p_on_conflict text DEFAULT 'reject',
    p_now timestamptz DEFAULT NULL,
    p_debounce_max_seconds double precision DEFAULT NULL,
    p_with_events boolean DEFAULT false
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE sql AS $$
WITH item AS (
    -- one aggregate over one scan: the arrays are aligned by position
    SELECT array_agg(x.ord) AS ord, array_agg(x.item_key) AS item_key, array_agg(x.group_key) AS group_key,
           array_agg(x.schedule_on) AS schedule_on, array_agg(x.delay_seconds) AS delay_seconds,
           array_agg(x.data) AS data, array_agg(x.max_attempts) AS max_attempts, array_agg(x.priority) AS priority,
           array_agg(x.fairness_key) AS fairness_key
    FROM jsonb_to_recordset(p_events) AS x(
        ord bigint, item_key text, group_key text, schedule_on timestamptz, delay_seconds double precision,
        data jsonb, max_attempts integer, priority smallint, fairness_key text)
)
SELECT i.ord[r.ord + 1], r.item_key, r.outcome, r.id, r.event
FROM item AS i
CROSS JOIN LATERAL tickler_schedule_events(
    p_queue, p_actor, p_on_conflict, p_now, p_debounce_max_seconds, p_with_events, i.item_key, i.group_key,
    i.schedule_on, i.delay_seconds, i.data, i.max_attempts, i.priority, i.fairness_key, NULL, NULL) AS r
$$;

-- The previous release's entry points and steps of the write path, kept for its processes while
-- `tickler migrate` brings the database to this release (tests/test_schema.py): each hands its
-- items to tickler_schedule_events(), with the same results. Nothing of this release calls them;
-- the next release drops them.
CREATE OR REPLACE FUNCTION tickler_schedule_write(
    p_queue text, p_events jsonb, p_actor text, p_on_conflict text DEFAULT 'reject', p_now timestamptz DEFAULT NULL,
    p_debounce_max_seconds double precision DEFAULT NULL, p_with_events boolean DEFAULT false
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE sql AS $$
SELECT * FROM tickler_schedule(p_queue, p_events, p_actor, p_on_conflict, p_now, p_debounce_max_seconds, p_with_events)
$$;

CREATE OR REPLACE FUNCTION tickler_schedule_traced(
    p_queue text, p_events jsonb, p_actor text, p_on_conflict text, p_now timestamptz,
    p_debounce_max_seconds double precision, p_with_events boolean, p_traces jsonb
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE sql AS $$
WITH item AS (
    SELECT array_agg(x.ord) AS ord, array_agg(x.item_key) AS item_key, array_agg(x.group_key) AS group_key,
           array_agg(x.schedule_on) AS schedule_on, array_agg(x.delay_seconds) AS delay_seconds,
           array_agg(x.data) AS data, array_agg(x.max_attempts) AS max_attempts, array_agg(x.priority) AS priority,
           array_agg(x.fairness_key) AS fairness_key,
           array_agg(p_traces -> (x.n::integer - 1) ->> 'traceparent') AS traceparent,
           array_agg(p_traces -> (x.n::integer - 1) ->> 'tracestate') AS tracestate
    FROM ROWS FROM (jsonb_to_recordset(p_events) AS (
        ord bigint, item_key text, group_key text, schedule_on timestamptz, delay_seconds double precision,
        data jsonb, max_attempts integer, priority smallint, fairness_key text)) WITH ORDINALITY
        AS x(ord, item_key, group_key, schedule_on, delay_seconds, data, max_attempts, priority, fairness_key, n)
)
SELECT i.ord[r.ord + 1], r.item_key, r.outcome, r.id, r.event
FROM item AS i
CROSS JOIN LATERAL tickler_schedule_events(
    p_queue, p_actor, p_on_conflict, p_now, p_debounce_max_seconds, p_with_events, i.item_key, i.group_key,
    i.schedule_on, i.delay_seconds, i.data, i.max_attempts, i.priority, i.fairness_key, i.traceparent,
    i.tracestate) AS r
$$;

CREATE OR REPLACE FUNCTION tickler_schedule_items(
    p_queue text, p_actor text, p_on_conflict text, p_now timestamptz, p_debounce_max_seconds double precision,
    p_with_events boolean, p_attempts integer, p_next_wake timestamptz, a_ord bigint[], a_key text[],
    a_group text[], a_when timestamptz[], a_data jsonb[], a_attempts integer[], a_priority smallint[],
    a_fairness text[]
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE sql AS $$
SELECT a_ord[r.ord + 1], r.item_key, r.outcome, r.id, r.event
FROM tickler_schedule_events(p_queue, p_actor, p_on_conflict, p_now, p_debounce_max_seconds, p_with_events, a_key,
                             a_group, a_when, NULL, a_data, a_attempts, a_priority, a_fairness, NULL, NULL) AS r
$$;

CREATE OR REPLACE FUNCTION tickler_schedule_staged(
    p_queue text, p_actor text, p_on_conflict text DEFAULT 'reject', p_now timestamptz DEFAULT NULL,
    p_debounce_max_seconds double precision DEFAULT NULL, p_with_events boolean DEFAULT false
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    a_ord bigint[];  a_key text[];  a_group text[];  a_when timestamptz[];  a_delay double precision[];
    a_data jsonb[];  a_attempts integer[];  a_priority smallint[];  a_fairness text[];
BEGIN
    SELECT array_agg(x.ord), array_agg(x.item_key), array_agg(x.group_key), array_agg(x.schedule_on),
           array_agg(x.delay_seconds), array_agg(x.data), array_agg(x.max_attempts::integer),
           array_agg(x.priority::smallint), array_agg(x.fairness_key)
    INTO a_ord, a_key, a_group, a_when, a_delay, a_data, a_attempts, a_priority, a_fairness
    FROM (SELECT * FROM pg_temp.tickler_schedule_stage AS s ORDER BY s.ord) AS x;
    RETURN QUERY
    SELECT a_ord[r.ord + 1], r.item_key, r.outcome, r.id, r.event
    FROM tickler_schedule_events(p_queue, p_actor, p_on_conflict, p_now, p_debounce_max_seconds, p_with_events,
                                 a_key, a_group, a_when, a_delay, a_data, a_attempts, a_priority, a_fairness,
                                 NULL, NULL) AS r;
END
$$;

CREATE OR REPLACE FUNCTION tickler_schedule_stage_open() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('pg_temp.tickler_schedule_stage') IS NULL THEN
        CREATE TEMPORARY TABLE tickler_schedule_stage (
            ord bigint, item_key text, group_key text, schedule_on timestamptz, delay_seconds double precision,
            data jsonb, max_attempts text, priority text, fairness_key text
        ) ON COMMIT DELETE ROWS;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION tickler_schedule_end_expired(p_queue text, p_keys text[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tickler_end_expired_leases(ARRAY(
        SELECT e.id FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.item_key = ANY(p_keys) AND e.dequeued_on IS NULL
          AND e.lease_id IS NOT NULL AND e.lease_expires_on <= p_now
        ORDER BY e.id
        FOR UPDATE OF e), 'tickler', p_now);
END
$$;

-- The open event of a key, locked for a change in this transaction; a lease of it whose time is
-- up is ended first (reschedule, update and cancel by key then change it as the pending event it is).
CREATE OR REPLACE FUNCTION tickler_lock_open_event(p_queue text, p_item_key text, p_now timestamptz)
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

-- Why a change by key (tickler_change_event, tickler_cancel_event) of the open event a key has,
-- locked by tickler_lock_open_event(), is refused, if it is: 'not_found' (no open event),
-- 'in_flight' (under a live lease: one that ran out was ended), 'stale_version' (p_if_match
-- names other versions). The one home of that rule.
CREATE OR REPLACE FUNCTION tickler_change_refused(p_open tickler_event, p_if_match integer[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN p_open.id IS NULL THEN 'not_found'
            WHEN p_open.lease_id IS NOT NULL THEN 'in_flight'
            WHEN NOT p_open.version = ANY(coalesce(p_if_match, ARRAY[p_open.version])) THEN 'stale_version'
       END
$$;

-- The wake-up handshake of a statement that makes one event due at `p_due` (a reschedule, a
-- retry), in one place instead of a pair of CTEs in each statement. The rule of the write path
-- (tickler_schedule_events): FOR KEY SHARE on the queue row, held to commit whether or not we
-- notify — a dispatcher that wants to sleep locks the row FOR UPDATE first, so either it waits for
-- our commit and then sees the event, or it committed its next_wake before we read it here; and
-- one NOTIFY only when a sleeping dispatcher would wake too late for the event (NOTIFY serialises
-- commits). Returns whether it notified.
CREATE OR REPLACE FUNCTION tickler_wake_if_sooner(p_queue text, p_due timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_next_wake timestamptz;
BEGIN
    SELECT q.next_wake INTO v_next_wake FROM tickler_queue AS q WHERE q.name = p_queue FOR KEY SHARE;
    IF v_next_wake > p_due THEN
        PERFORM pg_notify('tickler_wake', p_queue);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- A group's one fairness key, checked per written row of a group: a group is claimed as one
-- unit, under one lease, which counts once against its key, so a write that would mix keys in a
-- group is refused (the API answers 400 naming fairness_key). One other open event of the group
-- tells its key: they all share it (this check keeps them so).
-- The lookup is a plain statement, planned once per session (an EXECUTE planned it for every row
-- written: two thirds of the time of a grouped batch), written so that every plan of it, generic
-- or not, reads the group's own range of tickler_event_open_group: the group as a range and the
-- order of that index leave tickler_event_claimable_group (queue, schedule_on, id) — which serves
-- any read of a queue's open grouped events, and which a generic plan of `group_key = $2 ...
-- LIMIT 1` may take — only a sort of the whole queue's grouped events, never the cheaper plan (a
-- scan of them per row written would take minutes at 30,000 grouped events).
-- A BEFORE ROW trigger, not part of the statement triggers of event_triggers.sql: its WHEN keeps
-- it from running for ungrouped events, and it refuses a row before it is written, seeing the
-- rows the same statement wrote before it (also for an INSERT ... ON CONFLICT DO NOTHING whose
-- row is then not inserted); a check after the statement would answer otherwise.
CREATE OR REPLACE FUNCTION tickler_check_group_fairness() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
BEGIN
    IF NEW.fairness_key <> '' THEN
        -- once per queue (a no-op after): its groups may now hold keys (tickler_schedule_events)
        UPDATE tickler_queue AS q SET grouped_fairness = true WHERE q.name = NEW.queue AND NOT q.grouped_fairness;
    END IF;
    SELECT e.fairness_key INTO v_key
    FROM tickler_event AS e
    WHERE e.queue = NEW.queue AND e.group_key >= NEW.group_key AND e.group_key <= NEW.group_key
      AND e.dequeued_on IS NULL AND e.id <> NEW.id
    ORDER BY e.group_key, e.schedule_on, e.id
    LIMIT 1;
    IF v_key IS NOT NULL AND v_key <> NEW.fairness_key THEN
        RAISE EXCEPTION 'the open events of group % have another fairness_key', NEW.group_key
            USING ERRCODE = 'check_violation', CONSTRAINT = 'tickler_event_group_fairness';
    END IF;
    RETURN NEW;
END
$$;

-- tickler.group_fairness_checked: on for the one statement of tickler_schedule_events() whose
-- rows it checked all at once (set and reset around that statement, transaction-local, undone
-- with it when it fails); its test is an expression of the WHEN, so a checked row costs no call.
CREATE OR REPLACE TRIGGER tickler_event_group_fairness
    BEFORE INSERT OR UPDATE OF group_key, fairness_key ON tickler_event
    FOR EACH ROW WHEN (NEW.group_key IS NOT NULL AND NEW.dequeued_on IS NULL
                       AND current_setting('tickler.group_fairness_checked', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION tickler_check_group_fairness();

-- Change the open event of a key (PATCH): move it and/or change its data, group, priority or
-- fairness key; each p_set_* says whether its field is given (a NULL group_key or fairness_key
-- removes it). The changes of one event by key are decided here, as tickler_schedule() decides a
-- replace, so that "in flight, refuse" and the timeline's details have one home.
-- `refused`, with the event as it is: 'not_found' (no open event; a lease that ran out on the
-- last attempt may have just ended it, and that stays), 'in_flight' (under a live lease),
-- 'stale_version' (p_if_match names other versions). NULL: changed, or nothing to change (no write).
-- The entry is 'rescheduled' (with previous_schedule_on) when the time moves, else 'updated'; its
-- details name the fields changed, the previous group, priority and fairness key when they
-- changed, the priority and fairness key the claims now order by when not the defaults, and
-- p_reason when given (a recurring schedule's update of its waiting occurrence).
CREATE OR REPLACE FUNCTION tickler_change_event(
    p_queue text, p_item_key text, p_actor text, p_reason text, p_now timestamptz, p_if_match integer[],
    p_schedule_on timestamptz, p_delay_seconds double precision,
    p_set_data boolean, p_data jsonb, p_set_group_key boolean, p_group_key text,
    p_set_priority boolean, p_priority smallint, p_set_fairness_key boolean, p_fairness_key text)
RETURNS TABLE (refused text, event tickler_event)
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_old      tickler_event;
    v_new      tickler_event;
    v_changed  text[] := '{}';
    v_details  jsonb;
BEGIN
    SELECT * INTO v_old FROM tickler_lock_open_event(p_queue, p_item_key, v_now);
    refused := tickler_change_refused(v_old, p_if_match);
    IF refused IS NOT NULL THEN
        RETURN QUERY SELECT refused, CASE WHEN v_old.id IS NOT NULL THEN v_old END;
        RETURN;
    END IF;
    v_new := v_old;
    IF p_delay_seconds IS NOT NULL THEN
        v_new.schedule_on := v_now + make_interval(secs => p_delay_seconds);
    ELSIF p_schedule_on IS NOT NULL THEN
        v_new.schedule_on := p_schedule_on;
    END IF;
    IF p_set_data THEN v_new.data := p_data; END IF;
    IF p_set_group_key THEN v_new.group_key := p_group_key; END IF;
    IF p_set_priority THEN v_new.priority := p_priority; END IF;
    IF p_set_fairness_key THEN v_new.fairness_key := coalesce(p_fairness_key, ''); END IF;

    IF v_new.schedule_on IS DISTINCT FROM v_old.schedule_on THEN v_changed := v_changed || 'schedule_on'::text; END IF;
    IF v_new.data IS DISTINCT FROM v_old.data THEN v_changed := v_changed || 'data'::text; END IF;
    IF v_new.group_key IS DISTINCT FROM v_old.group_key THEN v_changed := v_changed || 'group_key'::text; END IF;
    IF v_new.priority IS DISTINCT FROM v_old.priority THEN v_changed := v_changed || 'priority'::text; END IF;
    IF v_new.fairness_key IS DISTINCT FROM v_old.fairness_key THEN v_changed := v_changed || 'fairness_key'::text; END IF;
    IF cardinality(v_changed) = 0 THEN
        event := v_old;
        RETURN NEXT;
        RETURN;
    END IF;

    v_details := jsonb_strip_nulls(jsonb_build_object('changed', to_jsonb(v_changed), 'reason', p_reason));
    IF 'schedule_on' = ANY(v_changed) THEN
        v_details := v_details || jsonb_build_object('previous_schedule_on', tickler_rfc3339(v_old.schedule_on));
    END IF;
    IF 'group_key' = ANY(v_changed) THEN
        v_details := v_details || jsonb_build_object('previous_group_key', v_old.group_key);
    END IF;
    IF v_new.priority <> 0 THEN
        v_details := v_details || jsonb_build_object('priority', v_new.priority);
    END IF;
    IF v_new.fairness_key <> '' THEN
        v_details := v_details || jsonb_build_object('fairness_key', v_new.fairness_key);
    END IF;
    IF 'priority' = ANY(v_changed) THEN
        v_details := v_details || jsonb_build_object('previous_priority', v_old.priority);
    END IF;
    IF 'fairness_key' = ANY(v_changed) THEN
        v_details := v_details || jsonb_build_object('previous_fairness_key', nullif(v_old.fairness_key, ''));
    END IF;

    UPDATE tickler_event AS e
    SET schedule_on = v_new.schedule_on, data = v_new.data, group_key = v_new.group_key,
        priority = v_new.priority, fairness_key = v_new.fairness_key, version = e.version + 1,
        changed_on = v_now
    WHERE e.id = v_old.id
    RETURNING e.* INTO v_new;
    PERFORM tickler_timeline_write(ARRAY[ROW(
        v_new.queue, v_new.item_key, v_new.id, v_now,
        CASE WHEN 'schedule_on' = ANY(v_changed) THEN 'rescheduled' ELSE 'updated' END,
        p_actor, v_new.schedule_on, v_details)::tickler_timeline_row]);
    PERFORM tickler_wake_if_sooner(v_new.queue, v_new.schedule_on);
    event := v_new;
    RETURN NEXT;
END
$$;

-- Cancel the open event of a key; refused as tickler_change_event() refuses.
CREATE OR REPLACE FUNCTION tickler_cancel_event(
    p_queue text, p_item_key text, p_actor text, p_reason text, p_now timestamptz, p_if_match integer[])
RETURNS TABLE (refused text, event tickler_event)
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, now());
    v_old  tickler_event;
    v_new  tickler_event;
BEGIN
    SELECT * INTO v_old FROM tickler_lock_open_event(p_queue, p_item_key, v_now);
    refused := tickler_change_refused(v_old, p_if_match);
    IF refused IS NOT NULL THEN
        RETURN QUERY SELECT refused, CASE WHEN v_old.id IS NOT NULL THEN v_old END;
        RETURN;
    END IF;
    UPDATE tickler_event AS e
    SET dequeued_on = v_now, dequeued_by = p_actor, outcome = 'cancelled', version = e.version + 1, changed_on = v_now
    WHERE e.id = v_old.id
    RETURNING e.* INTO v_new;
    PERFORM tickler_timeline_write(ARRAY[ROW(
        v_new.queue, v_new.item_key, v_new.id, v_new.dequeued_on, 'cancelled', v_new.dequeued_by,
        v_new.schedule_on, jsonb_strip_nulls(jsonb_build_object('reason', p_reason)))::tickler_timeline_row]);
    event := v_new;
    RETURN NEXT;
END
$$;

