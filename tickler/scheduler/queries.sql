-- Every runtime query of tickler, by name. Loaded once by scheduler/sql.py.
-- Conventions:
--   * `:now` is the time to act at; NULL means the database clock (now()). Tests bind it to move
--     the clock; production code leaves it NULL, so time never comes from a worker's clock.
--   * Every statement that changes an event writes its timeline entry in the same statement
--     (a data-modifying CTE), so no change can happen without its history. A claim's `claimed`
--     entry is the one exception: the statement that ends the lease writes it, in its own row
--     (details -> 'claim', see tickler_with_claim() and tickler_timeline_entry in
--     scheduler/database/).
--   * Statements that return events return whole rows plus `status` (tickler_status()).
--   * tickler_event holds open events only. A statement that finishes events (sets dequeued_on)
--     still updates them there, and returns them; the same statement moves them into
--     tickler_event_history (tickler_event_updated, scheduler/database/event_triggers.sql). Reads
--     of an event, open or finished, read tickler_event, then history through the key's timeline
--     (tickler_history_event, scheduler/database/history.sql: history has no index by id alone).

-- fragment: schedule_items
-- tickler_schedule_events() (scheduler/database/writing.sql: the one path that writes events, their
-- timeline, trace contexts and the wake-up handshake) over the call's events, one typed array per
-- field (EventStore sends Python lists), but the data: one JSON array (one text to write and to
-- parse, where an array of jsonb is a quoted text per item), split here; with_events: answer with
-- the rows too.
tickler_schedule_events(
    :queue, :actor, :on_conflict, CAST(:now AS timestamptz), CAST(:debounce_max_seconds AS double precision),
    :with_events, CAST(:item_key AS text[]), CAST(:group_key AS text[]), CAST(:schedule_on AS timestamptz[]),
    CAST(:delay_seconds AS double precision[]),
    ARRAY(SELECT nullif(d.value, 'null') FROM jsonb_array_elements(CAST(:data AS jsonb)) WITH ORDINALITY AS d
          ORDER BY d.ordinality),
    CAST(:max_attempts AS integer[]),
    CAST(:priority AS smallint[]), CAST(:fairness_key AS text[]), CAST(:traceparent AS text[]),
    CAST(:tracestate AS text[]))

-- name: schedule_events
-- Schedule events and answer with them: per item, in order, its outcome (`scheduled`: the
-- event's own `outcome` is how it finished) and the event written or the open event that holds
-- the key. A single-event call, or those of concurrent requests (group commit).
SELECT r.ord, r.outcome AS scheduled, (r.event).*,
       tickler_status((r.event).outcome, (r.event).lease_expires_on, coalesce(CAST(:now AS timestamptz), now()))
           AS status
FROM
    -- include: schedule_items
    AS r;

-- name: schedule_batch
-- Schedule a batch: per item, in order, its key, outcome and the id of the event written or of the
-- open event that holds the key.
SELECT r.item_key, r.outcome, r.id
FROM
    -- include: schedule_items
    AS r;

-- name: schedule_many
-- The same for a caller that holds its events as one JSON array (:events; recurring schedules),
-- through tickler_schedule(): one row per event, in order.
SELECT r.ord, r.item_key, r.outcome, r.id
FROM tickler_schedule(:queue, CAST(:events AS jsonb), :actor, :on_conflict, CAST(:now AS timestamptz),
                      CAST(:debounce_max_seconds AS double precision)) AS r;

-- name: get_open_event
-- The open event of a key, if any.
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, coalesce(CAST(:now AS timestamptz), now())) AS status
FROM tickler_event AS e
WHERE e.queue = :queue AND e.item_key = :item_key AND e.dequeued_on IS NULL;

-- name: get_latest_event
-- The open event of a key, else its most recent one: the event of the key's newest timeline entry,
-- found in history by that entry (a finished event's last entry is its finish: its day, queue
-- and schedule_on; tickler_history_event).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
open_event AS (
    SELECT e.* FROM tickler_event AS e
    WHERE e.queue = :queue AND e.item_key = :item_key AND e.dequeued_on IS NULL
),
latest AS (  -- the newest entry of an event, in the timeline or, a delivery's, its history row
    SELECT t.event_id, t.at, t.schedule_on
    FROM tickler_timeline_newest(:queue, :item_key, true, NULL, NULL, 1) AS t
    WHERE NOT EXISTS (SELECT 1 FROM open_event)
)
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, clock.now) AS status
FROM open_event AS e CROSS JOIN clock
UNION ALL
SELECT h.*, tickler_status(h.outcome, h.lease_expires_on, clock.now) AS status
FROM latest AS l CROSS JOIN clock
CROSS JOIN LATERAL tickler_history_event(CAST(:queue AS text), l.event_id, l.schedule_on, l.at) AS h;

-- name: get_events_by_id
-- Events of one key by id, open or finished, in no particular order. A finished one is found
-- through its newest entry in the key's timeline (tickler_history_event).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
wanted AS (SELECT DISTINCT w.id FROM unnest(CAST(:ids AS bigint[])) AS w (id)),
open_events AS (
    SELECT e.* FROM tickler_event AS e
    WHERE e.id = ANY(CAST(:ids AS bigint[])) AND e.queue = :queue AND e.item_key = :item_key
),
finished AS (
    SELECT w.id, l.at, l.schedule_on
    FROM wanted AS w
    CROSS JOIN LATERAL tickler_timeline_newest(:queue, :item_key, true, w.id, NULL, 1) AS l
    WHERE w.id NOT IN (SELECT id FROM open_events)
)
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, clock.now) AS status
FROM open_events AS e CROSS JOIN clock
UNION ALL
SELECT h.*, tickler_status(h.outcome, h.lease_expires_on, clock.now) AS status
FROM finished AS f CROSS JOIN clock
CROSS JOIN LATERAL tickler_history_event(CAST(:queue AS text), f.id, f.schedule_on, f.at) AS h;

