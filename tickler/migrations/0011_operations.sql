-- Operations (SPEC §7): retrying dead events, by key or by filter.
--
-- Dead events are few beside delivered ones, but no index held them apart: a retry by key
-- prefix or group, a search for status=dead and the dashboard's dead list scanned every
-- finished event of the queue. This partial index holds only dead events, by key, so those
-- reads step over nothing else. It costs one index entry per event that dies, none otherwise.
CREATE INDEX tickler_event_dead
    ON tickler_event (queue, item_key) INCLUDE (group_key)
    WHERE outcome = 'dead';
