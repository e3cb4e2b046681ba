-- The details of a `retried` timeline entry, written by a retry by key and by a retry by filter
-- (which adds "bulk": true): the budget the event starts again with, its new and previous
-- max_attempts, and how it had died.
CREATE FUNCTION tickler_retried_details(
    p_budget integer, p_max_attempts integer, p_previous_max_attempts integer, p_redeliver_count integer,
    p_dead_since timestamptz, p_last_error text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$  -- STABLE: a timestamptz is written in the session's time zone
    SELECT jsonb_build_object('attempts', p_budget, 'max_attempts', p_max_attempts,
                              'previous_max_attempts', p_previous_max_attempts,
                              'redeliver_count', p_redeliver_count, 'dead_since', p_dead_since,
                              'last_error', p_last_error)
$$;