-- name: lock_open_event
-- The open event of a key, locked for a change in this transaction, with the time to act at. A
-- lease of it whose time is up is ended first (tickler_lock_open_event): the
-- event is then the pending event it really is, or gone when that was its last attempt.
SELECT e.*, tickler_status(e.outcome, e.lease_expires_on, clock.now) AS status, clock.now AS db_now
FROM (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
CROSS JOIN LATERAL tickler_lock_open_event(:queue, :item_key, clock.now) AS e;

-- name: change_event
-- Change the open event of a key, or say why not (tickler_change_event, scheduler/database/writing.sql).
SELECT r.refused, (r.event).*, tickler_status((r.event).outcome, (r.event).lease_expires_on, clock.now) AS status
FROM (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
CROSS JOIN LATERAL tickler_change_event(
    :queue, :item_key, :actor, CAST(:reason AS text), clock.now, CAST(:if_match AS integer[]),
    CAST(:schedule_on AS timestamptz), CAST(:delay_seconds AS double precision),
    CAST(:set_data AS boolean), CAST(:data AS jsonb), CAST(:set_group_key AS boolean), CAST(:group_key AS text),
    CAST(:set_priority AS boolean), CAST(:priority AS smallint),
    CAST(:set_fairness_key AS boolean), CAST(:fairness_key AS text)
) AS r;

-- name: cancel_event
-- Cancel the open event of a key, or say why not (tickler_cancel_event, scheduler/database/writing.sql).
SELECT r.refused, (r.event).*, tickler_status((r.event).outcome, (r.event).lease_expires_on, clock.now) AS status
FROM (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
CROSS JOIN LATERAL tickler_cancel_event(
    :queue, :item_key, :actor, CAST(:reason AS text), clock.now, CAST(:if_match AS integer[])
) AS r;

-- name: cancel_matching
-- Cancel every open event of a queue with this group and/or key prefix that is not in flight.
-- The prefix is a range [prefix, prefix_end) on the "C"-collated key (prefix_end NULL: no end).
-- A lease whose time is up is over: it ends here as the reaper would end it (see
-- expired_attempt_ended below), and the event is cancelled — or dead, when it was its last attempt.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
matching AS (
    SELECT e.id, e.lease_id, e.claimed_by, e.lease_expires_on, e.claimed_on, e.claimed_expires_on,
           (e.lease_id IS NOT NULL AND tickler_attempts_used_up(e.redeliver_count + 1, e.max_attempts)) AS dies
    FROM tickler_event AS e CROSS JOIN clock
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND NOT coalesce(e.lease_expires_on > clock.now, false)
      AND (CAST(:group_key AS text) IS NULL OR e.group_key = CAST(:group_key AS text))
      AND (CAST(:prefix AS text) IS NULL OR e.item_key >= CAST(:prefix AS text) COLLATE "C")
      AND (CAST(:prefix_end AS text) IS NULL OR e.item_key < CAST(:prefix_end AS text) COLLATE "C")
    FOR UPDATE OF e
),
changed AS (
    UPDATE tickler_event AS e
    SET dequeued_on = clock.now, dequeued_by = :actor, outcome = 'cancelled',
        lease_id = NULL, lease_expires_on = NULL,
        redeliver_count = e.redeliver_count + CASE WHEN e.lease_id IS NULL THEN 0 ELSE 1 END,
        last_error = CASE WHEN e.lease_id IS NULL THEN e.last_error ELSE 'lease expired' END,
        version = e.version + 1, changed_on = clock.now
    FROM clock
    WHERE e.id = ANY(ARRAY(SELECT id FROM matching WHERE NOT dies))  -- primary-key lookups (see claim_events)
    RETURNING e.*
),
died AS (  -- those on their last attempt die, as the reaper has them
    SELECT count(*) AS n
    FROM tickler_end_expired_leases(ARRAY(SELECT id FROM matching WHERE dies), 'tickler', (SELECT now FROM clock))
    WHERE EXISTS (SELECT 1 FROM matching WHERE dies)
),
logged AS (
    SELECT tickler_timeline_write(array_agg(ROW(
               c.queue, c.item_key, c.id, c.dequeued_on, a.action, a.actor, c.schedule_on, a.details
           )::tickler_timeline_row ORDER BY c.id, a.step)) AS written
    FROM changed AS c
    LEFT JOIN matching AS x ON x.id = c.id AND x.lease_id IS NOT NULL
    CROSS JOIN LATERAL (VALUES
        (1, 'lease_expired', 'tickler',
         CASE WHEN x.id IS NOT NULL THEN
             tickler_with_claim(tickler_lease_expired_details(x.lease_id, x.claimed_by, x.lease_expires_on),
                                c.dequeued_on, 'tickler', c.schedule_on, x.claimed_on, x.claimed_by,
                                x.claimed_expires_on, x.lease_id, c.redeliver_count, c.group_key, c.schedule_on) END),
        (2, 'cancelled', c.dequeued_by,
         jsonb_strip_nulls(jsonb_build_object('reason', CAST(:reason AS text), 'bulk', true)))
    ) AS a (step, action, actor, details)
    WHERE a.step = 2 OR x.id IS NOT NULL
)
SELECT count(*) AS cancelled FROM changed CROSS JOIN died CROSS JOIN logged;

-- name: expire_leases
-- The reaper: end leases whose time is up (optionally only in one queue) with
-- tickler_end_expired_leases() (scheduler/database/finishing.sql), which claims, replace,
-- debounce, reschedule and cancel also use when they meet such a lease: the event is claimable
-- again and the attempt counts as a redelivery; an event whose last allowed attempt it was is
-- finished as dead.
-- The expired leases are read in tickler_lease (the events in flight only).
SELECT x.id, x.queue, x.exhausted
FROM tickler_end_expired_leases(ARRAY(
    SELECT l.event_id FROM tickler_lease AS l
    WHERE l.expires_on <= coalesce(CAST(:now AS timestamptz), now())
      AND (CAST(:queue AS text) IS NULL OR l.queue = CAST(:queue AS text))
), :actor, CAST(:now AS timestamptz)) AS x;

-- name: timeline
-- Every timeline entry of a key, across all its events, oldest first (a running lease's
-- `claimed` entry included: see tickler_timeline_entry).
SELECT at, action, actor, event_id, schedule_on, details
FROM tickler_timeline_entry
WHERE queue = :queue AND item_key = :item_key
ORDER BY id, step;

-- name: queue_state_counts
-- Events per state of a queue, from the trigger-kept counters (no scan of events).
SELECT state, sum(n)::bigint AS n FROM tickler_queue_count WHERE queue = :queue GROUP BY state;

-- name: queue_live_counts
-- The time-dependent counts of a queue: events under a live lease, and open events whose time
-- has come (due) that are not under a live lease (tickler_live_counts in
-- scheduler/database/counters.sql: through indexes only; the clock goes in as an expression so
-- that the planner sees its value).
SELECT c.in_flight, c.due FROM tickler_live_counts(:queue, coalesce(CAST(:now AS timestamptz), now())) AS c;

-- name: wait_for_history_pass
-- Wait for another process's history pass to end (the lock tickler_maintain_history takes; a
-- transaction-level advisory lock, which the pass's own try-lock then finds held by itself).
SELECT pg_advisory_xact_lock(hashtext('tickler.history'));

-- name: maintain_history
-- The history's maintenance pass (tickler_maintain_history, scheduler/database/history.sql): day
-- partitions created ahead with a part per retention class, rows in the default partitions given
-- their day, the parts of days past their queues' retention dropped.
SELECT m.created, m.dropped
FROM tickler_maintain_history(CAST(:now AS timestamptz), CAST(:days_ahead AS integer)) AS m;

-- name: hot_tables
-- The hot tables (:tables) that this role may analyze and vacuum (owner or superuser), with what
-- scheduler/store/statistics.py does for them:
--   stale    its planner statistics are missing or old: at least :min_rows live rows, and never
--            analyzed (by ANALYZE or autovacuum; pg_class.reltuples -1) or holding more than
--            :growth times the rows the last ANALYZE or VACUUM found;
--   crowded  one of :swept (read whole by every claim) holding at least :min_dead dead rows and no
--            fewer dead rows than live ones.
-- The rows are the statistics views' counts of committed inserts, updates and deletes, which the
-- writing backends report within a second or so of their commits. Not the file's size: it grows
-- while a large insert is uncommitted, and an ANALYZE then would sample none of its rows and
-- record an empty table.
SELECT c.relname AS table_name, s.n_live_tup AS rows_now, c.reltuples AS rows_then,
       s.n_live_tup >= :min_rows AND (c.reltuples < 0 OR s.n_live_tup > :growth * greatest(c.reltuples, 1))
           AS stale,
       c.relname = ANY(CAST(:swept AS text[])) AND s.n_dead_tup >= :min_dead AND s.n_dead_tup >= s.n_live_tup
           AS crowded
FROM pg_class AS c
JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = ANY(ARRAY(SELECT to_regclass(name) FROM unnest(CAST(:tables AS text[])) AS name))
  AND (pg_has_role(c.relowner, 'USAGE') OR (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user))
ORDER BY c.relname;

-- name: upsert_queue
-- Create a queue or change its settings; `created` tells which. Dispatchers are woken, so that
-- they start serving a new webhook queue at once.
WITH upserted AS (
INSERT INTO tickler_queue AS q (
    name, delivery_mode, webhook_url, webhook_timeout_seconds, signing_secret,
    lease_seconds, max_attempts, backoff_initial_seconds, backoff_max_seconds, backoff_multiplier,
    max_in_flight, rate_per_second, retention_days, archive_before_prune, fair_share, max_in_flight_per_key)
VALUES (
    :name, :delivery_mode, :webhook_url, :webhook_timeout_seconds, :signing_secret,
    :lease_seconds, :max_attempts, :backoff_initial_seconds, :backoff_max_seconds, :backoff_multiplier,
    :max_in_flight, :rate_per_second, :retention_days, :archive_before_prune, :fair_share, :max_in_flight_per_key)
ON CONFLICT (name) DO UPDATE SET
    delivery_mode = excluded.delivery_mode,
    webhook_url = excluded.webhook_url,
    webhook_timeout_seconds = excluded.webhook_timeout_seconds,
    -- a rotated secret keeps signing beside the new one for a day, so receivers can switch over
    previous_signing_secret = CASE
        WHEN q.signing_secret IS DISTINCT FROM excluded.signing_secret THEN q.signing_secret
        ELSE q.previous_signing_secret END,
    previous_secret_until = CASE
        WHEN q.signing_secret IS DISTINCT FROM excluded.signing_secret AND q.signing_secret IS NOT NULL
            THEN now() + interval '24 hours'
        ELSE q.previous_secret_until END,
    signing_secret = excluded.signing_secret,
    lease_seconds = excluded.lease_seconds,
    max_attempts = excluded.max_attempts,
    backoff_initial_seconds = excluded.backoff_initial_seconds,
    backoff_max_seconds = excluded.backoff_max_seconds,
    backoff_multiplier = excluded.backoff_multiplier,
    max_in_flight = excluded.max_in_flight,
    rate_per_second = excluded.rate_per_second,
    retention_days = excluded.retention_days,
    archive_before_prune = excluded.archive_before_prune,
    fair_share = excluded.fair_share,
    max_in_flight_per_key = excluded.max_in_flight_per_key,
    updated_on = now()
RETURNING q.*, (q.xmax = 0) AS created
),
wake AS (SELECT pg_notify('tickler_wake', '~' || name) FROM upserted)  -- '~': settings changed
SELECT u.* FROM upserted AS u CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w;

-- name: get_queue
-- One queue's settings.
SELECT * FROM tickler_queue WHERE name = :name;

-- name: get_queue_for_update
-- One queue's settings, locked while they are changed.
SELECT * FROM tickler_queue WHERE name = :name FOR UPDATE;

-- name: list_queues
-- Every queue (or those named), by name.
SELECT * FROM tickler_queue
WHERE CAST(:names AS text[]) IS NULL OR name = ANY(CAST(:names AS text[]))
ORDER BY name;

-- name: create_token
-- Store a new token's hash. A request that sends an issue key issues one token per key: with a
-- key already used, nothing is stored and no row returns (issued_token finds that token).
INSERT INTO tickler_token (principal, token_hash, is_admin, queues, issue_key)
VALUES (:principal, :token_hash, :is_admin, CAST(:queues AS text[]), :issue_key)
ON CONFLICT (issue_key) WHERE issue_key IS NOT NULL DO NOTHING
RETURNING id, principal, is_admin, queues, created_on, revoked_on, last_used_on;

-- name: issued_token
-- The token that a request with this issue key made.
SELECT id, principal, is_admin, queues, created_on, revoked_on, last_used_on FROM tickler_token
WHERE issue_key = :issue_key;

-- name: token_used
-- Record that a token was used now, unless another process did within the last minute (each
-- process writes at most once a minute per token: api/token_use.py).
UPDATE tickler_token SET last_used_on = now()
WHERE token_hash = :token_hash AND (last_used_on IS NULL OR last_used_on < now() - interval '1 minute');

-- name: find_token
-- The principal behind a token hash, unless revoked.
SELECT principal, is_admin, queues FROM tickler_token
WHERE token_hash = :token_hash AND revoked_on IS NULL;

-- name: prepare_to_sleep
-- A dispatcher about to sleep: lock its queues' rows (waiting for writers that hold them), then
-- (next statement, fresh snapshot) find the next due time. See tickler_queue.next_wake.
SELECT name FROM tickler_queue WHERE name = ANY(CAST(:queues AS text[])) ORDER BY name FOR UPDATE;

-- name: next_due
-- The earliest schedule_on among claimable events of these queues (NULL: none). Events of a
-- group that holds a live lease are not claimable until it ends (its end wakes dispatchers).
-- Also the database's clock at the time of the read. Ungrouped events: tickler_first_claimable(),
-- one probe of the priority index per level.
SELECT min(next_on) AS next_on, clock_timestamp() AS db_now FROM (
    SELECT tickler_first_claimable(q) AS next_on
    FROM unnest(CAST(:queues AS text[])) AS q
    UNION ALL
    SELECT (SELECT e.schedule_on FROM tickler_event AS e
            WHERE e.queue = q AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM tickler_lease AS l WHERE l.queue = e.queue AND l.group_key = e.group_key)
            ORDER BY e.schedule_on, e.id LIMIT 1)
    FROM unnest(CAST(:queues AS text[])) AS q
) AS candidates;

-- name: set_next_wake
-- Record when the dispatchers of these queues will look next (under prepare_to_sleep's lock).
UPDATE tickler_queue SET next_wake = :next_wake WHERE name = ANY(CAST(:queues AS text[]));

-- name: claim_events
-- Lease up to :limit due, ungrouped events of a queue, one lease each, skipping rows that other
-- transactions hold. Returns the claimed events. An event whose lease expired and was not ended
-- yet is claimed first: its lease ends here as the reaper would end it (one more redelivery,
-- 'lease expired', a 'lease_expired' entry), or, when that was its last attempt, it dies through
-- tickler_end_expired_leases() instead of being claimed. A claim writes no `claimed` row: that
-- entry is read from the event while the lease runs, and written with the entry that ends it.
-- Order (SPEC §10): higher priority first, then earlier due time, strictly: each priority level
-- that has claimable events (`levels`: a skip scan, one index probe per level, highest first) is
-- read from its first due event on, and the claim stops reading once it has :limit events (the
-- levels and their scans are pulled lazily), so a batch never takes a lower level's event while
-- a higher level has due events it could take. A fair-share queue without a cap (:fair) is
-- claimed the same way, its unleased events as tickler_fair_pick() hands them out: priority
-- levels from the highest, round robin across fairness keys within a level. Two fair claims
-- that run at once both start from the queue's cursor: SKIP LOCKED hands them different events
-- (a key may then give one event to each), and the cursor keeps the move of one of them.
-- The statement is tickler_claim_events() (scheduler/database/claiming.sql): a PL/pgSQL function
-- planned once per session on a generic plan, where a prepared statement with LIMIT :limit would
-- be planned at every call. Its rows come in claim order.
-- Every row also says whether the queue has group work (`groups_due`, tickler_groups_due: asked
-- once, in the snapshot of the claim), which spares the dispatcher a statement of its own.
WITH groups AS MATERIALIZED (  -- one call, not one per row
    SELECT tickler_groups_due(:queue, CAST(:now AS timestamptz), CAST(:flow AS boolean)) AS due
)
SELECT (r.event).*, 'in_flight' AS status, r.lease_ended, r.died, g.due AS groups_due
FROM tickler_claim_events(:queue, :worker, CAST(:limit AS integer), CAST(:lease_seconds AS double precision),
                          CAST(:now AS timestamptz), CAST(:flow AS boolean), CAST(:fair AS boolean))
     WITH ORDINALITY AS r (event, lease_ended, died, n)
CROSS JOIN groups AS g
ORDER BY r.n;

-- name: claim_events_fair
-- Lease the ungrouped events tickler_fair_pick() hands out (scheduler/database/claiming.sql:
-- priority levels from the highest, round robin across fairness keys within a level, at most each
-- key's room under max_in_flight_per_key), one lease each. Only under the queue's flow lock, after
-- its expired leases were ended (expire_leases); due at the lock's time (:now is never NULL here).
-- The leases start when the pick is done (clock_timestamp() after it, unless a test fixes the time
-- with :claimed_at): a lease the pick saw ended, ended before the new ones began, so the timeline's
-- intervals show the per-key cap as the pick held it.
-- Like claim_events, every row also says whether the queue has group work (`groups_due`), and a
-- claim that took nothing returns one row of NULLs with it.
WITH picked AS MATERIALIZED (
    SELECT tickler_fair_pick(:queue, CAST(:now AS timestamptz), :limit, CAST(:cap AS integer)) AS ids
),
clock AS (SELECT coalesce(CAST(:claimed_at AS timestamptz), clock_timestamp()) AS now FROM picked),
claimed AS (
    UPDATE tickler_event AS e
    SET claimed_on = clock.now,
        claimed_by = :worker,
        lease_id = tickler_new_lease_id(),
        lease_expires_on = clock.now + make_interval(secs => :lease_seconds),
        claimed_expires_on = clock.now + make_interval(secs => :lease_seconds),
        version = e.version + 1, changed_on = clock.now
    FROM clock CROSS JOIN picked AS p
    WHERE e.id = ANY(p.ids)  -- primary-key lookups (see claim_events)
    RETURNING e.*
),
groups AS MATERIALIZED (SELECT tickler_groups_due(:queue, CAST(:now AS timestamptz), true) AS due)
SELECT c.*, 'in_flight' AS status, array_position(p.ids, c.id) AS handed_out, g.due AS groups_due
FROM picked AS p CROSS JOIN groups AS g LEFT JOIN claimed AS c ON true
ORDER BY array_position(p.ids, c.id);

-- name: flow_lock
-- A claim of a paused or limited queue: one claimer of the queue at a time, cluster-wide, until
-- its transaction ends. The room is read in the next statement (a fresh snapshot, which sees
-- every lease the previous holder committed).
SELECT pg_advisory_xact_lock(hashtextextended('tickler_flow/' || :queue, 0));

-- name: flow_room
-- How many leases and events a claim of this queue may take now (under flow_lock): none while
-- paused; max_in_flight minus its live leases (an expired lease is over, reaped or not); the
-- rate minus the events claimed within the window. `db_now` is the time to claim at: read after
-- the lock was granted, so that claimed_on follows the order in which claimers held it. The
-- queue's settings come along: read in the snapshot that finds the events, they are never older
-- than the claim (a signing secret rotated just before an event was scheduled signs it).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), clock_timestamp()) AS now),
settings AS (
    SELECT q.*, greatest(1.0, 1.0 / q.rate_per_second) AS window_seconds FROM tickler_queue AS q WHERE q.name = :queue
),
recent AS (
    SELECT coalesce(sum(w.n), 0) AS events, min(w.at) AS oldest
    FROM settings AS s CROSS JOIN clock
    CROSS JOIN LATERAL unnest(s.rate_window_at, s.rate_window_n) AS w (at, n)
    WHERE w.at > clock.now - make_interval(secs => s.window_seconds)
)
SELECT s.*, clock.now AS db_now,
       -- live leases in the lease table: one lease per ungrouped event, one per group
       CASE WHEN s.max_in_flight IS NULL THEN NULL ELSE s.max_in_flight - (
           SELECT count(*) FILTER (WHERE l.group_key IS NULL)
                  + count(DISTINCT l.lease_id) FILTER (WHERE l.group_key IS NOT NULL)
           FROM tickler_lease AS l
           WHERE l.queue = :queue AND l.expires_on > clock.now) END AS lease_room,
       CASE WHEN s.rate_per_second IS NULL THEN NULL
            ELSE floor(s.rate_per_second * s.window_seconds + 1e-9)::integer - r.events END AS event_room,
       -- when the window has room again: its oldest claim leaves it
       r.oldest + make_interval(secs => s.window_seconds) AS rate_room_at
FROM settings AS s CROSS JOIN clock CROSS JOIN recent AS r;

-- name: flow_record
-- Add a claim of a rate-limited queue to its window (under flow_lock), dropping what left it.
UPDATE tickler_queue AS q
SET (rate_window_at, rate_window_n) = (
    SELECT array_agg(w.at ORDER BY w.at) || CAST(:at AS timestamptz),
           array_agg(w.n ORDER BY w.at) || CAST(:events AS integer)
    FROM unnest(q.rate_window_at, q.rate_window_n) AS w (at, n)
    WHERE w.at > CAST(:at AS timestamptz) - make_interval(secs => greatest(1.0, 1.0 / q.rate_per_second)))
WHERE q.name = :queue AND q.rate_per_second IS NOT NULL;

-- name: has_due_events
-- Whether a queue has due, unleased, ungrouped events left (tickler_first_claimable(): one probe
-- of the priority index per level): a capped fair claim that took fewer than it asked for was
-- held back by max_in_flight_per_key.
SELECT coalesce(tickler_first_claimable(:queue) <= coalesce(CAST(:now AS timestamptz), now()), false) AS found;

-- name: lock_due_groups
-- Choose up to :limit groups of a queue that have due events and no live lease, and take a
-- transaction-level advisory lock on each (skipping groups another claimer is locking now).
-- Only the chosen candidates are locked: the lock runs on the limited, ordered candidate list.
-- A group whose lease expired without being ended yet is a candidate too: the lease of each
-- chosen group ends here (tickler_end_expired_leases(), as the reaper would end it), so that
-- claim_groups, the next statement, finds its events claimable (or dead).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
open_queue AS (
    SELECT CAST(:flow AS boolean) OR (SELECT NOT q.paused AND q.max_in_flight IS NULL AND q.rate_per_second IS NULL
                                             AND q.max_in_flight_per_key IS NULL
                                      FROM tickler_queue AS q WHERE q.name = :queue) AS open
),
due AS (
    (SELECT e.group_key, e.schedule_on, e.id, e.priority, e.fairness_key FROM tickler_event AS e
     WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL AND e.group_key IS NOT NULL
       AND e.schedule_on <= (SELECT now FROM clock) AND (SELECT open FROM open_queue)
     ORDER BY e.schedule_on, e.id
     LIMIT :scan)
    UNION ALL
    (SELECT e.group_key, e.schedule_on, e.id, e.priority, e.fairness_key
     FROM tickler_lease AS l JOIN tickler_event AS e ON e.id = l.event_id
     WHERE l.queue = :queue AND l.group_key IS NOT NULL AND l.expires_on <= (SELECT now FROM clock)
       AND (SELECT open FROM open_queue)
     ORDER BY l.expires_on
     LIMIT :scan)
),
-- A group is one unit with the highest priority among its due events (SPEC §10), then its first
-- due time. Its events share one fairness key (tickler_check_group_fairness): with
-- max_in_flight_per_key (:cap), a group is a candidate only while its key has room, and the
-- groups of one key that this claim may take are numbered against that room.
groups AS MATERIALIZED (
    SELECT d.group_key, max(d.priority) AS priority, min(d.schedule_on) AS first_due,
           min(d.fairness_key) AS fairness_key
    FROM due AS d
    WHERE NOT EXISTS (
        SELECT 1 FROM tickler_lease AS l
        WHERE l.queue = :queue AND l.group_key = d.group_key AND l.expires_on > (SELECT now FROM clock))
    GROUP BY d.group_key
),
roomy AS MATERIALIZED (
    SELECT g.group_key, g.priority, g.first_due FROM (
        SELECT g.*, row_number() OVER (PARTITION BY g.fairness_key ORDER BY g.priority DESC, g.first_due, g.group_key)
                    AS nth
        FROM groups AS g
    ) AS g
    WHERE CAST(:cap AS integer) IS NULL OR g.nth <= CAST(:cap AS integer) - (
        SELECT count(DISTINCT l.lease_id) FROM tickler_lease AS l
        WHERE l.queue = :queue AND l.fairness_key = g.fairness_key AND l.expires_on > (SELECT now FROM clock))
    ORDER BY g.priority DESC, g.first_due, g.group_key
),
chosen AS MATERIALIZED (
    SELECT g.group_key FROM roomy AS g
    WHERE pg_try_advisory_xact_lock(hashtextextended(:queue || '/' || g.group_key, 0))
    LIMIT :limit
),
leased AS MATERIALIZED (  -- a chosen group's leased rows: its lease is over (live ones are not chosen)
    SELECT l.event_id AS id FROM tickler_lease AS l JOIN chosen AS c ON l.group_key = c.group_key
    WHERE l.queue = :queue
),
ended AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM leased) THEN (
        SELECT count(*) FROM tickler_end_expired_leases(ARRAY(SELECT id FROM leased), 'tickler', (SELECT now FROM clock))
    ) ELSE 0 END AS n
)
SELECT c.group_key, e.n AS leases_ended FROM chosen AS c CROSS JOIN ended AS e;

