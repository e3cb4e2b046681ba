-- Whether a grouped event of a queue has ever had a fairness key (sticky). Until one has, every
-- open grouped event of the queue has the empty key, so a write of grouped events that all have
-- the empty key cannot mix keys in a group and needs no look at the groups' open events
-- (tickler_schedule_events); the group-fairness trigger sets it on the first grouped row with a key.
ALTER TABLE tickler_queue ADD COLUMN grouped_fairness boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN tickler_queue.grouped_fairness IS
    'A grouped event of the queue has had a fairness key (set by tickler_check_group_fairness, never reset).';

-- The queues whose grouped events already have keys.
UPDATE tickler_queue AS q SET grouped_fairness = true
WHERE EXISTS (SELECT 1 FROM tickler_event AS e
              WHERE e.queue = q.name AND e.group_key IS NOT NULL AND e.fairness_key <> '');
