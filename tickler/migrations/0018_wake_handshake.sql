-- The wake-up handshake of a statement that makes one event due at `p_due` (a reschedule, a
-- retry), in one place instead of a pair of CTEs in each statement. Same rule as the write path
-- of 0008: FOR KEY SHARE on the queue row, held to commit whether or not we notify — a dispatcher
-- that wants to sleep locks the row FOR UPDATE first, so either it waits for our commit and then
-- sees the event, or it committed its next_wake before we read it here; and one NOTIFY only when
-- a sleeping dispatcher would wake too late for the event (NOTIFY serialises commits).
-- Returns whether it notified.
CREATE FUNCTION tickler_wake_if_sooner(p_queue text, p_due timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_next_wake timestamptz;
BEGIN
    SELECT q.next_wake INTO v_next_wake FROM tickler_queue AS q WHERE q.name = p_queue FOR KEY SHARE;
    IF v_next_wake > p_due THEN
        PERFORM pg_notify('tickler_wake', p_queue);
        RETURN true;
    END IF;
    RETURN false;
END
$$;
