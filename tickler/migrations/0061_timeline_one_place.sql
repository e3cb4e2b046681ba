-- The timeline written in one place (issue #21): tickler_timeline_write() is the only statement
-- that inserts into tickler_timeline. Every writer — the statements of scheduler/*.sql and the
-- functions below — builds its entries in its own statement and hands them over in one array,
-- one call per statement (never per row), in the order the entries are to be numbered.
--
-- A LANGUAGE sql function: its one INSERT ... SELECT FROM unnest() is what the writers' own
-- INSERT ... SELECT was, so the rows, their ids, the statement triggers on tickler_timeline (the
-- dashboard's per-minute rollup, 0012) and the WAL are the same. STRICT: a statement with nothing
-- to log (array_agg over no rows is NULL) does not run the INSERT at all.
--
-- A caller's CTE `logged AS (SELECT tickler_timeline_write(array_agg(...)) FROM changed ...)` is
-- a plain SELECT, which PostgreSQL runs only when read: the statement's result reads it (CROSS
-- JOIN logged: one row, the aggregate's), and it is read whenever the statement changed a row.

CREATE TYPE tickler_timeline_row AS (
    queue        text,
    item_key     text COLLATE "C",
    event_id     bigint,
    at           timestamptz,
    action       text,
    actor        text,
    schedule_on  timestamptz,
    details      jsonb
);

COMMENT ON TYPE tickler_timeline_row IS
    'One timeline entry to write: the columns of tickler_timeline that its writers give (see tickler_timeline_write).';

CREATE FUNCTION tickler_timeline_write(p_entries tickler_timeline_row[]) RETURNS void
LANGUAGE sql STRICT VOLATILE AS $$
INSERT INTO tickler_timeline (queue, item_key, event_id, at, action, actor, schedule_on, details)
SELECT t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details
FROM unnest(p_entries) AS t
$$;

COMMENT ON FUNCTION tickler_timeline_write(tickler_timeline_row[]) IS
    'The one writer of tickler_timeline: inserts these entries, in array order (NULL: nothing).';


-- The ending of expired leases (latest: 0016), the same but for its entries, written by
-- tickler_timeline_write().
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


-- The one write path of events (latest: 0045), the same but for its `replaced` / `debounced`
-- and `enqueued` entries, written by tickler_timeline_write().
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
                    SELECT tickler_timeline_write(array_agg(ROW(
                               c.queue, c.item_key, c.id, $10, $11, $12, c.schedule_on,
                               jsonb_strip_nulls(jsonb_build_object(
                                   'group_key', c.group_key, 'max_attempts', c.max_attempts,
                                   'priority', nullif(c.priority, 0), 'fairness_key', nullif(c.fairness_key, ''),
                                   'previous_schedule_on', CASE WHEN $1 = 'debounce' THEN tickler_rfc3339(c.previous) END))
                           )::tickler_timeline_row)) AS written
                    FROM changed AS c
                )
                SELECT min(c.schedule_on) FROM changed AS c CROSS JOIN logged AS l
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
            SELECT tickler_timeline_write(array_agg(ROW(
                       n.queue, n.item_key, n.id, n.enqueued_on, 'enqueued', n.enqueued_by, n.schedule_on,
                       jsonb_strip_nulls(jsonb_build_object('group_key', n.group_key, 'max_attempts', n.max_attempts,
                                                            'priority', nullif(n.priority, 0),
                                                            'fairness_key', nullif(n.fairness_key, '')))
                   )::tickler_timeline_row)) AS written
            FROM inserted AS n
        )
        SELECT array_agg((v_position ->> n.item_key)::integer), array_agg(n.id), min(n.schedule_on)
        INTO s_pos, s_ids, s_earliest
        FROM inserted AS n CROSS JOIN logged AS l;
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
