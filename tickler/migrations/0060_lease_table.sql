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

-- The live leases of key p_key (0047's one place for them) counted in the lease table; the fair
-- pick (0047) reads them only through this function, and says "unleased" only through the view
-- tickler_fair_claimable (e.lease_id IS NULL on the row, which the pick locks anyway).
CREATE OR REPLACE FUNCTION tickler_fair_live_leases(p_queue text, p_key text, p_now timestamptz)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(DISTINCT l.lease_id)::integer FROM tickler_lease AS l
    WHERE l.queue = p_queue AND l.fairness_key = p_key AND l.expires_on > p_now
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