-- name: claim_groups
-- Lease every due event of each locked group, one lease per group. Runs after lock_due_groups in
-- the same transaction, in a new statement: its snapshot sees every lease committed before the
-- advisory locks were taken, so a group that got a lease meanwhile is left alone.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
locked AS (
    SELECT g.group_key FROM unnest(CAST(:groups AS text[])) AS g (group_key)
    WHERE NOT EXISTS (
        SELECT 1 FROM tickler_lease AS l WHERE l.queue = :queue AND l.group_key = g.group_key COLLATE "C")
),
leases AS (
    SELECT group_key, tickler_new_lease_id() AS lease_id FROM locked
),
members AS (
    SELECT e.id, s.lease_id FROM tickler_event AS e
    JOIN leases AS s ON e.group_key = s.group_key COLLATE "C"
    WHERE e.queue = :queue AND e.dequeued_on IS NULL AND e.lease_id IS NULL
      AND e.schedule_on <= (SELECT now FROM clock)
    FOR UPDATE OF e SKIP LOCKED
),
claimed AS (
    UPDATE tickler_event AS e
    SET claimed_on = clock.now,
        claimed_by = :worker,
        lease_id = m.lease_id,
        lease_expires_on = clock.now + make_interval(secs => :lease_seconds),
        claimed_expires_on = clock.now + make_interval(secs => :lease_seconds),
        version = e.version + 1, changed_on = clock.now
    FROM members AS m CROSS JOIN clock
    WHERE e.id = m.id AND e.id = ANY(ARRAY(SELECT id FROM members))  -- primary-key lookups (see claim_events)
    RETURNING e.*
)
SELECT c.*, 'in_flight' AS status FROM claimed AS c ORDER BY c.group_key, c.schedule_on, c.id;

