-- When each open event last changed: set with `version` by every statement that bumps it
-- (schedule, replace, debounce, reschedule, cancel, claim, nack, lease expiry, release, retry,
-- erasure), so searches can sort by the latest change. A finished event's last change is its
-- finish, dequeued_on: the history has the column only because a finish may move whole rows
-- into it; it is not read there, the ack leaves it NULL (no extra WAL), and rows finished
-- before this migration keep NULL (no rewrite of the history).
ALTER TABLE tickler_event ADD COLUMN changed_on timestamp with time zone;
ALTER TABLE tickler_event_history ADD COLUMN changed_on timestamp with time zone;

-- Open events: the time of the event's latest timeline entry (each change writes one), or, where
-- retention dropped it, the latest of its own times.
UPDATE tickler_event AS e
SET changed_on = greatest(e.enqueued_on, e.claimed_on, e.dequeued_on,
                          (SELECT max(t.at) FROM tickler_timeline AS t
                           WHERE t.queue = e.queue AND t.item_key = e.item_key AND t.event_id = e.id));

ALTER TABLE tickler_event ALTER COLUMN changed_on SET DEFAULT now();
ALTER TABLE tickler_event ALTER COLUMN changed_on SET NOT NULL;

COMMENT ON COLUMN tickler_event.changed_on IS 'When the event last changed (set wherever version goes up).';
COMMENT ON COLUMN tickler_event_history.changed_on IS 'Not read: a finished event last changed when it finished (dequeued_on). Set where a finish moves the whole row, else NULL.';
