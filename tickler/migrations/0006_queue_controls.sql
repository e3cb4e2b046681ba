-- Queue controls shared by flow control (SPEC §6) and operations (SPEC §7), and the timeline
-- actions those features record.
--
-- paused:          a paused queue delivers nothing (no dispatcher claims, pull claims return no
--                  leases); scheduling, moving and cancelling go on.
-- max_in_flight:   at most this many leases of the queue live at once, cluster-wide (NULL = no cap).
-- rate_per_second: at most this many events claimed per second, cluster-wide (NULL = no limit).

ALTER TABLE tickler_queue
    ADD COLUMN paused          boolean NOT NULL DEFAULT false,
    ADD COLUMN max_in_flight   integer CHECK (max_in_flight >= 1),
    ADD COLUMN rate_per_second double precision CHECK (rate_per_second > 0);

-- New timeline actions: debounce (latest wins), a dead event retried by an operator, and the
-- life of a recurring schedule (recorded under the key {schedule_key}).
ALTER TABLE tickler_timeline DROP CONSTRAINT tickler_timeline_action_check;
ALTER TABLE tickler_timeline ADD CONSTRAINT tickler_timeline_action_check CHECK (action IN (
    'enqueued', 'replaced', 'rescheduled', 'updated', 'claimed', 'delivered',
    'failed', 'released', 'lease_expired', 'cancelled', 'dead',
    'debounced', 'retried', 'schedule_created', 'schedule_updated', 'schedule_deleted'));
