-- Erasing a subject (SPEC §12): the rows of matching keys and groups found, their values replaced
-- by keyed hashes (`erased:` + HMAC-SHA256 hex) and their payloads, errors, trace context and
-- free-text details dropped, in bounded batches, each its own transaction.
--
-- The hashes are made by the caller (scheduler/erasing.py), which holds the installation's secret:
-- it asks tickler_erasure_values() for the values of the next batch, hashes them, and hands the
-- map {value: hash} to tickler_erase_batch(). A row whose values are not all in the map (written
-- in between) waits for the next batch. When a pass finds nothing left, tickler_erasure_finish()
-- checks once more under a short lock and closes the erasure. A batch or the finish that is
-- interrupted (kill -9) rolls back whole; the next run goes on from what is committed.
--
-- Every file of scheduler/database/ but schema.sql is applied again by `tickler migrate` whenever
-- its text changes. Each definition is CREATE OR REPLACE; a changed signature or return type needs
-- a DROP FUNCTION IF EXISTS before it. Bodies are not checked when applied (check_function_bodies
-- is off), so the order within and between files matters only for views and triggers.

-- A timeline entry's details with nothing a client or a receiver wrote: numbers, booleans, the
-- lease, times and worker names stay (the entry still tells what happened and when); reasons,
-- errors, groups, fairness keys and trace ids go. The claim an entry carries is cleaned the same way.
CREATE OR REPLACE FUNCTION tickler_erased_details(p_details jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_object_agg(d.key, CASE WHEN d.key = 'claim' THEN tickler_erased_details(d.value)
                                                 ELSE d.value END), '{}'::jsonb)
    FROM jsonb_each(CASE WHEN jsonb_typeof(p_details) = 'object' THEN p_details ELSE '{}'::jsonb END) AS d
    WHERE jsonb_typeof(d.value) IN ('number', 'boolean', 'null')
       OR d.key IN ('lease_id', 'lease_expires_at', 'schedule_on', 'previous_schedule_on', 'dead_since',
                    'expired_at', 'by', 'claimed_by', 'changed', 'claim')
$$;

