-- Recurring schedules (SPEC §6): a cron expression in a time zone that enqueues one ordinary
-- event per occurrence, keyed {schedule_key}@{occurrence in UTC}.
--
-- Exactly once: the open-key unique index is not enough (once an occurrence is delivered its key
-- is free again), so each schedule keeps a cursor, `enqueued_through`: every occurrence at or
-- before it has been decided (enqueued, or skipped by catch_up) and is never enqueued again. The
-- engine locks the schedule row (FOR UPDATE SKIP LOCKED), enqueues and moves the cursor in one
-- transaction.
--
-- A deleted queue takes its schedules with it (ON DELETE CASCADE): nothing enqueues into a
-- queue that no longer exists.

CREATE TABLE tickler_schedule (
    queue             text NOT NULL REFERENCES tickler_queue (name) ON DELETE CASCADE,
    schedule_key      text COLLATE "C" NOT NULL,
    cron              text NOT NULL,
    timezone          text NOT NULL,
    data              jsonb NOT NULL DEFAULT '{}',
    group_key         text COLLATE "C",
    catch_up          text NOT NULL DEFAULT 'latest' CHECK (catch_up IN ('latest', 'none', 'all')),
    paused            boolean NOT NULL DEFAULT false,
    -- Every occurrence at or before this instant was decided; NULL: none yet (a new schedule).
    enqueued_through  timestamptz,
    -- The occurrence most recently enqueued (normally the one waiting in the future).
    last_enqueued     timestamptz,
    -- When the engine must look at this schedule next: the waiting occurrence's time (then the one
    -- after it is enqueued), or 1970 when it has work now (created, changed, resumed). (Not
    -- -infinity: drivers such as psycopg cannot read it.)
    due_on            timestamptz NOT NULL DEFAULT '1970-01-01 00:00:00+00',
    created_on        timestamptz NOT NULL DEFAULT now(),
    created_by        text NOT NULL,
    updated_on        timestamptz NOT NULL DEFAULT now(),
    updated_by        text NOT NULL,
    version           integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    PRIMARY KEY (queue, schedule_key),
    -- The key of an occurrence ({schedule_key}@2026-11-23T08:00:00Z, 21 more characters) must
    -- still be a valid item_key (at most 255 characters).
    CONSTRAINT schedule_key_syntax CHECK (
        char_length(schedule_key) BETWEEN 1 AND 234
        AND strpos(schedule_key, '/') = 0 AND strpos(schedule_key, '@') = 0),
    CONSTRAINT schedule_data_is_object CHECK (jsonb_typeof(data) = 'object')
);

-- The engine's look-up: schedules that are not paused and have work due.
CREATE INDEX tickler_schedule_due ON tickler_schedule (due_on) WHERE NOT paused;

-- A schedule's own history lives in the timeline of the key {schedule_key}, where no event has
-- to exist: its entries (schedule_created, schedule_updated, schedule_deleted) carry no event id.
ALTER TABLE tickler_timeline ALTER COLUMN event_id DROP NOT NULL;
ALTER TABLE tickler_timeline ADD CONSTRAINT timeline_event_id_present
    CHECK (event_id IS NOT NULL OR action IN ('schedule_created', 'schedule_updated', 'schedule_deleted'));
