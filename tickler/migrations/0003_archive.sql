-- The archive: finished events and their timeline move out of PostgreSQL into Parquet.
-- A run is recorded here before anything is written, with the exact set of events it moves, so a
-- crash at any point is finished by the next run (same ids, same files) and never loses or
-- duplicates a row. See docs/pipeline.md.

CREATE TABLE tickler_archive_run (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Events finished before this time are the run's (fixed when the run is created).
    cutoff           timestamptz NOT NULL,
    -- Root of the archive (a directory or a URI Spark can write); the run's files are under
    -- <location>/events/run=<id>/ and <location>/timeline/run=<id>/.
    location         text NOT NULL,
    -- selected: ids recorded, files may be missing or partial;
    -- written: files written and read back with the recorded counts and checksums;
    -- deleted: the rows are gone from PostgreSQL (one transaction), the run is finished.
    state            text NOT NULL DEFAULT 'selected' CHECK (state IN ('selected', 'written', 'deleted')),
    event_count      bigint NOT NULL,
    timeline_count   bigint NOT NULL,
    -- sum of ids: with the counts, what the read-back must match before anything is deleted
    event_id_sum     numeric NOT NULL,
    timeline_id_sum  numeric NOT NULL,
    min_event_id     bigint,
    max_event_id     bigint,
    created_on       timestamptz NOT NULL DEFAULT now(),
    written_on       timestamptz,
    deleted_on       timestamptz,
    CONSTRAINT written_has_time CHECK ((state = 'selected') = (written_on IS NULL)),
    CONSTRAINT deleted_has_time CHECK ((state = 'deleted') = (deleted_on IS NOT NULL))
);

-- At most one unfinished run: a new run starts only once the previous one is deleted.
CREATE UNIQUE INDEX tickler_archive_run_unfinished ON tickler_archive_run ((true)) WHERE state <> 'deleted';

-- The events of unfinished runs (a run's rows here go away with its events).
CREATE TABLE tickler_archive_item (
    run_id    bigint NOT NULL REFERENCES tickler_archive_run (id),
    event_id  bigint NOT NULL,
    PRIMARY KEY (run_id, event_id)
);

-- An event is moved by one run only.
CREATE UNIQUE INDEX tickler_archive_item_event ON tickler_archive_item (event_id);

-- Keys whose older history is in the archive: what the timeline API tells its readers.
CREATE TABLE tickler_archived_key (
    queue             text NOT NULL,
    item_key          text COLLATE "C" NOT NULL,
    -- the first and the latest run that moved events of this key
    first_archive_id  bigint NOT NULL REFERENCES tickler_archive_run (id),
    archive_id        bigint NOT NULL REFERENCES tickler_archive_run (id),
    -- the latest finish time (dequeued_on) among the key's archived events
    archived_through  timestamptz NOT NULL,
    events            bigint NOT NULL CHECK (events > 0),
    PRIMARY KEY (queue, item_key)
);
