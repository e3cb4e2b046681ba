-- Claims that rewrite no index they need not (issue #21): the live leases in a small table of
-- their own, so that no index of tickler_event reads a lease column and a claim's new version of
-- the event row is a HOT update (the open-key, open-schedule and claimable entries stay).
--
--   tickler_lease      one row per leased open event: (lease_id, event_id) its primary key, the
--                      one index. The lease's columns on the event row (lease_id,
--                      lease_expires_on, claimed_on ...) stay what every reader reads (status,
--                      event JSON, history, tickler_event_all); this table is their index:
--                      kept by a trigger from every change of the event row (a claim, an ack, a
--                      nack, an extension, the reaper, a worker of the previous release during
--                      an upgrade), so no statement can leave the two disagreeing.
--                      Ack, nack and extend find their events by lease id on its primary key;
--                      the reaper, the counts of live leases (flow_room, the gauges, the
--                      dashboard), a group's or a fairness key's live leases read it whole: it
--                      holds the events in flight only.
--   claimable indexes  the same keys without `lease_id IS NULL` in their predicates: a claim
--                      tests "unleased" on the row (e.lease_id IS NULL), which it locks anyway.
--
-- The number (0060): this migration must run after 0045 (whose indexes and functions it
-- replaces) on a fresh install as well as on an upgrade.
--
-- Workers of the previous release: restart them after `tickler migrate`. Their statements stay
-- correct (the event row keeps every column they read and write, and the trigger keeps the
-- leases of their claims), but their lookups by lease id and their reaper lose the indexes
-- they were planned on.

-- The whole migration holds the events' table (its indexes are dropped and rebuilt below): taken
-- first, so that no lock is upgraded halfway. Writes, claims and counts wait until it commits.
LOCK TABLE tickler_event IN ACCESS EXCLUSIVE MODE;

CREATE TABLE tickler_lease (
    lease_id     uuid NOT NULL,
    event_id     bigint NOT NULL,
    queue        text NOT NULL,
    group_key    text COLLATE "C",
    fairness_key text COLLATE "C" NOT NULL,
    expires_on   timestamptz NOT NULL,
    PRIMARY KEY (lease_id, event_id)
) WITH (fillfactor = 70, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
        autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0);

COMMENT ON TABLE tickler_lease IS
    'The live leases of open events, kept from tickler_event by tickler_keep_leases(): the index of the lease columns.';

-- The trigger: statement-level, over the statement's transition tables (one join per statement,
-- nothing when no row had or has a lease: a schedule, a change, a trace context).
CREATE FUNCTION tickler_keep_leases() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM tickler_lease AS l USING old_rows AS o
        WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id;
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE lease_id IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM old_rows WHERE lease_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- leases that ended, were replaced, or whose event finished
    DELETE FROM tickler_lease AS l
    USING old_rows AS o JOIN new_rows AS n ON n.id = o.id
    WHERE o.lease_id IS NOT NULL AND l.lease_id = o.lease_id AND l.event_id = o.id
      AND (n.lease_id IS DISTINCT FROM o.lease_id OR n.dequeued_on IS NOT NULL);
    -- leases that go on with a new expiry (extend) or a changed group or key
    UPDATE tickler_lease AS l
    SET expires_on = n.lease_expires_on, queue = n.queue, group_key = n.group_key, fairness_key = n.fairness_key
    FROM old_rows AS o JOIN new_rows AS n ON n.id = o.id
    WHERE n.lease_id = o.lease_id AND n.dequeued_on IS NULL AND l.lease_id = n.lease_id AND l.event_id = n.id
      AND (n.lease_expires_on, n.queue, n.group_key, n.fairness_key)
          IS DISTINCT FROM (o.lease_expires_on, o.queue, o.group_key, o.fairness_key);
    -- new leases (a claim)
    INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
    SELECT n.lease_id, n.id, n.queue, n.group_key, n.fairness_key, n.lease_expires_on
    FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
    WHERE n.lease_id IS NOT NULL AND n.dequeued_on IS NULL AND n.lease_id IS DISTINCT FROM o.lease_id;
    RETURN NULL;
END
$$;

-- An event is written with a lease by no statement (schedule and revive write unleased rows);
-- a row inserted with one would still get its lease row.
CREATE FUNCTION tickler_keep_leases_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
    SELECT n.lease_id, n.id, n.queue, n.group_key, n.fairness_key, n.lease_expires_on
    FROM new_rows AS n WHERE n.lease_id IS NOT NULL AND n.dequeued_on IS NULL;
    RETURN NULL;
END
$$;

-- A TRUNCATE of the events (tests, a reset) empties the leases too.
CREATE FUNCTION tickler_keep_leases_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE tickler_lease;
    RETURN NULL;
END
$$;

CREATE TRIGGER tickler_keep_leases_truncated AFTER TRUNCATE ON tickler_event
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_keep_leases_truncated();
CREATE TRIGGER tickler_keep_leases_updated AFTER UPDATE ON tickler_event
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_keep_leases();
CREATE TRIGGER tickler_keep_leases_deleted AFTER DELETE ON tickler_event
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_keep_leases();
CREATE TRIGGER tickler_keep_leases_inserted AFTER INSERT ON tickler_event
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_keep_leases_inserted();

-- The live leases of in-flight events move in (an expired, unreaped lease too: the reaper or
-- the next claim ends it as before).
INSERT INTO tickler_lease (lease_id, event_id, queue, group_key, fairness_key, expires_on)
SELECT e.lease_id, e.id, e.queue, e.group_key, e.fairness_key, e.lease_expires_on
FROM tickler_event AS e
WHERE e.lease_id IS NOT NULL AND e.dequeued_on IS NULL;

