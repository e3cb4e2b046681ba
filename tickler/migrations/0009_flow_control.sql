-- Flow control (SPEC §6): what a claim of a queue with max_in_flight or rate_per_second needs to
-- hold them cluster-wide. Queues without limits never touch any of this.

-- Live leases of one queue, counted by a capped claim: only leased, open rows are in it, so the
-- count reads at most max_in_flight leases' rows however many events wait.
CREATE INDEX tickler_event_leased_queue
    ON tickler_event (queue, lease_id) WHERE dequeued_on IS NULL AND lease_id IS NOT NULL;

-- The claims of a rate-limited queue within the last window (one second, or 1/rate seconds for
-- rates under one a second): when each was made and how many events it took. A claim counts the
-- window's events and takes at most the rest of the rate; it is written by that same claim,
-- under the queue's flow lock, so it holds across every process. Always short: entries older
-- than the window are dropped on each write.
ALTER TABLE tickler_queue
    ADD COLUMN rate_window_at timestamptz[] NOT NULL DEFAULT '{}',
    ADD COLUMN rate_window_n  integer[]     NOT NULL DEFAULT '{}';