-- name: ack_leases
-- Finish every event of these live leases as delivered; returns the leases that were finished.
-- A lease that expired, was re-claimed or was already finished matches nothing (fencing).
-- The busiest finish moves its rows itself: deleted from the open events and inserted, finished,
-- into the history (no intermediate version of the row is written; see tickler_event_updated in
-- scheduler/database/event_triggers.sql). Each history row is its own `delivered` entry: it takes
-- the entry's id from the timeline's sequence, and tickler_timeline_all shows the row the timeline
-- would have held. With trace ids (not kept in history) the entries are written to the timeline.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
finished AS (
    DELETE FROM tickler_event AS e
    USING clock
    -- the leases' events by the lease table's primary key, checked on the row.
    -- `outcome IS NULL` is "open" (check finished_has_outcome): said with dequeued_on, it would
    -- let the planner prefer a partial index of open events, scanned whole for these ids.
    WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l WHERE l.lease_id = ANY(CAST(:lease_ids AS uuid[]))))
      AND e.lease_id = ANY(CAST(:lease_ids AS uuid[])) AND e.outcome IS NULL
      AND e.lease_expires_on > clock.now
      -- a caller limited to some queues cannot finish another tenant's lease (NULL: any queue)
      AND (CAST(:queues AS text[]) IS NULL OR e.queue = ANY(CAST(:queues AS text[])))
    RETURNING e.id, e.queue, e.item_key, e.group_key, e.schedule_on, e.data, e.enqueued_on, e.enqueued_by,
              clock.now AS dequeued_on, e.claimed_by AS dequeued_by, 'delivered' AS outcome, e.claimed_on,
              e.claimed_by, e.lease_id, e.lease_expires_on, e.redeliver_count, e.max_attempts, e.last_error,
              e.version + 1 AS version, e.claimed_expires_on,
              e.traceparent, e.tracestate, e.priority, e.fairness_key
),
moved AS (
    INSERT INTO tickler_event_history (
        id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
        outcome, claimed_on, claimed_by, lease_id, lease_expires_on, redeliver_count, max_attempts, last_error,
        version, claimed_expires_on,
        traceparent, tracestate, priority, fairness_key, entry_id)
    SELECT id, queue, item_key, group_key, schedule_on, data, enqueued_on, enqueued_by, dequeued_on, dequeued_by,
           outcome, claimed_on, claimed_by, lease_id, lease_expires_on, redeliver_count, max_attempts, last_error,
           version, claimed_expires_on,
           traceparent, tracestate, priority, fairness_key,
           CASE WHEN CAST(:trace_ids AS jsonb) IS NULL THEN nextval('tickler_timeline_id_seq') END
    FROM finished
),
logged AS (  -- only with trace ids: otherwise each history row is its entry
    SELECT tickler_timeline_write(array_agg(ROW(
               queue, item_key, id, dequeued_on, 'delivered', dequeued_by, schedule_on,
               -- :trace_ids (SPEC §11): {lease_id: the trace id of the attempt}, or NULL (tracing off)
               tickler_with_claim(jsonb_build_object('lease_id', lease_id, 'attempt', redeliver_count + 1)
                                  || jsonb_strip_nulls(jsonb_build_object(
                                         'trace_id', CAST(:trace_ids AS jsonb) ->> CAST(lease_id AS text))),
                                  dequeued_on, dequeued_by, schedule_on, claimed_on, claimed_by, claimed_expires_on,
                                  lease_id, redeliver_count + 1, group_key, schedule_on)
           )::tickler_timeline_row)) AS written
    FROM finished
    WHERE CAST(:trace_ids AS jsonb) IS NOT NULL
),
wake AS (
    -- a group's lease ended: its other due events (scheduled meanwhile) are claimable now
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM finished WHERE group_key IS NOT NULL) AS q
)
SELECT f.lease_id, f.queue, count(*) AS events
FROM finished AS f CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged AS l
GROUP BY f.lease_id, f.queue;

