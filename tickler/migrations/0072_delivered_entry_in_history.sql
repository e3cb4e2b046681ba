-- Issue #21 (WAL per delivered event): a delivery's timeline entry is its history row.
--
-- An ack moved each event into history (one heap row) and wrote its `delivered` timeline row
-- (another, with its own B-tree entry), and the two hold the same facts: the lease, the attempt,
-- who claimed it and when, when it finished. The timeline row was ~264 bytes of the ~1,300 bytes
-- of WAL per delivered event (bench/analysis.md, "A delivery's timeline entry is its history
-- row": 1,303 -> 1,016 bytes per event in the prototype).
--
-- Now an ack gives the history row `entry_id` — the id its timeline row would have had, from the
-- timeline's own sequence, so the entry keeps its place among the key's entries — and writes no
-- timeline row. `tickler_timeline_all` is the timeline as it was: the rows of tickler_timeline
-- and, for each history row with an entry_id, the row the ack used to write, built by the same
-- function (tickler_with_claim) from the same values, so that everything that reads it (the
-- entries users see, the key's latest event, the pipeline and its archive) reads the same rows.
-- An ack with trace ids (SPEC §11) still writes its rows: the trace id is not in history.
--
-- Old rows keep entry_id NULL (their entries are in tickler_timeline), and so does every event
-- in tickler_event (the column is there because history has the events' columns, in their
-- order: a finishing move is `INSERT INTO tickler_event_history SELECT * FROM moved`).

ALTER TABLE tickler_event ADD COLUMN entry_id bigint;
ALTER TABLE tickler_event_history ADD COLUMN entry_id bigint;

COMMENT ON COLUMN tickler_event_history.entry_id IS
    'The id of the event''s `delivered` timeline entry when that entry is this row (an ack since 0072; tickler_timeline_all).';

CREATE OR REPLACE VIEW tickler_event_all AS
SELECT * FROM tickler_event
UNION ALL
SELECT * FROM tickler_event_history;

-- A key's entries that live in history, by entry id (each day of history), as
-- tickler_timeline_key (queue, item_key, id) serves the timeline's rows; rows without one write
-- no entry.
CREATE INDEX tickler_event_history_entry ON tickler_event_history (queue, item_key, entry_id)
    WHERE entry_id IS NOT NULL;

-- The timeline's rows as they were written before 0072: tickler_timeline, and the `delivered`
-- row of each history row that is its own entry — the text ack_leases wrote, from the same
-- values. Read it wherever the timeline's rows are read (never written: tickler_timeline_write
-- writes the table).
CREATE VIEW tickler_timeline_all AS
SELECT t.id, t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details
FROM tickler_timeline AS t
UNION ALL
SELECT h.entry_id, h.queue, h.item_key, h.id, h.dequeued_on, 'delivered', h.dequeued_by, h.schedule_on,
       tickler_with_claim(jsonb_build_object('lease_id', h.lease_id, 'attempt', h.redeliver_count + 1),
                          h.dequeued_on, h.dequeued_by, h.schedule_on, h.claimed_on, h.claimed_by,
                          h.claimed_expires_on, h.lease_id, h.redeliver_count + 1, h.group_key, h.schedule_on)
FROM tickler_event_history AS h
WHERE h.entry_id IS NOT NULL;

-- A key's newest entries (at most p_limit, below id p_before when given; of one event when
-- p_event_id is given; only events' entries, not a schedule's, when p_events_only), newest first: what the key's latest event, a finished event by id, retry
-- and the dashboard's timeline page read. The view above cannot serve "newest first" by index:
-- PostgreSQL does not merge a UNION ALL branch that has a WHERE clause into the append of the
-- other one, so its history side would read and sort every delivery of the key. Here each side
-- reads its own index newest first (tickler_timeline_key; tickler_event_history_entry) and stops
-- at p_limit rows. A LANGUAGE sql STABLE function of one SELECT: the planner inlines it. The
-- collations are the indexes' own, said explicitly: inlined, the parameters take the call's input
-- collation, which a call with columns of both (queue: default, item_key: "C") leaves undecided,
-- and a comparison in another collation than an index's cannot use it.
CREATE FUNCTION tickler_timeline_newest(
    p_queue text, p_item_key text, p_events_only boolean, p_event_id bigint, p_before bigint, p_limit integer
) RETURNS TABLE (id bigint, event_id bigint, at timestamptz, schedule_on timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT x.id, x.event_id, x.at, x.schedule_on
    FROM (
        (SELECT t.id, t.event_id, t.at, t.schedule_on
         FROM tickler_timeline AS t
         WHERE t.queue = p_queue COLLATE "default" AND t.item_key = p_item_key COLLATE "C"
           AND (NOT p_events_only OR t.event_id IS NOT NULL)
           AND (p_event_id IS NULL OR t.event_id = p_event_id)
           AND (p_before IS NULL OR t.id < p_before)
         ORDER BY t.id DESC LIMIT p_limit)
        UNION ALL
        (SELECT h.entry_id, h.id, h.dequeued_on, h.schedule_on
         FROM tickler_event_history AS h
         WHERE h.queue = p_queue COLLATE "default" AND h.item_key = p_item_key COLLATE "C" AND h.entry_id IS NOT NULL
           AND (p_event_id IS NULL OR h.id = p_event_id)
           AND (p_before IS NULL OR h.entry_id < p_before)
         ORDER BY h.entry_id DESC LIMIT p_limit)
    ) AS x
    ORDER BY x.id DESC LIMIT p_limit
$$;

-- A deleted queue's delivered entries, kept: its history rows are deleted with it, and its keys'
-- timelines stay (README: a queue deleted). Before that delete, the entries that are history
-- rows are written into tickler_timeline with the ids they have, as the view renders them. Not a
-- new entry (tickler_timeline_write writes those): the same entry moved. Returns how many.
CREATE FUNCTION tickler_timeline_keep_entries(p_queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_kept bigint;
BEGIN
    INSERT INTO tickler_timeline (id, queue, item_key, event_id, at, action, actor, schedule_on, details)
    OVERRIDING SYSTEM VALUE
    SELECT a.id, a.queue, a.item_key, a.event_id, a.at, a.action, a.actor, a.schedule_on, a.details
    FROM tickler_timeline_all AS a
    WHERE a.queue = p_queue AND a.action = 'delivered'
      AND a.id IN (SELECT h.entry_id FROM tickler_event_history AS h WHERE h.queue = p_queue AND h.entry_id IS NOT NULL);
    GET DIAGNOSTICS v_kept = ROW_COUNT;
    RETURN v_kept;
END
$$;

-- Every timeline entry as users read it (latest: 0021), over tickler_timeline_all.
CREATE OR REPLACE VIEW tickler_timeline_entry AS
SELECT t.id, 1 AS step, t.queue, t.item_key, t.event_id, c.at, 'claimed' AS action,
       coalesce(t.details -> 'claim' ->> 'by', t.actor) AS actor,
       coalesce(CAST(t.details -> 'claim' ->> 'schedule_on' AS timestamptz), t.schedule_on) AS schedule_on,
       tickler_claim_details(
           CAST(coalesce(t.details -> 'claim' ->> 'lease_id', t.details ->> 'lease_id') AS uuid),
           CAST(coalesce(t.details -> 'claim' ->> 'attempt', t.details ->> 'attempt') AS integer),
           c.at + make_interval(secs => CAST(t.details -> 'claim' ->> 'lease_seconds' AS double precision)),
           t.details -> 'claim' ->> 'group_key') AS details
FROM tickler_timeline_all AS t
CROSS JOIN LATERAL (
    SELECT t.at - make_interval(secs => CAST(t.details -> 'claim' ->> 'ago' AS double precision)) AS at
) AS c
WHERE t.details ? 'claim'
UNION ALL
SELECT t.id, 2, t.queue, t.item_key, t.event_id, t.at, t.action, t.actor, t.schedule_on, t.details - 'claim'
FROM tickler_timeline_all AS t
UNION ALL
SELECT NULL, 3, e.queue, e.item_key, e.id, e.claimed_on, 'claimed', e.claimed_by, e.schedule_on,
       tickler_claim_details(e.lease_id, e.redeliver_count + 1, e.claimed_expires_on, e.group_key)
FROM tickler_event AS e
WHERE e.dequeued_on IS NULL AND e.lease_id IS NOT NULL AND e.claimed_expires_on IS NOT NULL;

-- The counters of history (latest: 0021), the same, and the dashboard's per-minute rollup of the
-- deliveries that are their own entry: tickler_count_minutes counted them when their timeline
-- row was inserted (0064's statement, for these rows).
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
            IF EXISTS (SELECT 1 FROM new_rows WHERE entry_id IS NOT NULL) THEN
                INSERT INTO tickler_minute_stat AS s (queue, ring, slot, minute, delivered, failed)
                SELECT DISTINCT ON (queue, ring) queue, ring, pg_backend_pid() % 16, minute, delivered, 0
                FROM (
                    SELECT queue, date_trunc('minute', dequeued_on) AS minute,
                           (floor(extract(epoch FROM date_trunc('minute', dequeued_on)) / 60)::bigint % 120)::smallint
                               AS ring,
                           count(*) AS delivered
                    FROM new_rows
                    WHERE entry_id IS NOT NULL
                    GROUP BY 1, 2
                ) AS m
                ORDER BY queue, ring, minute DESC
                ON CONFLICT (queue, ring, slot) DO UPDATE SET
                    delivered = CASE WHEN s.minute = excluded.minute THEN s.delivered + excluded.delivered
                                     ELSE excluded.delivered END,
                    failed = CASE WHEN s.minute = excluded.minute THEN s.failed ELSE 0 END,
                    minute = excluded.minute
                WHERE s.minute <= excluded.minute;  -- an older minute never overwrites a newer one
            END IF;
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
