-- The outbox's SQL, one named statement per block (`-- name: ...`), loaded once by _sql.py.
-- Parameters are bound by name (%(name)s), never formatted into the text.

-- name: insert
-- One call. First a transaction-level lock on the key: writers of one key wait for each other
-- until commit, so per key the ids are in commit order (in one statement, so that it holds in
-- autocommit too). Two 32-bit keys: a lock space apart from the service's one-bigint locks.
-- `schedule_on` is made absolute here, from the database clock: a resend means the same time.
WITH key_lock AS (
    SELECT pg_advisory_xact_lock(1953063787, hashtext(%(queue)s || '/' || %(item_key)s))
),
call AS (
    SELECT CAST(%(body)s AS jsonb) AS body,
           CAST(%(delay_seconds)s AS double precision) AS delay_seconds
    FROM key_lock
)
INSERT INTO tickler_outbox (queue, item_key, operation, body)
SELECT %(queue)s, %(item_key)s, %(operation)s,
       CASE
           WHEN call.delay_seconds IS NOT NULL OR (%(operation)s = 'schedule' AND NOT call.body ? 'schedule_on')
           THEN call.body || jsonb_build_object('schedule_on', to_char(
               (now() + make_interval(secs => coalesce(call.delay_seconds, 0))) AT TIME ZONE 'UTC',
               'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
           ELSE call.body
       END
FROM call
RETURNING id;

-- name: pick
-- A batch for one relay: the oldest row of up to `rows` keys, locked (SKIP LOCKED: keys another
-- relay holds are left to it, and do not count). Only the oldest row of a key is ever taken, so
-- no relay sends a row of a key while another relay may still be sending an earlier one, and at
-- most one row of a key is ever "maybe sent" (see forward.py).
SELECT o.id, o.queue, o.item_key, o.operation, o.body, o.tries,
       EXISTS (SELECT 1 FROM tickler_outbox_sent AS s WHERE s.id = o.id) AS maybe_sent
FROM tickler_outbox AS o
WHERE NOT EXISTS (
    SELECT 1 FROM tickler_outbox AS earlier
    WHERE earlier.queue = o.queue AND earlier.item_key = o.item_key AND earlier.id < o.id
)
ORDER BY o.id
LIMIT %(rows)s
FOR UPDATE OF o SKIP LOCKED;

-- name: mark_sent
-- Before sending: these rows may reach tickler from now on (committed on a connection of its
-- own, so that it outlives a relay that dies mid-batch).
INSERT INTO tickler_outbox_sent (id) SELECT unnest(CAST(%(ids)s AS bigint[])) ON CONFLICT (id) DO NOTHING;

-- name: delete_done
-- Rows tickler answered: gone, with their marks.
WITH gone AS (DELETE FROM tickler_outbox WHERE id = ANY(CAST(%(ids)s AS bigint[])) RETURNING id)
DELETE FROM tickler_outbox_sent WHERE id IN (SELECT id FROM gone);

-- name: note_failure
-- Rows that got no usable answer stay, for the next round.
UPDATE tickler_outbox SET tries = tries + 1, last_error = %(error)s WHERE id = ANY(CAST(%(ids)s AS bigint[]));
