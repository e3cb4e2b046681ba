-- The statements that add events lock their queue row themselves, once per statement
-- (scheduler/database/schema.sql, tickler_event): the foreign key's check of the same row for
-- every row inserted goes.
ALTER TABLE tickler_event DROP CONSTRAINT tickler_event_queue_fkey;
