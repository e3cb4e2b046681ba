-- History by day (SPEC §9): open events only in tickler_event; finished events and the timeline
-- in tables partitioned by day, removed a whole day at a time by retention.
--
-- Before this, every event stayed in tickler_event forever: claims and due counts stepped over
-- nothing (partial indexes), but vacuum, the heap and every finish's index entries grew with the
-- history, and nothing removed a finished event unless the Spark archive ran.
--
--   tickler_event          open events only (waiting, due, in flight): what claims, due counts and
--                          gauges read. Its indexes are unchanged, and so are the statements that
--                          finish an event (dequeued_on, outcome): the same statement moves it out
--                          (tickler_move_finished below). ack, which finishes nearly every event,
--                          deletes the row and inserts it into history itself (scheduler/queries.sql).
--   tickler_event_history  finished events, partitioned by the day (UTC) of dequeued_on.
--   tickler_timeline       every timeline entry, partitioned by the day (UTC) of `at`.
--   tickler_event_all      a view of both event tables: what readers of "any event" read.
--
-- Partitions are created ahead by tickler_maintain_history() (the dispatcher's maintenance job);
-- a default partition takes a row whose day has none yet, so a write never fails for lack of one,
-- and the next maintenance pass gives those rows their day. Rows from before this upgrade are in
-- one partition per table (`..._upgraded`, up to the start of the upgrade's day), removed as a
-- whole once its last day is past retention.

-- Everything this upgrade changes, locked first, at once: a writer that is running meanwhile
-- waits for the upgrade from its first statement on, instead of holding one of these tables and
-- waiting for another the upgrade holds (a deadlock: one of the two would fail).
LOCK TABLE tickler_queue, tickler_event, tickler_timeline, tickler_queue_count IN ACCESS EXCLUSIVE MODE;

-- Queue settings (SPEC §9). Queues that exist at the upgrade keep their history (3650 days):
-- an upgrade never deletes what it kept before; new queues get the default of 30.
ALTER TABLE tickler_queue
    ADD COLUMN retention_days integer NOT NULL DEFAULT 3650 CHECK (retention_days BETWEEN 1 AND 3650),
    ADD COLUMN archive_before_prune boolean NOT NULL DEFAULT false;
ALTER TABLE tickler_queue ALTER COLUMN retention_days SET DEFAULT 30;


-- Finished events. Same columns, in the same order, as tickler_event (a finish moves whole rows:
-- a column added to tickler_event must be added here too). No primary key: a partitioned table's
-- unique index must hold the partition key; ids are unique because tickler_event hands them out.
CREATE TABLE tickler_event_history (
    LIKE tickler_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    CONSTRAINT history_is_finished CHECK (dequeued_on IS NOT NULL)
) PARTITION BY RANGE (dequeued_on);

-- An event by id (a finished event read by key goes through the timeline to its id).
CREATE INDEX tickler_event_history_id ON tickler_event_history (id);
-- Searches by outcome, in the API's order (was tickler_event_finished_schedule).
CREATE INDEX tickler_event_history_schedule ON tickler_event_history (queue, schedule_on, id);
-- Dead events by key: retries by key prefix or group, status=dead searches (was tickler_event_dead).
CREATE INDEX tickler_event_history_dead ON tickler_event_history (queue, item_key) INCLUDE (group_key)
    WHERE outcome = 'dead';

CREATE TABLE tickler_event_history_default PARTITION OF tickler_event_history DEFAULT;

-- Finished rows have left tickler_event; these indexes held only them.
DROP INDEX tickler_event_finished_schedule;
DROP INDEX tickler_event_dead;


-- The timeline, partitioned by day. Same columns and checks as before; its one B-tree is the
-- key's (see 0005), no longer unique (a partitioned unique index must hold `at`; ids are unique
-- because the identity hands them out).
ALTER TABLE tickler_timeline RENAME TO tickler_timeline_before_0021;
ALTER SEQUENCE tickler_timeline_id_seq RENAME TO tickler_timeline_before_0021_id_seq;
ALTER INDEX tickler_timeline_id RENAME TO tickler_timeline_before_0021_id;
ALTER TABLE tickler_timeline_before_0021 RENAME CONSTRAINT tickler_timeline_pkey TO tickler_timeline_before_0021_pkey;
CREATE TABLE tickler_timeline (
    id           bigint GENERATED ALWAYS AS IDENTITY,
    queue        text NOT NULL,
    item_key     text COLLATE "C" NOT NULL,
    event_id     bigint,
    at           timestamptz NOT NULL DEFAULT now(),
    action       text NOT NULL CONSTRAINT tickler_timeline_action_check CHECK (action IN (
                     'enqueued', 'replaced', 'rescheduled', 'updated', 'claimed', 'delivered',
                     'failed', 'released', 'lease_expired', 'cancelled', 'dead',
                     'debounced', 'retried', 'schedule_created', 'schedule_updated', 'schedule_deleted')),
    actor        text NOT NULL,
    schedule_on  timestamptz,
    details      jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT timeline_event_id_present
        CHECK (event_id IS NOT NULL OR action IN ('schedule_created', 'schedule_updated', 'schedule_deleted'))
) PARTITION BY RANGE (at);

CREATE INDEX tickler_timeline_key ON tickler_timeline (queue, item_key, id);
CREATE INDEX tickler_timeline_id ON tickler_timeline USING brin (id);
CREATE TABLE tickler_timeline_default PARTITION OF tickler_timeline DEFAULT;


-- The partitions of both tables, by day: what tickler_maintain_history() creates and drops.
-- `day_from` NULL: the partition of rows from before the upgrade (from the beginning).
CREATE TABLE tickler_history_partition (
    name      text PRIMARY KEY,
    parent    text NOT NULL CHECK (parent IN ('tickler_event_history', 'tickler_timeline')),
    day_from  timestamptz,
    day_to    timestamptz NOT NULL,
    CHECK (day_from IS NULL OR day_from < day_to)
);

-- Finished events per day, queue and outcome, so that dropping a day takes its events off the
-- queue counters without counting them (each backend writes its own slot, as tickler_queue_count).
CREATE TABLE tickler_history_count (
    day      date NOT NULL,
    queue    text NOT NULL,
    outcome  text NOT NULL,
    slot     integer NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (day, queue, outcome, slot)
);

-- How far the Spark archive has written history: every event finished before `archived_through`
-- is in the archive. archive_before_prune drops only days before it.
CREATE TABLE tickler_archive_progress (
    id                boolean PRIMARY KEY DEFAULT true CHECK (id),
    archived_through  timestamptz NOT NULL,
    updated_on        timestamptz NOT NULL DEFAULT now()
);


-- Any event, open or finished: the event by id or key, searches over finished events, the
-- pipeline. (An event is in exactly one of the two: the move is one statement.)
CREATE VIEW tickler_event_all AS
SELECT * FROM tickler_event
UNION ALL
SELECT * FROM tickler_event_history;


-- The partition of one day of a history table: created (or kept, when it exists), with any rows
-- of that day the default partition took in the meantime moved into it. Returns whether it
-- created one. The new table is filled before it is attached, so attaching checks the default
-- partition without those rows (they are deleted by this transaction).
CREATE FUNCTION tickler_add_history_day(p_parent text, p_day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_name    text := p_parent || '_' || to_char(p_day, 'YYYYMMDD');
    v_column  text := CASE p_parent WHEN 'tickler_timeline' THEN 'at' ELSE 'dequeued_on' END;
    v_from    timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    v_to      timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF EXISTS (SELECT 1 FROM tickler_history_partition WHERE name = v_name) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name, p_parent);
    EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                   'INSERT INTO %I SELECT * FROM moved',
                   p_parent || '_default', v_column, v_column, v_name) USING v_from, v_to;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   p_parent, v_name, v_from, v_to);
    INSERT INTO tickler_history_partition (name, parent, day_from, day_to) VALUES (v_name, p_parent, v_from, v_to);
    RETURN true;
