-- Erasing at scale (SPEC §12). An erasure that took leases away stays running until they have
-- ended (leases_end_at: the latest expiry among them), so that nothing of the subject is sent
-- after it is done; its runner walks history by ranges of dequeued_on, resuming where it left
-- off (history_walked_to), read through a BRIN index: next to nothing to write on an ack, as
-- finished events are appended in about the order they finish.
ALTER TABLE tickler_erasure ADD COLUMN leases_end_at timestamp with time zone;
ALTER TABLE tickler_erasure_work ADD COLUMN history_walked_to timestamp with time zone;
CREATE INDEX tickler_event_history_dequeued ON tickler_event_history USING brin (dequeued_on) WITH (autosummarize='on');