-- name: fail_lease
-- A failed attempt for every event of a live lease: count the redelivery, keep the error and
-- schedule the retry with the queue's backoff (or :retry_in_seconds), or finish the event as
-- dead when its attempts are used up or :dead says so.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
failing AS (
    SELECT e.id, e.schedule_on AS claim_schedule_on,
           (CAST(:dead AS boolean) OR tickler_attempts_used_up(e.redeliver_count + 1, e.max_attempts)) AS is_dead,
           coalesce(
               CAST(:retry_in_seconds AS double precision),
               tickler_backoff_seconds(q.backoff_initial_seconds, q.backoff_max_seconds, q.backoff_multiplier,
                                       e.redeliver_count)
           ) AS retry_in
    FROM tickler_event AS e
    JOIN tickler_queue AS q ON q.name = e.queue
    CROSS JOIN clock
    WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l WHERE l.lease_id = CAST(:lease_id AS uuid)))
      AND e.lease_id = CAST(:lease_id AS uuid) AND e.outcome IS NULL AND e.lease_expires_on > clock.now  -- see ack
    FOR UPDATE OF e
),
changed AS (
    UPDATE tickler_event AS e
    SET lease_id = NULL,
        lease_expires_on = NULL,
        last_error = CAST(:error AS text),
        redeliver_count = e.redeliver_count + 1,  -- every failed attempt, the last one included
        schedule_on = CASE WHEN f.is_dead THEN e.schedule_on
                           ELSE clock.now + make_interval(secs => f.retry_in) END,
        dequeued_on = CASE WHEN f.is_dead THEN clock.now END,
        dequeued_by = CASE WHEN f.is_dead THEN e.claimed_by END,
        outcome = CASE WHEN f.is_dead THEN 'dead' END,
        version = e.version + 1, changed_on = clock.now
    FROM failing AS f CROSS JOIN clock
    WHERE e.id = f.id AND e.id = ANY(ARRAY(SELECT id FROM failing))  -- primary-key lookups (see claim_events)
    RETURNING e.*, f.is_dead, f.claim_schedule_on, CAST(:lease_id AS uuid) AS old_lease_id
),
logged AS (
    SELECT tickler_timeline_write(array_agg(ROW(
               c.queue, c.item_key, c.id, clock.now,
               CASE WHEN c.is_dead THEN 'dead' ELSE 'failed' END, c.claimed_by, c.schedule_on,
               tickler_with_claim(jsonb_strip_nulls(jsonb_build_object(
                   'lease_id', c.old_lease_id,
                   'attempt', c.redeliver_count,
                   'trace_id', CAST(:trace_id AS text),  -- the attempt's trace (SPEC §11), when traced
                   'error', c.last_error,
                   'retry_at', CASE WHEN c.is_dead THEN NULL ELSE c.schedule_on END,
                   'reason', CASE WHEN NOT c.is_dead THEN NULL
                                  WHEN CAST(:dead AS boolean) THEN 'receiver said stop'
                                  ELSE 'attempts exhausted' END)),
                   clock.now, c.claimed_by, c.schedule_on, c.claimed_on, c.claimed_by, c.claimed_expires_on,
                   c.old_lease_id, c.redeliver_count, c.group_key, c.claim_schedule_on)
           )::tickler_timeline_row)) AS written
    FROM changed AS c CROSS JOIN clock
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM changed WHERE group_key IS NOT NULL) AS q
)
SELECT c.id, c.queue, c.is_dead, c.schedule_on, c.redeliver_count
FROM changed AS c CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged AS l;