END
$$;

-- Days that may be dropped: those before the start of (today − the longest retention_days of any
-- queue; 30 when there is none). Partitions hold every queue's history of their day, so a day
-- goes when the queue that keeps history longest lets it go. When any queue asks for
-- archive_before_prune, only days the archive has written (before archived_through) go.
CREATE FUNCTION tickler_history_keep_from(p_now timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT least(
        date_trunc('day', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
            - make_interval(days => coalesce((SELECT max(retention_days) FROM tickler_queue), 30)),
        CASE WHEN EXISTS (SELECT 1 FROM tickler_queue WHERE archive_before_prune)
             THEN coalesce((SELECT archived_through FROM tickler_archive_progress), '-infinity') END)
$$;

-- The maintenance pass (every few minutes from the dispatcher; any number of processes may call
-- it, one at a time works): give rows in the default partitions their day, create the partitions
-- of today and p_days_ahead days ahead, and drop whole days past retention. Dropping
-- a day subtracts its events from the queue counters (tickler_history_count) and never reads the
-- day's rows. Nothing is dropped while an archive run is unfinished (its selected events must
-- stay until it deletes them); the lock on tickler_archive_run makes a run that is being
-- created wait for this pass, and this pass wait for it.
-- Returns the partitions created and dropped.
CREATE FUNCTION tickler_maintain_history(p_now timestamptz DEFAULT NULL, p_days_ahead integer DEFAULT 3)
RETURNS TABLE (created text[], dropped text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_today    date := (v_now AT TIME ZONE 'UTC')::date;
    v_keep     timestamptz;
    v_created  text[] := '{}';
    v_dropped  text[] := '{}';
    v_day      date;
    v_part     record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('tickler.history')) THEN
        RETURN QUERY SELECT v_created, v_dropped;  -- another process is at it
        RETURN;
    END IF;
    -- Creating and dropping a partition waits for the transactions writing its table; the writers
    -- that come after queue behind it. It gives up soon instead (and the next pass tries again):
    -- before PostgreSQL's deadlock check (deadlock_timeout, 1 s by default) would pick a victim,
    -- so a writer never fails because of this pass.
    PERFORM set_config('lock_timeout', '500ms', true);

    FOR v_day IN
        SELECT DISTINCT (h.dequeued_on AT TIME ZONE 'UTC')::date FROM tickler_event_history_default AS h
        UNION
        SELECT DISTINCT (t.at AT TIME ZONE 'UTC')::date FROM tickler_timeline_default AS t
        UNION
        SELECT v_today + d FROM generate_series(0, p_days_ahead) AS d
        ORDER BY 1
    LOOP
        IF tickler_add_history_day('tickler_event_history', v_day) THEN
            v_created := v_created || ('tickler_event_history_' || to_char(v_day, 'YYYYMMDD'));
        END IF;
        IF tickler_add_history_day('tickler_timeline', v_day) THEN
            v_created := v_created || ('tickler_timeline_' || to_char(v_day, 'YYYYMMDD'));
        END IF;
    END LOOP;

    LOCK TABLE tickler_archive_run IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM tickler_archive_run WHERE state <> 'deleted') THEN
        RETURN QUERY SELECT v_created, v_dropped;
        RETURN;
    END IF;
    v_keep := tickler_history_keep_from(v_now);
    IF EXISTS (SELECT 1 FROM tickler_history_partition WHERE day_to <= v_keep) THEN
        -- Dropping a partition locks its parent. A finish writes the timeline, then the history
        -- (its statement logs; the move comes after it): the same order here.
        LOCK TABLE ONLY tickler_timeline IN ACCESS EXCLUSIVE MODE;
        LOCK TABLE ONLY tickler_event_history IN ACCESS EXCLUSIVE MODE;
    END IF;
    FOR v_part IN
        SELECT p.name, p.parent, p.day_from, p.day_to FROM tickler_history_partition AS p
        WHERE p.day_to <= v_keep ORDER BY p.day_to, p.name
    LOOP
        IF v_part.parent = 'tickler_event_history' THEN
            INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
            SELECT h.queue, h.outcome, pg_backend_pid() % 64, -sum(h.n)
            FROM tickler_history_count AS h
            WHERE h.day < (v_part.day_to AT TIME ZONE 'UTC')::date
              AND (v_part.day_from IS NULL OR h.day >= (v_part.day_from AT TIME ZONE 'UTC')::date)
            GROUP BY 1, 2 HAVING sum(h.n) <> 0 ORDER BY 1, 2
            ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
            DELETE FROM tickler_history_count AS h
            WHERE h.day < (v_part.day_to AT TIME ZONE 'UTC')::date
              AND (v_part.day_from IS NULL OR h.day >= (v_part.day_from AT TIME ZONE 'UTC')::date);
        END IF;
        EXECUTE format('DROP TABLE %I', v_part.name);
        DELETE FROM tickler_history_partition WHERE name = v_part.name;
        v_dropped := v_dropped || v_part.name::text;
    END LOOP;
    RETURN QUERY SELECT v_created, v_dropped;