-- Who wrote an erased row, without the subject: a recurring schedule's occurrences are enqueued
-- by `schedule:{schedule_key}`, and that key may hold the subject (its occurrences' keys start
-- with it); it becomes `schedule:erased`. Every other principal (a token's name, a worker) stays.
CREATE OR REPLACE FUNCTION tickler_erased_actor(p_actor text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN starts_with(p_actor, 'schedule:') THEN 'schedule:erased' ELSE p_actor END
$$;

-- The open events an erasure matches while its database part goes on (at most p_limit): per queue it covers, by the
-- indexes of open events (group; key; key range of the prefix).
CREATE OR REPLACE FUNCTION tickler_erasure_open_ids(p_erasure_id bigint, p_limit integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT m.id
    FROM tickler_erasure AS r
    JOIN tickler_erasure_work AS w ON w.erasure_id = r.id
    JOIN tickler_queue AS q ON r.queues IS NULL OR q.name = ANY(r.queues)
    CROSS JOIN LATERAL (
        SELECT e.id FROM tickler_event AS e
        WHERE e.queue = q.name AND e.dequeued_on IS NULL AND e.group_key = w.group_key
        UNION
        SELECT e.id FROM tickler_event AS e
        WHERE e.queue = q.name AND e.dequeued_on IS NULL AND e.item_key = ANY(w.item_keys)
        UNION
        SELECT e.id FROM tickler_event AS e
        WHERE e.queue = q.name AND e.dequeued_on IS NULL AND e.item_key >= w.item_key_prefix
          AND (w.item_key_prefix_end IS NULL OR e.item_key < w.item_key_prefix_end)
    ) AS m
    WHERE r.id = p_erasure_id AND r.database_done_at IS NULL
    LIMIT p_limit
$$;

-- The finished events an erasure matches while its database part goes on (at most p_limit) that
-- finished in [p_from, p_to) (p_to NULL: up to now). History has no index by key or group (one on
-- every ack would cost WAL): the runner walks it by ranges of dequeued_on instead, each read
-- through the days' partitions and their BRIN index on dequeued_on (finished events are appended
-- in about the order they finish), so a range costs what it holds, not the whole history. Each
-- row comes with its values and where it lies (its partition and ctid: history has no index by
-- id, a batch finds the row again there).
DROP FUNCTION IF EXISTS tickler_erasure_history_rows(bigint, integer, timestamptz);
DROP FUNCTION IF EXISTS tickler_erasure_history_rows(bigint, integer, timestamptz, timestamptz);
CREATE OR REPLACE FUNCTION tickler_erasure_history_rows(p_erasure_id bigint, p_limit integer, p_from timestamptz,
                                                        p_to timestamptz)
RETURNS TABLE (queue text, item_key text, group_key text, fairness_key text, row_table oid, row_ctid tid)
LANGUAGE sql STABLE AS $$
    SELECT h.queue, h.item_key, h.group_key, h.fairness_key, h.tableoid, h.ctid
    FROM tickler_erasure AS r
    JOIN tickler_erasure_work AS w ON w.erasure_id = r.id
    JOIN tickler_event_history AS h
      ON (r.queues IS NULL OR h.queue = ANY(r.queues))
     AND (h.group_key = w.group_key OR h.item_key = ANY(w.item_keys)
          OR (h.item_key >= w.item_key_prefix AND (w.item_key_prefix_end IS NULL OR h.item_key < w.item_key_prefix_end)))
    WHERE r.id = p_erasure_id AND r.database_done_at IS NULL
      AND h.dequeued_on >= p_from AND h.dequeued_on < coalesce(p_to, 'infinity')
    LIMIT p_limit
$$;

-- The keys with timeline entries that an erasure names by key or prefix (at most
-- p_limit): those whose events are gone (past retention, a deleted queue) still have a timeline.
-- Every queue the timeline holds, deleted ones too, found by skipping along its key index.
CREATE OR REPLACE FUNCTION tickler_erasure_timeline_keys(p_erasure_id bigint, p_limit integer)
RETURNS TABLE (queue text, item_key text)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE queues AS (
        (SELECT t.queue FROM tickler_timeline AS t ORDER BY t.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT t.queue FROM tickler_timeline AS t WHERE t.queue > q.queue ORDER BY t.queue LIMIT 1)
        FROM queues AS q WHERE q.queue IS NOT NULL
    )
    SELECT DISTINCT m.queue, m.item_key
    FROM tickler_erasure AS r
    JOIN tickler_erasure_work AS w ON w.erasure_id = r.id
    JOIN queues AS q ON q.queue IS NOT NULL AND (r.queues IS NULL OR q.queue = ANY(r.queues))
    CROSS JOIN LATERAL (
        SELECT t.queue, t.item_key FROM tickler_timeline AS t
        WHERE t.queue = q.queue AND t.item_key = ANY(w.item_keys)
        UNION
        SELECT t.queue, t.item_key FROM tickler_timeline AS t
        WHERE t.queue = q.queue AND t.item_key >= w.item_key_prefix
          AND (w.item_key_prefix_end IS NULL OR t.item_key < w.item_key_prefix_end)
    ) AS m
    WHERE r.id = p_erasure_id AND r.database_done_at IS NULL
    LIMIT p_limit
$$;

-- The keyed hashes of the keys and groups an erasure erased, by queue (tickler_erased_value: what
-- a lookup by value finds, and the keys whose timeline ends `erased`). The arrays are aligned by
-- position; a NULL group is no value.
CREATE OR REPLACE FUNCTION tickler_erasure_remember(p_erasure_id bigint, p_queues text[], p_item_keys text[],
                                                    p_group_keys text[]) RETURNS boolean
LANGUAGE sql AS $$
    INSERT INTO tickler_erased_value (erasure_id, queue, kind, value_hash)
    SELECT DISTINCT p_erasure_id, k.queue, v.kind, v.hash
    FROM unnest(p_queues, p_item_keys, p_group_keys) AS k (queue, item_key, group_key)
    CROSS JOIN LATERAL (VALUES ('item_key', k.item_key), ('group_key', k.group_key)) AS v (kind, hash)
    WHERE v.hash IS NOT NULL
    ON CONFLICT DO NOTHING;
    SELECT true
$$;

-- The recurring schedules an erasure matches while its database part goes on: in the queues it
-- covers, those of its group, and those whose occurrences' keys (`{schedule_key}@…`) its prefix
-- covers. (Its item_keys name events: an occurrence named by key is erased as an event, and its
-- schedule stays.) A schedule holds the subject's group and payload for every occurrence to come:
-- tickler_erase_schedules deletes it.
CREATE OR REPLACE FUNCTION tickler_erasure_schedules(p_erasure_id bigint)
RETURNS TABLE (queue text, schedule_key text, group_key text)
LANGUAGE sql STABLE AS $$
    SELECT s.queue, s.schedule_key, s.group_key
    FROM tickler_erasure AS r
    JOIN tickler_erasure_work AS w ON w.erasure_id = r.id
    JOIN tickler_schedule AS s
      ON (r.queues IS NULL OR s.queue = ANY(r.queues))
     AND (s.group_key = w.group_key OR starts_with(s.schedule_key || '@', w.item_key_prefix))
    WHERE r.id = p_erasure_id AND r.database_done_at IS NULL
$$;

-- The matching schedules deleted, and the timeline of each one's key (its schedule_created and
-- schedule_updated entries hold the group and the payload) erased as an erased key's: the hashed
-- key, cleaned details, an `erased` entry at the end. p_hashes maps each schedule's key and group
-- to its hash; a schedule it does not map (written in between) waits for the next run. Its open
-- occurrences carry its group and key prefix: the erasure's batches cancel and erase them, and no
-- new one is enqueued once the schedule is gone. Returns the schedules deleted.
CREATE OR REPLACE FUNCTION tickler_erase_schedules(p_erasure_id bigint, p_hashes jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_queues  text[];
    v_keys    text[];
    v_groups  text[];
    v_entries bigint := 0;
BEGIN
    PERFORM 1 FROM tickler_erasure WHERE id = p_erasure_id FOR UPDATE;  -- one batch of an erasure at a time
    WITH gone AS (
        DELETE FROM tickler_schedule AS s
        USING tickler_erasure_schedules(p_erasure_id) AS m
        WHERE s.queue = m.queue AND s.schedule_key = m.schedule_key
          AND p_hashes ? s.schedule_key AND (s.group_key IS NULL OR p_hashes ? s.group_key)
        RETURNING s.queue, s.schedule_key, s.group_key
    )
    SELECT array_agg(queue), array_agg(schedule_key), array_agg(group_key) INTO v_queues, v_keys, v_groups FROM gone;
    IF v_keys IS NULL THEN
        RETURN 0;
    END IF;
    v_entries := tickler_erase_timeline(v_queues, v_keys, p_hashes);
    PERFORM tickler_erasure_remember(
        p_erasure_id, v_queues,
        ARRAY(SELECT p_hashes ->> k FROM unnest(v_keys) WITH ORDINALITY AS u (k, n) ORDER BY n),
        ARRAY(SELECT p_hashes ->> g FROM unnest(v_groups) WITH ORDINALITY AS u (g, n) ORDER BY n));
    UPDATE tickler_erasure
    SET status = 'running', started_at = coalesce(started_at, now()), timeline_entries = timeline_entries + v_entries
    WHERE id = p_erasure_id;
    RETURN cardinality(v_keys);
END
$$;

-- The values (keys, groups, fairness keys) of the rows the next batch of this erasure would
-- erase: what the caller hashes for tickler_erase_batch. None: nothing is left to erase. With a
-- range [p_from, p_to) of the walk through history: open events, else finished events of that
-- range; without (p_from NULL, the walk is over): open events, else keys only the timeline holds.
DROP FUNCTION IF EXISTS tickler_erasure_values(bigint, integer);
CREATE OR REPLACE FUNCTION tickler_erasure_values(p_erasure_id bigint, p_limit integer, p_from timestamptz,
                                                  p_to timestamptz) RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT DISTINCT v.value
    FROM tickler_event AS e
    CROSS JOIN LATERAL (VALUES (e.item_key), (e.group_key), (nullif(e.fairness_key, ''))) AS v (value)
    WHERE e.id = ANY(ARRAY(SELECT tickler_erasure_open_ids(p_erasure_id, p_limit))) AND v.value IS NOT NULL;
    IF FOUND THEN
        RETURN;
    END IF;
    IF p_from IS NULL THEN
        RETURN QUERY SELECT DISTINCT k.item_key FROM tickler_erasure_timeline_keys(p_erasure_id, p_limit) AS k;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT DISTINCT v.value
    FROM tickler_erasure_history_rows(p_erasure_id, p_limit, p_from, p_to) AS x
    CROSS JOIN LATERAL (VALUES (x.item_key), (x.group_key), (nullif(x.fairness_key, ''))) AS v (value)
    WHERE v.value IS NOT NULL;
END
$$;

-- The entries of these keys (queue, item_key pairs, in clear) given their hashed key and
-- cleaned details, and their archived-key rows their hashed key: the one way through the
-- timeline's append-only guard (tickler.erasing, for this transaction). Returns the entries changed.
CREATE OR REPLACE FUNCTION tickler_erase_timeline(p_queues text[], p_keys text[], p_hashes jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM set_config('tickler.erasing', 'on', true);
    UPDATE tickler_timeline AS t
    SET item_key = p_hashes ->> t.item_key, details = tickler_erased_details(t.details),
        actor = tickler_erased_actor(t.actor)
    FROM unnest(p_queues, p_keys) AS k (queue, item_key)
    WHERE t.queue = k.queue AND t.item_key = k.item_key COLLATE "C";
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM set_config('tickler.erasing', 'off', true);
    -- a hashed key archived by an earlier erasure's key gives way (rare: the same key erased twice)
    DELETE FROM tickler_archived_key AS a
    USING unnest(p_queues, p_keys) AS k (queue, item_key)
    WHERE a.queue = k.queue AND a.item_key = (p_hashes ->> k.item_key) COLLATE "C"
      AND EXISTS (SELECT 1 FROM tickler_archived_key AS o WHERE o.queue = k.queue AND o.item_key = k.item_key COLLATE "C");
    UPDATE tickler_archived_key AS a
    SET item_key = p_hashes ->> a.item_key
    FROM unnest(p_queues, p_keys) AS k (queue, item_key)
    WHERE a.queue = k.queue AND a.item_key = k.item_key COLLATE "C";
    RETURN v_n;
END
$$;

-- One batch of an erasure, in the caller's transaction: the first place that has matching rows
-- whose values p_hashes maps — open events (at most p_limit: cancelled, reason `erased`, their
-- lease fenced), else finished events of the walk's range [p_from, p_to) (at most p_limit), or
-- with no range, timeline keys (at most p_limit) — erased, with every timeline entry of their
-- keys, and counted on the erasure. The erasure row is locked first: one batch of an erasure at a
-- time. Returns the rows erased (0: nothing in the map was left).
DROP FUNCTION IF EXISTS tickler_erase_batch(bigint, jsonb, integer);
CREATE OR REPLACE FUNCTION tickler_erase_batch(p_erasure_id bigint, p_hashes jsonb, p_limit integer,
                                               p_from timestamptz, p_to timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_erasure   tickler_erasure;
    v_now       timestamptz := now();
    v_ids       bigint[];
    v_queues    text[];
    v_keys      text[];
    v_tables    oid[];
    v_ctids     tid[];
    v_events    bigint := 0;
    v_entries   bigint := 0;
    v_lease_end timestamptz;
BEGIN
    SELECT * INTO v_erasure FROM tickler_erasure WHERE id = p_erasure_id FOR UPDATE;
    IF NOT FOUND OR v_erasure.database_done_at IS NOT NULL THEN
        RETURN 0;
    END IF;

    -- 1. Open events: locked (a claim skips them meanwhile), then finished as cancelled with their
    --    values replaced; the statement's triggers end the lease and move them into history, so
    --    an ack or nack of that lease finds nothing (409). The latest expiry of the leases taken
    --    away is kept: the erasure is done only once it has passed (tickler_erasure_finish).
    SELECT array_agg(e.id ORDER BY e.id), array_agg(e.queue ORDER BY e.id), array_agg(e.item_key ORDER BY e.id),
           max(e.lease_expires_on)
    INTO v_ids, v_queues, v_keys, v_lease_end
    FROM (SELECT e.id, e.queue, e.item_key, e.lease_expires_on FROM tickler_event AS e
          WHERE e.id = ANY(ARRAY(SELECT tickler_erasure_open_ids(p_erasure_id, p_limit)))
            AND e.dequeued_on IS NULL AND p_hashes ? e.item_key
            AND (e.group_key IS NULL OR p_hashes ? e.group_key)
            AND (e.fairness_key = '' OR p_hashes ? e.fairness_key)
          ORDER BY e.id
          FOR UPDATE OF e) AS e;
    IF v_ids IS NOT NULL THEN
        v_entries := tickler_erase_timeline(v_queues, v_keys, p_hashes);
        WITH changed AS (
            UPDATE tickler_event AS e
            SET item_key = p_hashes ->> e.item_key,
                group_key = p_hashes ->> e.group_key,
                fairness_key = coalesce(p_hashes ->> nullif(e.fairness_key, ''), ''),
                data = '{}', last_error = CASE WHEN e.last_error IS NOT NULL THEN 'erased' END,
                traceparent = NULL, tracestate = NULL, enqueued_by = tickler_erased_actor(e.enqueued_by),
                dequeued_on = v_now, dequeued_by = v_erasure.requested_by, outcome = 'cancelled',
                lease_id = NULL, lease_expires_on = NULL, version = e.version + 1, changed_on = v_now
            WHERE e.id = ANY(v_ids) AND e.dequeued_on IS NULL
            RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on
        ),
        logged AS (
            SELECT tickler_timeline_write(array_agg(ROW(
                       c.queue, c.item_key, c.id, v_now, 'cancelled', v_erasure.requested_by, c.schedule_on,
                       jsonb_build_object('reason', 'erased', 'erasure_id', p_erasure_id)
                   )::tickler_timeline_row ORDER BY c.id)) AS written
            FROM changed AS c
        ),
        remembered AS (
            SELECT tickler_erasure_remember(p_erasure_id, array_agg(c.queue), array_agg(c.item_key),
                                            array_agg(c.group_key)) AS done
            FROM changed AS c
        )
        SELECT count(*) INTO v_events FROM changed CROSS JOIN logged CROSS JOIN remembered;
        -- the round robin's hint may name an erased fairness key
        UPDATE tickler_fair_cursor AS f SET after_key = ''
        WHERE f.queue = ANY(v_queues) AND f.after_key <> '' AND p_hashes ? f.after_key;
        UPDATE tickler_erasure
        SET status = 'running', started_at = coalesce(started_at, v_now),
            open_events = open_events + v_events, timeline_entries = timeline_entries + v_entries,
            leases_end_at = greatest(leases_end_at, v_lease_end)
        WHERE id = p_erasure_id;
        RETURN v_events + v_entries;
    END IF;

    -- 2. Finished events of the range: their values replaced in place (outcome, times and counts
    --    stay: the counters and statistics do not change).
    IF p_from IS NOT NULL THEN
        SELECT array_agg(h.tableoid), array_agg(h.ctid), array_agg(h.queue), array_agg(h.item_key)
        INTO v_tables, v_ctids, v_queues, v_keys
        FROM (SELECT h.tableoid, h.ctid, h.queue, h.item_key FROM tickler_event_history AS h
              JOIN tickler_erasure_history_rows(p_erasure_id, p_limit, p_from, p_to) AS x
                ON h.tableoid = x.row_table AND h.ctid = x.row_ctid
              WHERE h.dequeued_on >= p_from AND (p_to IS NULL OR h.dequeued_on < p_to)
                AND p_hashes ? h.item_key AND (h.group_key IS NULL OR p_hashes ? h.group_key)
                AND (h.fairness_key = '' OR p_hashes ? h.fairness_key)
              FOR UPDATE OF h) AS h;
        IF v_ctids IS NOT NULL THEN
            WITH changed AS (
                UPDATE tickler_event_history AS h
                SET item_key = p_hashes ->> h.item_key,
                    group_key = p_hashes ->> h.group_key,
                    fairness_key = coalesce(p_hashes ->> nullif(h.fairness_key, ''), ''),
                    data = '{}', last_error = CASE WHEN h.last_error IS NOT NULL THEN 'erased' END,
                    traceparent = NULL, tracestate = NULL, enqueued_by = tickler_erased_actor(h.enqueued_by)
                -- the rows locked above, where they lie (the lock returned their newest version)
                FROM unnest(v_tables, v_ctids) AS x (row_table, row_ctid)
                WHERE h.tableoid = x.row_table AND h.ctid = x.row_ctid
                  AND h.dequeued_on >= p_from AND h.dequeued_on < coalesce(p_to, 'infinity')
                RETURNING h.queue, h.item_key, h.group_key
            ),
            remembered AS (
                SELECT tickler_erasure_remember(p_erasure_id, array_agg(c.queue), array_agg(c.item_key),
                                                array_agg(c.group_key)) AS done
                FROM changed AS c
            )
            SELECT count(*) INTO v_events FROM changed CROSS JOIN remembered;
            SELECT array_agg(k.queue), array_agg(k.item_key) INTO v_queues, v_keys
            FROM (SELECT DISTINCT q.queue, q.item_key FROM unnest(v_queues, v_keys) AS q (queue, item_key)) AS k;
            v_entries := tickler_erase_timeline(v_queues, v_keys, p_hashes);
            UPDATE tickler_erasure
            SET status = 'running', started_at = coalesce(started_at, v_now),
                finished_events = finished_events + v_events, timeline_entries = timeline_entries + v_entries
            WHERE id = p_erasure_id;
            RETURN v_events + v_entries;
        END IF;
        RETURN 0;
    END IF;

    -- 3. Without a range (the walk is over): keys named by key or prefix that only the timeline holds.
    SELECT array_agg(k.queue), array_agg(k.item_key) INTO v_queues, v_keys
    FROM tickler_erasure_timeline_keys(p_erasure_id, p_limit) AS k
    WHERE p_hashes ? k.item_key;
    IF v_keys IS NOT NULL THEN
        v_entries := tickler_erase_timeline(v_queues, v_keys, p_hashes);
        INSERT INTO tickler_erased_value (erasure_id, queue, kind, value_hash)
        SELECT DISTINCT p_erasure_id, k.queue, 'item_key', p_hashes ->> k.item_key
        FROM unnest(v_queues, v_keys) AS k (queue, item_key)
        ON CONFLICT DO NOTHING;
        UPDATE tickler_erasure
        SET status = 'running', started_at = coalesce(started_at, v_now), timeline_entries = timeline_entries + v_entries
        WHERE id = p_erasure_id;
        RETURN v_entries;
    END IF;
    RETURN 0;
END
$$;

-- Closes the database's part of an erasure that a pass found nothing left of: under a short SHARE
-- lock on the open events (writers wait for the few milliseconds it takes; it gives up after
-- 200 ms, and the caller tries again later), no open event matches and no finished one does that
-- finished since p_since (when the last pass began: older ones that pass saw). So an event
-- scheduled while the erasure ran was erased with it, and one written after this commits is new
-- data. Each erased key's timeline ends with an `erased` entry. When the archive has files (any
-- archive run), they are next: the erasure stays running, its clear selector kept, until
-- `tickler pipeline erase` rewrites them (tickler_erasure_archive_done); else it is done, and its
-- clear selector is deleted. Returns 'done' (or the database's part done), 'rows_left' (nothing
-- done: the caller goes on), or 'leases_held': a lease the erasure took away has not expired yet
-- (with p_lease_margin to spare): its holder may still be sending, so the erasure waits for it.
DROP FUNCTION IF EXISTS tickler_erasure_finish(bigint, timestamptz, text);
CREATE OR REPLACE FUNCTION tickler_erasure_finish(p_erasure_id bigint, p_since timestamptz, p_note text,
                                                  p_lease_margin interval)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_erasure tickler_erasure;
BEGIN
    SELECT * INTO v_erasure FROM tickler_erasure WHERE id = p_erasure_id FOR UPDATE;
    IF NOT FOUND OR v_erasure.database_done_at IS NOT NULL THEN
        RETURN 'done';
    END IF;
    IF v_erasure.leases_end_at + p_lease_margin > now() THEN
        RETURN 'leases_held';
    END IF;
    PERFORM set_config('lock_timeout', '200ms', true);
    LOCK TABLE tickler_event IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM tickler_erasure_open_ids(p_erasure_id, 1))
       OR EXISTS (SELECT 1 FROM tickler_erasure_history_rows(p_erasure_id, 1, p_since, NULL)) THEN
        RETURN 'rows_left';
    END IF;
    PERFORM tickler_timeline_write(array_agg(ROW(
                v.queue, v.value_hash, NULL, now(), 'erased', v_erasure.requested_by, NULL,
                jsonb_build_object('erasure_id', p_erasure_id)
            )::tickler_timeline_row ORDER BY v.queue, v.value_hash))
    FROM tickler_erased_value AS v
    WHERE v.erasure_id = p_erasure_id AND v.kind = 'item_key';
    IF EXISTS (SELECT 1 FROM tickler_archive_run) THEN
        UPDATE tickler_erasure
        SET status = 'running', started_at = coalesce(started_at, now()), database_done_at = now(), note = p_note
        WHERE id = p_erasure_id;
        RETURN 'done';
    END IF;
    DELETE FROM tickler_erasure_work WHERE erasure_id = p_erasure_id;
    UPDATE tickler_erasure
    SET status = 'done', started_at = coalesce(started_at, now()), database_done_at = now(), finished_at = now()
    WHERE id = p_erasure_id;
    RETURN 'done';
END
$$;

-- The walk through history has erased every row finished before p_to: a run that stops resumes there.
CREATE OR REPLACE FUNCTION tickler_erasure_walked(p_erasure_id bigint, p_to timestamptz) RETURNS void
LANGUAGE sql AS $$
    UPDATE tickler_erasure_work SET history_walked_to = p_to WHERE erasure_id = p_erasure_id;
$$;

-- The archive's part of an erasure is done too (`tickler pipeline erase` rewrote p_rows rows of
-- its files): done, and its clear selector deleted.
CREATE OR REPLACE FUNCTION tickler_erasure_archive_done(p_erasure_id bigint, p_rows bigint) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM tickler_erasure_work WHERE erasure_id = p_erasure_id;
    UPDATE tickler_erasure
    SET status = 'done', finished_at = now(), archive_rows = archive_rows + p_rows, note = NULL
    WHERE id = p_erasure_id AND finished_at IS NULL AND database_done_at IS NOT NULL;
$$;

-- An erasure that cannot go on: failed, with why, and its clear selector deleted (request it again).
CREATE OR REPLACE FUNCTION tickler_erasure_fail(p_erasure_id bigint, p_note text) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM tickler_erasure_work WHERE erasure_id = p_erasure_id;
    UPDATE tickler_erasure SET status = 'failed', finished_at = now(), note = p_note
    WHERE id = p_erasure_id AND finished_at IS NULL;
$$;
