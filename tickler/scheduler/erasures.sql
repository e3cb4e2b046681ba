-- Erasing a subject (SPEC §12): the erasure log and the steps of its runner (scheduler/erasing.py).
-- The work is done by the functions of scheduler/database/erasing.sql.

-- name: request_erasure
-- An erasure, pending: the log row (hashes only) and its work row (the values, in clear, until it ends).
WITH erasure AS (
    INSERT INTO tickler_erasure (requested_by, reason, queues, group_key_hash, item_key_hashes, item_key_prefix_hash)
    VALUES (:requested_by, :reason, CAST(:queues AS text[]), CAST(:group_key_hash AS text),
            CAST(:item_key_hashes AS text[]), CAST(:item_key_prefix_hash AS text))
    RETURNING *
),
work AS (
    INSERT INTO tickler_erasure_work (erasure_id, group_key, item_keys, item_key_prefix, item_key_prefix_end)
    SELECT id, CAST(:group_key AS text), CAST(:item_keys AS text[]), CAST(:item_key_prefix AS text),
           CAST(:item_key_prefix_end AS text)
    FROM erasure
)
SELECT * FROM erasure;

-- name: get_erasure
SELECT * FROM tickler_erasure WHERE id = :id;

-- name: erasures_by_hash
-- The erasures that erased this keyed hash of an item key (kind item_key) or a group (group_key):
-- named by the request, or met by it (a key an erasure by prefix or by group erased).
SELECT r.* FROM tickler_erasure AS r
WHERE (CAST(:kind AS text) = 'item_key' AND CAST(:value_hash AS text) = ANY(r.item_key_hashes))
   OR (CAST(:kind AS text) = 'group_key' AND r.group_key_hash = CAST(:value_hash AS text))
   OR r.id IN (SELECT v.erasure_id FROM tickler_erased_value AS v
               WHERE v.value_hash = CAST(:value_hash AS text) AND v.kind = CAST(:kind AS text))
ORDER BY r.id;

-- name: unfinished_erasures
-- Those with work left in the database (the archive's part is the pipeline's).
SELECT id FROM tickler_erasure WHERE finished_at IS NULL AND database_done_at IS NULL ORDER BY id;

-- name: erasure_values
-- The values of the rows the erasure's next batch erases, in clear, for the runner to hash.
-- With a range of the walk through history [from, to); without (from NULL), timeline keys.
SELECT v AS value
FROM tickler_erasure_values(:id, :limit, CAST(:from AS timestamptz), CAST(:to AS timestamptz)) AS v;

-- name: erase_batch
SELECT tickler_erase_batch(:id, CAST(:hashes AS jsonb), :limit, CAST(:from AS timestamptz),
                          CAST(:to AS timestamptz)) AS erased;

-- name: erasure_schedule_values
-- The keys and groups of the recurring schedules the erasure matches, in clear, for the runner to hash.
SELECT DISTINCT v.value
FROM tickler_erasure_schedules(:id) AS s
CROSS JOIN LATERAL (VALUES (s.schedule_key), (s.group_key)) AS v (value)
WHERE v.value IS NOT NULL;

-- name: erase_schedules
SELECT tickler_erase_schedules(:id, CAST(:hashes AS jsonb)) AS erased;

-- name: finish_erasure
SELECT tickler_erasure_finish(:id, CAST(:since AS timestamptz), CAST(:note AS text),
                              make_interval(secs => :lease_margin)) AS finished;

-- name: erasure_walk
-- Where the erasure's walk through history resumes (NULL: from the start), where the oldest day
-- of history begins, and the time now.
SELECT w.history_walked_to AS walked_to, now() AS now,
       (SELECT min(p.day_from) FROM tickler_history_partition AS p
        WHERE p.parent = 'tickler_event_history' AND p.day_table IS NULL) AS oldest_day
FROM tickler_erasure_work AS w WHERE w.erasure_id = :id;

-- name: erasure_walked
SELECT tickler_erasure_walked(:id, CAST(:to AS timestamptz));

-- name: fail_erasure
SELECT tickler_erasure_fail(:id, CAST(:note AS text));

-- name: database_now
SELECT now() AS now;

-- name: recent_erasures
-- The newest erasures, for the dashboard's list.
SELECT * FROM tickler_erasure ORDER BY id DESC LIMIT :limit;

-- name: erasure_impact
-- What erasing one key of a queue would change, counted before it is asked: its open event, its
-- events (open or finished, by their timeline entries: the key's index) and its timeline entries.
SELECT (SELECT count(*) FROM tickler_event AS e
        WHERE e.queue = :queue AND e.item_key = CAST(:item_key AS text) COLLATE "C" AND e.dequeued_on IS NULL) AS open_events,
       (SELECT count(DISTINCT t.event_id) FROM tickler_timeline_all AS t
        WHERE t.queue = :queue AND t.item_key = CAST(:item_key AS text) COLLATE "C" AND t.event_id IS NOT NULL) AS events,
       (SELECT count(*) FROM tickler_timeline_all AS t
        WHERE t.queue = :queue AND t.item_key = CAST(:item_key AS text) COLLATE "C") AS timeline_entries;