END
$$;


-- The move: a statement that finishes events (sets dequeued_on) moves them into the history in
-- the same statement, after it: every statement that finishes an event (ack, nack, cancel, the
-- reaper, a queue's deletion...) keeps its guard and its RETURNING, and none can forget the move.
-- A concurrent statement waiting on the row finds it deleted and skips it, as it skipped a
-- finished row before. Statements that finish nothing (claims, extensions) do not touch the
-- history table at all (so a day being dropped never holds up a claim).
CREATE FUNCTION tickler_move_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE dequeued_on IS NOT NULL) THEN
        WITH moved AS (
            DELETE FROM tickler_event AS e
            WHERE e.id = ANY(ARRAY(SELECT n.id FROM new_rows AS n WHERE n.dequeued_on IS NOT NULL))
              AND e.dequeued_on IS NOT NULL
            RETURNING e.*
        )
        INSERT INTO tickler_event_history SELECT * FROM moved;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tickler_move_finished_updated AFTER UPDATE ON tickler_event
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_move_finished();
CREATE TRIGGER tickler_move_finished_inserted AFTER INSERT ON tickler_event
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_move_finished();


-- The counters (0001) count the rows of both tables: tickler_event's by state as before, the
-- history's by outcome, and the history's also by day (tickler_history_count, what dropping a
-- day subtracts). A finish through an UPDATE counts open -> outcome, then its move counts the row
-- out of tickler_event and into history; a finish that deletes the open row and inserts it into
-- history (ack_leases) counts open out and the outcome in.
CREATE OR REPLACE FUNCTION tickler_count_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'tickler_event_history' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO tickler_history_count AS c (day, queue, outcome, slot, n)
            SELECT (dequeued_on AT TIME ZONE 'UTC')::date, queue, outcome, pg_backend_pid() % 16, count(*)
            FROM new_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
            ON CONFLICT (day, queue, outcome, slot) DO UPDATE SET n = c.n + excluded.n;
            INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
            SELECT queue, outcome, pg_backend_pid() % 64, count(*)
            FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
        ELSE
            INSERT INTO tickler_history_count AS c (day, queue, outcome, slot, n)
            SELECT (dequeued_on AT TIME ZONE 'UTC')::date, queue, outcome, pg_backend_pid() % 16, -count(*)
            FROM old_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
            ON CONFLICT (day, queue, outcome, slot) DO UPDATE SET n = c.n + excluded.n;
            INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
            SELECT queue, outcome, pg_backend_pid() % 64, -count(*)
            FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, count(*)
        FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, -count(*)
        FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    ELSE
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, state, pg_backend_pid() % 64, sum(delta)
        FROM (
            SELECT queue, coalesce(outcome, 'open') AS state, 1 AS delta FROM new_rows
            UNION ALL
            SELECT queue, coalesce(outcome, 'open'), -1 FROM old_rows
        ) AS changes
        GROUP BY 1, 2 HAVING sum(delta) <> 0 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;


