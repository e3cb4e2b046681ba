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

-- tickler_schedule() and, for the events it wrote, the trace contexts their callers sent
-- (p_traces: a JSON array by position, null where an item has none), in one statement: a traced
-- call costs the API no more round trips than an untraced one. Same result rows (the events
-- returned are as tickler_schedule wrote them, before their context is kept).
CREATE FUNCTION tickler_schedule_traced(
    p_queue text,
    p_events jsonb,
    p_actor text,
    p_on_conflict text,
    p_now timestamptz,
    p_debounce_max_seconds double precision,
    p_with_events boolean,
    p_traces jsonb
) RETURNS TABLE (ord bigint, item_key text, outcome text, id bigint, event tickler_event)
LANGUAGE plpgsql AS $$
DECLARE
    v_row     record;
    v_ids     bigint[] := '{}';
    v_parents text[] := '{}';
    v_states  text[] := '{}';
BEGIN
    FOR v_row IN
        SELECT * FROM tickler_schedule(p_queue, p_events, p_actor, p_on_conflict, p_now, p_debounce_max_seconds,
                                       p_with_events)
    LOOP
        IF v_row.outcome IN ('created', 'replaced', 'debounced')
           AND p_traces -> (v_row.ord::integer) ->> 'traceparent' IS NOT NULL THEN
            v_ids := v_ids || v_row.id;
            v_parents := v_parents || (p_traces -> (v_row.ord::integer) ->> 'traceparent');
            v_states := v_states || (p_traces -> (v_row.ord::integer) ->> 'tracestate');
        END IF;
        ord := v_row.ord; item_key := v_row.item_key; outcome := v_row.outcome; id := v_row.id;
        event := v_row.event;
        RETURN NEXT;
    END LOOP;
    UPDATE tickler_event AS e
    SET traceparent = t.traceparent, tracestate = t.tracestate
    FROM unnest(v_ids, v_parents, v_states) AS t (id, traceparent, tracestate)
    WHERE e.id = t.id AND e.dequeued_on IS NULL;
END
$$;