-- No index of tickler_event reads a lease column any more.
DROP INDEX tickler_event_leased;
DROP INDEX tickler_event_leased_fair;
DROP INDEX tickler_event_leased_group;
DROP INDEX tickler_event_lease_expiry;
DROP INDEX tickler_event_lease_expiry_group;
DROP INDEX tickler_event_claimable;
DROP INDEX tickler_event_claimable_group;
DROP INDEX tickler_event_claimable_priority;
DROP INDEX tickler_event_claimable_fair;
CREATE INDEX tickler_event_claimable ON tickler_event (queue, schedule_on, id)
    WHERE dequeued_on IS NULL AND group_key IS NULL;
CREATE INDEX tickler_event_claimable_group ON tickler_event (queue, schedule_on, id) INCLUDE (group_key)
    WHERE dequeued_on IS NULL AND group_key IS NOT NULL;
CREATE INDEX tickler_event_claimable_priority ON tickler_event (queue, priority, schedule_on, id)
    WHERE dequeued_on IS NULL AND group_key IS NULL;
CREATE INDEX tickler_event_claimable_fair ON tickler_event (queue, priority, fairness_key, schedule_on, id)
    WHERE dequeued_on IS NULL AND group_key IS NULL;

-- The counts of live leases (0020) from the lease table; the due count as before.
CREATE OR REPLACE FUNCTION tickler_live_counts(p_queue text, p_at timestamptz)
RETURNS TABLE (in_flight bigint, due bigint, oldest_due timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT live.in_flight, live.open_due - live.in_flight_due, oldest.schedule_on
    FROM (
        SELECT
            (SELECT count(*) FROM tickler_lease AS l
             WHERE l.queue = p_queue AND l.expires_on > p_at) AS in_flight,
            -- their rows by primary key (= ANY(ARRAY(...)), never a join the planner could make
            -- a hash join over a scan of the events)
            (SELECT count(*) FROM tickler_event AS e
             WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l
                                    WHERE l.queue = p_queue AND l.expires_on > p_at))
               AND e.schedule_on <= p_at) AS in_flight_due,
            (SELECT count(*) FROM tickler_event AS e
             WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.schedule_on <= p_at) AS open_due
    ) AS live
    LEFT JOIN LATERAL (
        SELECT e.schedule_on FROM tickler_event AS e
        WHERE e.queue = p_queue AND e.dequeued_on IS NULL AND e.schedule_on <= p_at
          AND NOT coalesce(e.lease_expires_on > p_at, false)
        ORDER BY e.schedule_on, e.id
        LIMIT 1
    ) AS oldest ON true
$$;

-- The fair pick (0045) with a key's live leases counted in the lease table ("unleased" stays
-- e.lease_id IS NULL on the row).
-- The ids a fair claim of a queue takes (at most p_limit), locked, in the order handed out: each
-- priority level from the highest; within a level, the keys with a due event from the one after
-- the cursor on (wrapping around once), one event per key per round, rounds until the batch is
-- full. With p_cap, a key gets at most its room (p_cap less its live leases; none when full).
-- Called only under the queue's flow lock (one claimer of the queue at a time, cluster-wide), so
-- the cursor and the per-key room are never read by two claims at once.
CREATE OR REPLACE FUNCTION tickler_fair_pick(p_queue text, p_now timestamptz, p_limit integer, p_cap integer)
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
                SELECT count(DISTINCT l.lease_id) INTO v_live FROM tickler_lease AS l
                WHERE l.queue = p_queue AND l.fairness_key = v_key AND l.expires_on > p_now;
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

-- Room on each page for the claim's new version of every row on it (HOT needs the new version on
-- the old one's page; a claimed row is ~50 bytes longer: lease id, claimer, three times). A batch
-- claims neighbouring rows, so at 70 a third of a batch's versions went to other pages, each
-- with an entry in every index (python -m bench.walprofile: 0.71 of claims HOT at 70, 0.85 at
-- 50, all at 40). The table holds open events only (finished ones move to the history). Pages
-- written before this migration keep their fill until rewritten.
ALTER TABLE tickler_event SET (fillfactor = 40);

-- A group's one fairness key (0045), checked per written row of a group. Without `lease_id IS
-- NULL` in its predicate, tickler_event_claimable_group (queue, schedule_on, id) serves any read
-- of a queue's open grouped events, and the check's cached generic plan took it: a scan of the
-- whole queue's grouped events per row written (30,000 grouped events took minutes). EXECUTE
-- plans each check with its values (the group's own range of tickler_event_open_group), and one
-- other open event of the group tells its key: they all share it (this check keeps them so).
CREATE OR REPLACE FUNCTION tickler_check_group_fairness() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
BEGIN
    EXECUTE 'SELECT e.fairness_key FROM tickler_event AS e
             WHERE e.queue = $1 AND e.group_key = $2 AND e.dequeued_on IS NULL AND e.id <> $3
             LIMIT 1'
    INTO v_key USING NEW.queue, NEW.group_key, NEW.id;
    IF v_key IS NOT NULL AND v_key <> NEW.fairness_key THEN
        RAISE EXCEPTION 'the open events of group % have another fairness_key', NEW.group_key
            USING ERRCODE = 'check_violation', CONSTRAINT = 'tickler_event_group_fairness';
    END IF;
    RETURN NEW;
END
$$;