-- Move what is there. The partitions of the data from before the upgrade: one per table, up to
-- the start of today (UTC); today's and the next days' come from the maintenance pass.
DO $$
DECLARE
    v_today timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
BEGIN
    EXECUTE format('CREATE TABLE tickler_event_history_upgraded PARTITION OF tickler_event_history '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', v_today);
    EXECUTE format('CREATE TABLE tickler_timeline_upgraded PARTITION OF tickler_timeline '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', v_today);
    INSERT INTO tickler_history_partition (name, parent, day_from, day_to) VALUES
        ('tickler_event_history_upgraded', 'tickler_event_history', NULL, v_today),
        ('tickler_timeline_upgraded', 'tickler_timeline', NULL, v_today);
END
$$;
SELECT tickler_maintain_history();

-- Finished events into history (counted below, once the copy is done). The open ones are
-- written back into a fresh tickler_event: the table and its indexes start small instead of
-- holding every finished row's dead version until a VACUUM FULL.
INSERT INTO tickler_event_history SELECT * FROM tickler_event WHERE dequeued_on IS NOT NULL;
CREATE TEMPORARY TABLE tickler_open_at_upgrade ON COMMIT DROP AS
    SELECT * FROM tickler_event WHERE dequeued_on IS NULL;
TRUNCATE tickler_event;
INSERT INTO tickler_event OVERRIDING SYSTEM VALUE SELECT * FROM tickler_open_at_upgrade;

INSERT INTO tickler_timeline (id, queue, item_key, event_id, at, action, actor, schedule_on, details)
OVERRIDING SYSTEM VALUE
SELECT id, queue, item_key, event_id, at, action, actor, schedule_on, details
FROM tickler_timeline_before_0021 ORDER BY id;
SELECT setval(pg_get_serial_sequence('tickler_timeline', 'id'),
              greatest((SELECT max(id) FROM tickler_timeline), 1),
              (SELECT max(id) FROM tickler_timeline) IS NOT NULL);

-- The counters, recounted from what is there (the re-insert above counted the open events again).
DELETE FROM tickler_queue_count;
INSERT INTO tickler_queue_count (queue, state, slot, n)
SELECT queue, coalesce(outcome, 'open'), 0, count(*) FROM tickler_event_all GROUP BY 1, 2;

-- The timeline's rules, on the new table: append-only except for the archive (0001), and the
-- dashboard's per-minute rollup (0012). The rollup trigger is created after the copy: those
-- rows were counted when they were written.
CREATE TRIGGER tickler_timeline_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tickler_timeline
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_timeline_append_only();
CREATE TRIGGER tickler_count_minutes AFTER INSERT ON tickler_timeline
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_minutes();

CREATE TRIGGER tickler_count_history_inserted AFTER INSERT ON tickler_event_history
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();
CREATE TRIGGER tickler_count_history_deleted AFTER DELETE ON tickler_event_history
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();
-- (created after the copy into history: its days are counted here, in one pass)
INSERT INTO tickler_history_count (day, queue, outcome, slot, n)
SELECT (dequeued_on AT TIME ZONE 'UTC')::date, queue, outcome, 0, count(*) FROM tickler_event_history GROUP BY 1, 2, 3;


-- Every timeline entry as users read it (0016), over the new timeline table; a running lease's
-- `claimed` entry comes from the open event, as before.
DROP VIEW tickler_timeline_entry;
DROP TABLE tickler_timeline_before_0021;
CREATE VIEW tickler_timeline_entry AS
SELECT t.id, 1 AS step, t.queue, t.item_key, t.event_id, c.at, 'claimed' AS action,
       coalesce(t.details -> 'claim' ->> 'by', t.actor) AS actor,
       coalesce(CAST(t.details -> 'claim' ->> 'schedule_on' AS timestamptz), t.schedule_on) AS schedule_on,
       tickler_claim_details(
           CAST(coalesce(t.details -> 'claim' ->> 'lease_id', t.details ->> 'lease_id') AS uuid),
           CAST(coalesce(t.details -> 'claim' ->> 'attempt', t.details ->> 'attempt') AS integer),
           c.at + make_interval(secs => CAST(t.details -> 'claim' ->> 'lease_seconds' AS double precision)),
           t.details -> 'claim' ->> 'group_key') AS details
FROM tickler_timeline AS t
CROSS JOIN LATERAL (
    SELECT t.at - make_interval(secs => CAST(t.details -> 'claim' ->> 'ago' AS double precision)) AS at
) AS c
WHERE t.details ? 'claim'
UNION ALL
SELECT t.id, 2, t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details - 'claim'
FROM tickler_timeline AS t
UNION ALL
SELECT NULL, 3, e.queue, e.item_key, e.id, e.claimed_on, 'claimed', e.claimed_by, e.schedule_on,
       tickler_claim_details(e.lease_id, e.redeliver_count + 1, e.claimed_expires_on, e.group_key)
FROM tickler_event AS e
WHERE e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.claimed_expires_on IS NOT NULL;

ALTER TABLE tickler_history_count SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
