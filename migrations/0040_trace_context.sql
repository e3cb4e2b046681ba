-- Tracing (SPEC §11): the W3C trace context a schedule call carried is kept with its event, so
-- that every delivery attempt can link to (or continue) the producer's trace, a webhook request
-- and a pull claim can hand it on, and the pipeline can read it like any other column.
--
-- Both NULL unless a caller sent a valid `traceparent` (a malformed one is ignored, never
-- refused): tracing off, these cost a NULL bit per row. `tracestate` only comes with a
-- `traceparent`. No index: nothing searches by them.

-- Everything this upgrade changes, locked first, at once (as 0021): a writer running meanwhile
-- waits from its first statement on instead of deadlocking with the upgrade.
LOCK TABLE tickler_event, tickler_event_history, tickler_schedule IN ACCESS EXCLUSIVE MODE;

-- Same columns, same order, on both event tables: a finish moves whole rows (tickler_move_finished).
ALTER TABLE tickler_event
    ADD COLUMN traceparent text CONSTRAINT event_traceparent_syntax
        CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}'),
    ADD COLUMN tracestate text CONSTRAINT event_tracestate_with_parent
        CHECK (tracestate IS NULL OR (traceparent IS NOT NULL AND char_length(tracestate) <= 512));
ALTER TABLE tickler_event_history
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;

-- A recurring schedule keeps the context of its last change: each occurrence starts a trace of
-- its own, linked to it.
ALTER TABLE tickler_schedule
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;

-- The view lists the columns as they were when it was made: make it again.
DROP VIEW tickler_event_all;
CREATE VIEW tickler_event_all AS
SELECT * FROM tickler_event
UNION ALL
SELECT * FROM tickler_event_history;
