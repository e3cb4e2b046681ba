-- The operations log (SPEC §7): who changed how tickler runs, when, and what changed (before and
-- after, never a secret or a token). Written in the transaction of the change it records; kept
-- for TICKLER_AUDIT_RETENTION_DAYS whatever the queues' retention.
CREATE TABLE tickler_operation_log (
    id      bigint GENERATED ALWAYS AS IDENTITY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text NOT NULL,
    action  text NOT NULL,
    queue   text,
    before  jsonb,
    after   jsonb,
    CONSTRAINT tickler_operation_log_pkey PRIMARY KEY (id)
);

-- A queue's entries, newest first; and the retention's cut by time.
CREATE INDEX tickler_operation_log_queue ON tickler_operation_log (queue, id);
CREATE INDEX tickler_operation_log_at ON tickler_operation_log (at);

-- Upcoming load (SPEC §7): the open events of each queue by the hour (UTC) they fall due, and
-- within it by minute (`minutes`: 60 counts), kept by the statement triggers of tickler_event like
-- tickler_queue_count, so that a forecast reads a row per hour instead of counting events, and a
-- statement writes a row per hour its events fall due in. Each backend writes its own slot;
-- readers add the slots up; the dispatcher's upkeep folds them together.
CREATE TABLE tickler_due_count (
    queue    text NOT NULL,
    hour     timestamptz NOT NULL,
    slot     integer NOT NULL,
    n        bigint NOT NULL,
    minutes  bigint[] NOT NULL,
    CONSTRAINT tickler_due_count_minutes_check CHECK (cardinality(minutes) = 60),
    CONSTRAINT tickler_due_count_pkey PRIMARY KEY (queue, hour, slot)
)
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- When tickler_due_count was counted from the events (one row): until then the triggers keep it
-- but it may lack the events written before them, and forecasts say they are not exact.
CREATE TABLE tickler_due_count_seeded (
    id          boolean NOT NULL DEFAULT true,
    seeded_on   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tickler_due_count_seeded_id_check CHECK (id),
    CONSTRAINT tickler_due_count_seeded_pkey PRIMARY KEY (id)
);