-- name: extend_lease
-- Push a live lease's expiry to :seconds from now; returns the new expiry (no row: stale lease).
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now)
UPDATE tickler_event AS e
SET lease_expires_on = clock.now + make_interval(secs => :seconds)
FROM clock
WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l WHERE l.lease_id = CAST(:lease_id AS uuid)))
  AND e.lease_id = CAST(:lease_id AS uuid) AND e.outcome IS NULL AND e.lease_expires_on > clock.now  -- see ack
RETURNING e.lease_expires_on, e.queue;

-- name: extend_leases
-- Push live leases' expiry to :seconds from now in one statement (a worker's heartbeat over every
-- delivery it is waiting on); returns the ids of those still live.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now)
UPDATE tickler_event AS e
SET lease_expires_on = clock.now + make_interval(secs => :seconds)
FROM clock
WHERE e.id = ANY(ARRAY(SELECT l.event_id FROM tickler_lease AS l WHERE l.lease_id = ANY(CAST(:lease_ids AS uuid[]))))
  AND e.lease_id = ANY(CAST(:lease_ids AS uuid[])) AND e.outcome IS NULL AND e.lease_expires_on > clock.now  -- see ack
RETURNING e.lease_id;

-- name: release_leases
-- Give live leases back unfinished (a worker shutting down): the events are claimable at once,
-- and since no attempt was made, no redelivery is counted.
WITH clock AS (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now),
released AS (
    UPDATE tickler_event AS e
    SET lease_id = NULL, lease_expires_on = NULL, version = e.version + 1, changed_on = clock.now
    FROM clock, unnest(CAST(:lease_ids AS uuid[])) AS l (lease_id)  -- l: the lease each row had
    WHERE e.id = ANY(ARRAY(SELECT k.event_id FROM tickler_lease AS k WHERE k.lease_id = ANY(CAST(:lease_ids AS uuid[]))))
      AND e.lease_id = l.lease_id AND e.outcome IS NULL  -- see ack_leases
      AND e.lease_expires_on > clock.now
    RETURNING e.*, CAST(:actor AS text) AS actor, l.lease_id AS old_lease_id
),
logged AS (
    SELECT tickler_timeline_write(array_agg(ROW(
               r.queue, r.item_key, r.id, clock.now, 'released', r.actor, r.schedule_on,
               tickler_with_claim('{}', clock.now, r.actor, r.schedule_on, r.claimed_on, r.claimed_by,
                                  r.claimed_expires_on, r.old_lease_id, r.redeliver_count + 1, r.group_key, r.schedule_on)
           )::tickler_timeline_row)) AS written
    FROM released AS r CROSS JOIN clock
),
wake AS (
    SELECT pg_notify('tickler_wake', queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT r.id FROM released AS r CROSS JOIN (SELECT count(*) AS notified FROM wake) AS w CROSS JOIN logged AS l;

-- name: lease_queue
-- The queue a live lease belongs to (NULL: no such live lease).
SELECT queue FROM tickler_lease
WHERE lease_id = CAST(:lease_id AS uuid) AND expires_on > coalesce(CAST(:now AS timestamptz), now())
LIMIT 1;

-- name: lease_fate
-- Why a lease can no longer be finished, for the 409 of a stale ack, nack or extend: 'expired'
-- when its events are still under it, open, past its expiry (nobody claimed them since), else
-- NULL. Only what the lease table answers: finished events are not in it, so an
-- ack that already landed is told by the key's timeline (the client reads it), not by a scan here.
SELECT 'expired'
FROM tickler_lease
WHERE lease_id = CAST(:lease_id AS uuid) AND expires_on <= now()
LIMIT 1;

-- name: webhook_queues
-- Queues whose events the dispatcher delivers by webhook.
SELECT * FROM tickler_queue WHERE delivery_mode = 'webhook' ORDER BY name;

-- name: list_tokens
-- Every token (never the token itself: only its hash is kept), newest first.
SELECT id, principal, is_admin, queues, created_on, revoked_on, last_used_on FROM tickler_token ORDER BY id DESC;

-- name: revoke_token
-- Revoke a token; returns it (no row: no such token). Every API process listening on
-- tickler_cache drops the token from its cache when this commits ('token:' || hex of its hash).
-- `newly_revoked`: this call revoked it (it was live).
WITH revoked AS (
UPDATE tickler_token AS t SET revoked_on = coalesce(t.revoked_on, now())
FROM (SELECT id, revoked_on IS NULL AS live FROM tickler_token WHERE id = :id FOR UPDATE) AS was
WHERE t.id = was.id
RETURNING t.id, t.principal, t.is_admin, t.queues, t.created_on, t.revoked_on, t.last_used_on, t.token_hash, was.live
),
dropped AS (SELECT pg_notify('tickler_cache', 'token:' || encode(token_hash, 'hex')) FROM revoked)
SELECT id, principal, is_admin, queues, created_on, revoked_on, last_used_on, live AS newly_revoked
FROM revoked CROSS JOIN (SELECT count(*) AS notified FROM dropped) AS d;

-- name: set_trace_context
-- Keep the W3C trace context callers sent with the events just written (SPEC §11), in the same
-- transaction as the write: run only when a call carried one, so untraced scheduling pays nothing.
UPDATE tickler_event AS e
SET traceparent = t.traceparent, tracestate = t.tracestate
FROM unnest(CAST(:ids AS bigint[]), CAST(:traceparents AS text[]), CAST(:tracestates AS text[]))
     AS t (id, traceparent, tracestate)
WHERE e.id = t.id AND e.dequeued_on IS NULL;

-- name: history_days
-- The bounds of history's day partitions: a search by last change reads history a day at a time
-- (scheduler/store/search.py).
SELECT DISTINCT v.bound
FROM tickler_history_partition AS p
CROSS JOIN LATERAL (VALUES (p.day_from), (p.day_to)) AS v (bound)
WHERE p.parent = 'tickler_event_history' AND p.day_table IS NULL AND v.bound IS NOT NULL
ORDER BY v.bound
