-- Creating a day's partition while a writer puts a row of that day into the default partition.
--
-- tickler_add_history_day (0021) moved the day's rows out of the default partition and then
-- attached the new table. A row committed into the default partition between the two made the
-- attach fail ("updated partition constraint for default partition would be violated"), and the
-- maintenance pass with it. The default partition is now locked first: a writer routing a row
-- there either committed before (its row is moved) or waits until the day's partition is
-- attached (its row then goes there). The attach takes this lock anyway; taking it before the
-- move only makes the wait start earlier. Writers of days that have their partition — every
-- writer, when the maintenance pass runs — never touch the default partition and do not wait.
CREATE OR REPLACE FUNCTION tickler_add_history_day(p_parent text, p_day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_name    text := p_parent || '_' || to_char(p_day, 'YYYYMMDD');
    v_column  text := CASE p_parent WHEN 'tickler_timeline' THEN 'at' ELSE 'dequeued_on' END;
    v_from    timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    v_to      timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF EXISTS (SELECT 1 FROM tickler_history_partition WHERE name = v_name) THEN
        RETURN false;
    END IF;
    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', p_parent || '_default');
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name, p_parent);
    EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                   'INSERT INTO %I SELECT * FROM moved',
                   p_parent || '_default', v_column, v_column, v_name) USING v_from, v_to;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   p_parent, v_name, v_from, v_to);
    INSERT INTO tickler_history_partition (name, parent, day_from, day_to) VALUES (v_name, p_parent, v_from, v_to);
    RETURN true;
END
$$;
