-- tickler's tables as they are today: what a new database is made of (scheduler/migrate.py).
--
-- A change to a table goes here and, for the databases that exist, into a numbered file of
-- migrations/ that moves them to the same state; tests/test_schema.py compares the two.
-- Functions, triggers and views are not here: they are the code files beside this one.
--
-- History and the timeline are partitioned by day, and each day by queue; the days are made
-- ahead of time by tickler_maintain_history() (history.sql). A row whose day has no partition
-- yet lands in the DEFAULT partition, and the next maintenance pass gives it its day.


-- One timeline entry as its writers hand it to tickler_timeline_write().
CREATE TYPE tickler_timeline_row AS (
	queue text,
	item_key text COLLATE pg_catalog."C",
	event_id bigint,
	at timestamp with time zone,
	action text,
	actor text,
	schedule_on timestamp with time zone,
	details jsonb
);


-- Queues and their settings: delivery, retries, flow control (paused, max_in_flight,
-- rate_per_second with the claims of its current window), fair share and retention. next_wake:
-- when the queue's sleeping dispatchers look next; writers of events due before it NOTIFY
-- (the wake-up handshake: dispatchers set it FOR UPDATE, writers read it FOR KEY SHARE).
CREATE TABLE tickler_queue (
    name text NOT NULL,
    delivery_mode text NOT NULL,
    webhook_url text,
    webhook_timeout_seconds double precision,
    signing_secret text,
    previous_signing_secret text,
    previous_secret_until timestamp with time zone,
    lease_seconds double precision NOT NULL,
    max_attempts integer NOT NULL,
    backoff_initial_seconds double precision NOT NULL,
    backoff_max_seconds double precision NOT NULL,
    backoff_multiplier double precision NOT NULL,
    created_on timestamp with time zone DEFAULT now() NOT NULL,
    updated_on timestamp with time zone DEFAULT now() NOT NULL,
    next_wake timestamp with time zone DEFAULT '1970-01-01 00:00:00+00'::timestamp with time zone NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    max_in_flight integer,
    rate_per_second double precision,
    rate_window_at timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    rate_window_n integer[] DEFAULT '{}'::integer[] NOT NULL,
    retention_days integer DEFAULT 30 NOT NULL,
    archive_before_prune boolean DEFAULT false NOT NULL,
    fair_share boolean DEFAULT false NOT NULL,
    max_in_flight_per_key integer,
    grouped_fairness boolean DEFAULT false NOT NULL,
    CONSTRAINT tickler_queue_backoff_initial_seconds_check CHECK ((backoff_initial_seconds >= (0)::double precision)),
    CONSTRAINT tickler_queue_backoff_multiplier_check CHECK ((backoff_multiplier >= (1)::double precision)),
    CONSTRAINT tickler_queue_check CHECK ((backoff_max_seconds >= backoff_initial_seconds)),
    CONSTRAINT tickler_queue_delivery_mode_check CHECK ((delivery_mode = ANY (ARRAY['pull'::text, 'webhook'::text]))),
    CONSTRAINT tickler_queue_lease_seconds_check CHECK ((lease_seconds > (0)::double precision)),
    CONSTRAINT tickler_queue_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT tickler_queue_max_in_flight_check CHECK ((max_in_flight >= 1)),
    CONSTRAINT tickler_queue_max_in_flight_per_key_check CHECK ((max_in_flight_per_key >= 1)),
    CONSTRAINT tickler_queue_name_check CHECK ((name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'::text)),
    CONSTRAINT tickler_queue_rate_per_second_check CHECK ((rate_per_second > (0)::double precision)),
    CONSTRAINT tickler_queue_retention_days_check CHECK (((retention_days >= 1) AND (retention_days <= 3650))),
    CONSTRAINT webhook_has_url_and_secret CHECK (((delivery_mode <> 'webhook'::text) OR ((webhook_url IS NOT NULL) AND (webhook_timeout_seconds > (0)::double precision) AND (signing_secret IS NOT NULL)))),
    CONSTRAINT tickler_queue_pkey PRIMARY KEY (name)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000');

COMMENT ON COLUMN tickler_queue.grouped_fairness IS 'A grouped event of the queue has had a fairness key (set by tickler_check_group_fairness, never reset).';


-- Open events only (waiting, due, in flight): what claims, due counts and gauges read; a finish
-- moves the row into tickler_event_history. CHECK constraints tie each state to its columns, and
-- tickler_event_open_key allows one open event per (queue, item_key). fillfactor 40 leaves room
-- for a claim's new row version on its page (a HOT update: no lease column is indexed here).
-- No foreign key to tickler_queue: each statement that adds events (tickler_schedule_events(),
-- retry_event and retry_matching) locks its queue row FOR KEY SHARE itself, once, and adds none
-- when the queue is gone; a foreign key checked the same row again for every row inserted (a
-- sixth of a batch's cost). A queue's deletion locks the row FOR UPDATE first (lock_queue_for_delete).
CREATE TABLE tickler_event (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    item_key text NOT NULL COLLATE pg_catalog."C",
    group_key text COLLATE pg_catalog."C",
    schedule_on timestamp with time zone NOT NULL,
    data jsonb DEFAULT '{}'::jsonb NOT NULL,
    enqueued_on timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_by text NOT NULL,
    dequeued_on timestamp with time zone,
    dequeued_by text,
    outcome text,
    claimed_on timestamp with time zone,
    claimed_by text,
    lease_id uuid,
    lease_expires_on timestamp with time zone,
    redeliver_count integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    last_error text,
    version integer DEFAULT 1 NOT NULL,
    claimed_expires_on timestamp with time zone,
    traceparent text,
    tracestate text,
    priority smallint DEFAULT 0 NOT NULL,
    fairness_key text DEFAULT ''::text NOT NULL COLLATE pg_catalog."C",
    entry_id bigint,
    changed_on timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT claim_has_claimer CHECK (((claimed_on IS NULL) = (claimed_by IS NULL))),
    CONSTRAINT data_is_object CHECK ((jsonb_typeof(data) = 'object'::text)),
    CONSTRAINT event_traceparent_syntax CHECK ((traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}'::text)),
    CONSTRAINT event_tracestate_with_parent CHECK (((tracestate IS NULL) OR ((traceparent IS NOT NULL) AND (char_length(tracestate) <= 512)))),
    CONSTRAINT fairness_key_syntax CHECK (((char_length(fairness_key) <= 255) AND (strpos(fairness_key, '/'::text) = 0))),
    CONSTRAINT finished_has_actor CHECK (((dequeued_on IS NULL) = (dequeued_by IS NULL))),
    CONSTRAINT finished_has_outcome CHECK (((dequeued_on IS NULL) = (outcome IS NULL))),
    CONSTRAINT group_key_syntax CHECK (((group_key IS NULL) OR ((char_length(group_key) >= 1) AND (char_length(group_key) <= 255)))),
    CONSTRAINT item_key_syntax CHECK ((char_length(item_key) BETWEEN 1 AND 255 AND (strpos(item_key, '/'::text) = 0))),
    CONSTRAINT lease_has_claim CHECK (((lease_id IS NULL) OR (claimed_on IS NOT NULL))),
    CONSTRAINT lease_has_expiry CHECK (((lease_id IS NULL) = (lease_expires_on IS NULL))),
    CONSTRAINT max_attempts_positive CHECK ((max_attempts >= 1)),
    CONSTRAINT outcome_known CHECK ((outcome = ANY (ARRAY['delivered'::text, 'cancelled'::text, 'dead'::text]))),
    CONSTRAINT priority_range CHECK (((priority >= '-100'::integer) AND (priority <= 100))),
    CONSTRAINT redeliver_count_not_negative CHECK ((redeliver_count >= 0)),
    CONSTRAINT version_positive CHECK ((version >= 1)),
    CONSTRAINT tickler_event_pkey PRIMARY KEY (id)
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.01', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0', fillfactor='40');

COMMENT ON COLUMN tickler_event.changed_on IS 'When the event last changed (set wherever version goes up).';

CREATE INDEX tickler_event_claimable_fair ON tickler_event USING btree (queue, priority, fairness_key, schedule_on, id) WHERE ((dequeued_on IS NULL) AND (group_key IS NULL));

CREATE INDEX tickler_event_claimable_group ON tickler_event USING btree (queue, schedule_on, id) INCLUDE (group_key) WHERE ((dequeued_on IS NULL) AND (group_key IS NOT NULL));

CREATE INDEX tickler_event_claimable_priority ON tickler_event USING btree (queue, priority, schedule_on, id) WHERE ((dequeued_on IS NULL) AND (group_key IS NULL));

CREATE INDEX tickler_event_open_group ON tickler_event USING btree (queue, group_key, schedule_on, id) WHERE ((dequeued_on IS NULL) AND (group_key IS NOT NULL));

CREATE UNIQUE INDEX tickler_event_open_key ON tickler_event USING btree (queue, item_key) WHERE (dequeued_on IS NULL);

CREATE INDEX tickler_event_open_schedule ON tickler_event USING btree (queue, schedule_on, id) WHERE (dequeued_on IS NULL);


-- One row per live lease of an open event, kept by the triggers of tickler_event
-- (event_triggers.sql): the index of the lease columns, which stay on the event row. Small (the
-- events in flight only); ack, nack and extend find their events by lease id here.
CREATE TABLE tickler_lease (
    lease_id uuid NOT NULL,
    event_id bigint NOT NULL,
    queue text NOT NULL,
    group_key text COLLATE pg_catalog."C",
    fairness_key text NOT NULL COLLATE pg_catalog."C",
    expires_on timestamp with time zone NOT NULL,
    CONSTRAINT tickler_lease_pkey PRIMARY KEY (lease_id, event_id)
)
WITH (fillfactor='70', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_scale_factor='0', autovacuum_analyze_threshold='1000', autovacuum_analyze_scale_factor='0');

COMMENT ON TABLE tickler_lease IS 'The live leases of open events, kept from tickler_event by its statement triggers: the index of the lease columns.';

CREATE INDEX tickler_lease_grouped ON tickler_lease USING btree (queue, group_key, expires_on) WHERE (group_key IS NOT NULL);


-- Finished events, partitioned by the day (UTC) of dequeued_on, each day by queue. The columns of
-- tickler_event, in the same order (a finish moves whole rows): LIKE copies names, types, NOT NULL,
-- collations and defaults, but not the identity of id (tickler_event hands out the ids) nor the
-- CHECK constraints, which are its own, listed here. No primary key: a partitioned unique index
-- must hold the partition key.
CREATE TABLE tickler_event_history (
    LIKE tickler_event INCLUDING DEFAULTS,
    CONSTRAINT claim_has_claimer CHECK (((claimed_on IS NULL) = (claimed_by IS NULL))),
    CONSTRAINT data_is_object CHECK ((jsonb_typeof(data) = 'object'::text)),
    CONSTRAINT finished_has_actor CHECK (((dequeued_on IS NULL) = (dequeued_by IS NULL))),
    CONSTRAINT finished_has_outcome CHECK (((dequeued_on IS NULL) = (outcome IS NULL))),
    CONSTRAINT group_key_syntax CHECK (((group_key IS NULL) OR ((char_length(group_key) >= 1) AND (char_length(group_key) <= 255)))),
    CONSTRAINT history_is_finished CHECK ((dequeued_on IS NOT NULL)),
    CONSTRAINT item_key_syntax CHECK ((char_length(item_key) BETWEEN 1 AND 255 AND (strpos(item_key, '/'::text) = 0))),
    CONSTRAINT lease_has_claim CHECK (((lease_id IS NULL) OR (claimed_on IS NOT NULL))),
    CONSTRAINT lease_has_expiry CHECK (((lease_id IS NULL) = (lease_expires_on IS NULL))),
    CONSTRAINT max_attempts_positive CHECK ((max_attempts >= 1)),
    CONSTRAINT outcome_known CHECK ((outcome = ANY (ARRAY['delivered'::text, 'cancelled'::text, 'dead'::text]))),
    CONSTRAINT redeliver_count_not_negative CHECK ((redeliver_count >= 0)),
    CONSTRAINT version_positive CHECK ((version >= 1))
)
PARTITION BY RANGE (dequeued_on);

-- A finished event's last change is its finish (dequeued_on): changed_on is kept only where a
-- finish moves the whole row, and readers take dequeued_on (LIKE copied NOT NULL and the default).
ALTER TABLE tickler_event_history ALTER COLUMN changed_on DROP NOT NULL;
ALTER TABLE tickler_event_history ALTER COLUMN changed_on DROP DEFAULT;

COMMENT ON COLUMN tickler_event_history.changed_on IS 'Not read: a finished event last changed when it finished (dequeued_on). Set where a finish moves the whole row, else NULL.';

COMMENT ON COLUMN tickler_event_history.entry_id IS 'The id of the event''s `delivered` timeline entry when that entry is this row (written by an ack; see tickler_timeline_all).';

CREATE INDEX tickler_event_history_dead ON ONLY tickler_event_history USING btree (queue, item_key) INCLUDE (group_key) WHERE (outcome = 'dead'::text);

CREATE INDEX tickler_event_history_dequeued ON ONLY tickler_event_history USING brin (dequeued_on) WITH (autosummarize='on');

CREATE INDEX tickler_event_history_entry ON ONLY tickler_event_history USING btree (queue, item_key, entry_id) WHERE (entry_id IS NOT NULL);

CREATE INDEX tickler_event_history_schedule ON ONLY tickler_event_history USING btree (queue, schedule_on, id);


-- Finished events of a day that has no partition yet: the next maintenance pass gives them their day.
CREATE TABLE tickler_event_history_default PARTITION OF tickler_event_history DEFAULT;


-- Every key's append-only history of entries, partitioned by the day (UTC) of `at`, each day by
-- queue; written only by tickler_timeline_write(). No foreign key to the events: a key's timeline
-- outlives them. A schedule's entries carry no event id. One B-tree, the key's (queue, item_key,
-- id); range reads by id use a BRIN index (ids are appended in order).
CREATE TABLE tickler_timeline (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    item_key text NOT NULL COLLATE pg_catalog."C",
    event_id bigint,
    at timestamp with time zone DEFAULT now() NOT NULL,
    action text NOT NULL,
    actor text NOT NULL,
    schedule_on timestamp with time zone,
    details jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT tickler_timeline_action_check CHECK ((action = ANY (ARRAY['enqueued'::text, 'replaced'::text, 'rescheduled'::text, 'updated'::text, 'claimed'::text, 'delivered'::text, 'failed'::text, 'released'::text, 'lease_expired'::text, 'cancelled'::text, 'dead'::text, 'debounced'::text, 'retried'::text, 'schedule_created'::text, 'schedule_updated'::text, 'schedule_deleted'::text, 'erased'::text]))),
    CONSTRAINT timeline_event_id_present CHECK (((event_id IS NOT NULL) OR (action = ANY (ARRAY['schedule_created'::text, 'schedule_updated'::text, 'schedule_deleted'::text, 'erased'::text]))))
)
PARTITION BY RANGE (at);

CREATE INDEX tickler_timeline_id ON ONLY tickler_timeline USING brin (id);

CREATE INDEX tickler_timeline_key ON ONLY tickler_timeline USING btree (queue, item_key, id);


-- Entries of a day that has no partition yet: the next maintenance pass gives them their day.
CREATE TABLE tickler_timeline_default PARTITION OF tickler_timeline DEFAULT;


-- The partitions of history and the timeline that tickler_maintain_history() makes and drops:
-- days (partitioned by queue), their parts, and whole-day partitions.
CREATE TABLE tickler_history_partition (
    name text NOT NULL,
    parent text NOT NULL,
    day_from timestamp with time zone,
    day_to timestamp with time zone NOT NULL,
    day_table text,
    queues text[],
    retention_days integer,
    partitioned boolean DEFAULT false NOT NULL,
    settled boolean DEFAULT false NOT NULL,
    CONSTRAINT tickler_history_partition_check CHECK (((day_from IS NULL) OR (day_from < day_to))),
    CONSTRAINT tickler_history_partition_parent_check CHECK ((parent = ANY (ARRAY['tickler_event_history'::text, 'tickler_timeline'::text]))),
    CONSTRAINT tickler_history_partition_pkey PRIMARY KEY (name)
);

COMMENT ON COLUMN tickler_history_partition.day_table IS 'For a part of a day: the day''s table; NULL for a partition of the parent itself.';

COMMENT ON COLUMN tickler_history_partition.queues IS 'For a part of a day: the queues whose rows it holds (its LIST bound); NULL for the day''s DEFAULT part (`_rest`) and for whole-day partitions.';


-- Events per queue and state (open or an outcome), kept by statement triggers so that nothing
-- counts rows. Each backend writes its own slot; readers add the slots up.
CREATE TABLE tickler_queue_count (
    queue text NOT NULL,
    state text NOT NULL,
    slot integer NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT tickler_queue_count_state_check CHECK ((state = ANY (ARRAY['open'::text, 'delivered'::text, 'cancelled'::text, 'dead'::text]))),
    CONSTRAINT tickler_queue_count_pkey PRIMARY KEY (queue, state, slot)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000');


-- Finished events per day, queue and outcome: what dropping a day of history takes off
-- tickler_queue_count without reading its rows. One slot per backend, as tickler_queue_count.
CREATE TABLE tickler_history_count (
    day date NOT NULL,
    queue text NOT NULL,
    outcome text NOT NULL,
    slot integer NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT tickler_history_count_pkey PRIMARY KEY (day, queue, outcome, slot)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000');


-- The dashboard's deliveries and failed attempts per queue and minute: a ring of 120 minutes
-- (minute m at ring m mod 120, a newer minute overwriting an older one), a slot per backend.
CREATE TABLE tickler_minute_stat (
    queue text NOT NULL,
    ring smallint NOT NULL,
    slot smallint NOT NULL,
    minute timestamp with time zone NOT NULL,
    delivered bigint NOT NULL,
    failed bigint NOT NULL,
    CONSTRAINT tickler_minute_stat_ring_check CHECK (((ring >= 0) AND (ring <= 119))),
    CONSTRAINT tickler_minute_stat_pkey PRIMARY KEY (queue, ring, slot)
);


-- Where the round robin of a fair queue goes on: the last fairness key a claim served (a hint).
CREATE TABLE tickler_fair_cursor (
    queue text NOT NULL,
    after_key text NOT NULL COLLATE pg_catalog."C",
    CONSTRAINT tickler_fair_cursor_pkey PRIMARY KEY (queue),
    CONSTRAINT tickler_fair_cursor_queue_fkey FOREIGN KEY (queue) REFERENCES tickler_queue(name) ON DELETE CASCADE
);


-- Recurring schedules: a cron expression in a time zone enqueueing one event per occurrence,
-- keyed {schedule_key}@{occurrence in UTC}. enqueued_through: every occurrence up to it is
-- decided and never enqueued again; due_on: when the engine looks next (1970: work now).
CREATE TABLE tickler_schedule (
    queue text NOT NULL,
    schedule_key text NOT NULL COLLATE pg_catalog."C",
    cron text NOT NULL,
    timezone text NOT NULL,
    data jsonb DEFAULT '{}'::jsonb NOT NULL,
    group_key text COLLATE pg_catalog."C",
    catch_up text DEFAULT 'latest'::text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    enqueued_through timestamp with time zone,
    last_enqueued timestamp with time zone,
    due_on timestamp with time zone DEFAULT '1970-01-01 00:00:00+00'::timestamp with time zone NOT NULL,
    created_on timestamp with time zone DEFAULT now() NOT NULL,
    created_by text NOT NULL,
    updated_on timestamp with time zone DEFAULT now() NOT NULL,
    updated_by text NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    traceparent text,
    tracestate text,
    priority smallint DEFAULT 0 NOT NULL,
    fairness_key text COLLATE pg_catalog."C",
    CONSTRAINT schedule_data_is_object CHECK ((jsonb_typeof(data) = 'object'::text)),
    CONSTRAINT schedule_fairness_key_syntax CHECK ((char_length(fairness_key) BETWEEN 1 AND 255 AND (strpos(fairness_key, '/'::text) = 0))),
    CONSTRAINT schedule_key_syntax CHECK ((char_length(schedule_key) BETWEEN 1 AND 234 AND (strpos(schedule_key, '/'::text) = 0) AND (strpos(schedule_key, '@'::text) = 0))),
    CONSTRAINT schedule_priority_range CHECK (((priority >= '-100'::integer) AND (priority <= 100))),
    CONSTRAINT tickler_schedule_catch_up_check CHECK ((catch_up = ANY (ARRAY['latest'::text, 'none'::text, 'all'::text]))),
    CONSTRAINT tickler_schedule_version_check CHECK ((version >= 1)),
    CONSTRAINT tickler_schedule_pkey PRIMARY KEY (queue, schedule_key),
    CONSTRAINT tickler_schedule_queue_fkey FOREIGN KEY (queue) REFERENCES tickler_queue(name) ON DELETE CASCADE
);

CREATE INDEX tickler_schedule_due ON tickler_schedule USING btree (due_on) WHERE (NOT paused);


-- API tokens: only the SHA-256 of each token is kept (it is shown once, when created).
CREATE TABLE tickler_token (
    id bigint GENERATED ALWAYS AS IDENTITY,
    principal text NOT NULL,
    token_hash bytea NOT NULL,
    is_admin boolean DEFAULT false NOT NULL,
    queues text[] DEFAULT '{}'::text[] NOT NULL,
    created_on timestamp with time zone DEFAULT now() NOT NULL,
    revoked_on timestamp with time zone,
    last_used_on timestamp with time zone,
    issue_key text,
    CONSTRAINT tickler_token_principal_check CHECK (((char_length(principal) >= 1) AND (char_length(principal) <= 200))),
    CONSTRAINT tickler_token_pkey PRIMARY KEY (id),
    CONSTRAINT tickler_token_token_hash_key UNIQUE (token_hash)
);

CREATE UNIQUE INDEX tickler_token_issue_key ON tickler_token USING btree (issue_key) WHERE (issue_key IS NOT NULL);


-- Dashboard sessions kept on the server: the SHA-256 of the cookie's session id and the hash of
-- the token that signed in (looked up on every request, so a revoked token ends its sessions).
CREATE TABLE tickler_ui_session (
    id_hash bytea NOT NULL,
    token_hash bytea NOT NULL,
    created_on timestamp with time zone DEFAULT now() NOT NULL,
    expires_on timestamp with time zone NOT NULL,
    CONSTRAINT ends_after_start CHECK ((expires_on > created_on)),
    CONSTRAINT tickler_ui_session_pkey PRIMARY KEY (id_hash)
);

CREATE INDEX tickler_ui_session_expires ON tickler_ui_session USING btree (expires_on);


-- The key that signs the dashboard's cookies when TICKLER_SECRET_KEY is not set: one row, made by
-- the first process that needs it and shared by all. Deleting it signs everyone out once the
-- processes restart.
CREATE TABLE tickler_ui_secret (
    id boolean DEFAULT true NOT NULL,
    secret text NOT NULL,
    created_on timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tickler_ui_secret_id_check CHECK (id),
    CONSTRAINT tickler_ui_secret_secret_check CHECK ((char_length(secret) >= 32)),
    CONSTRAINT tickler_ui_secret_pkey PRIMARY KEY (id)
);


-- Runs of the archive (finished events and their timeline into Parquet), recorded before anything
-- is written, so that a crash is finished by the next run. At most one run is unfinished.
CREATE TABLE tickler_archive_run (
    id bigint GENERATED ALWAYS AS IDENTITY,
    cutoff timestamp with time zone NOT NULL,
    location text NOT NULL,
    state text DEFAULT 'selected'::text NOT NULL,
    event_count bigint NOT NULL,
    timeline_count bigint NOT NULL,
    event_id_sum numeric NOT NULL,
    timeline_id_sum numeric NOT NULL,
    min_event_id bigint,
    max_event_id bigint,
    created_on timestamp with time zone DEFAULT now() NOT NULL,
    written_on timestamp with time zone,
    deleted_on timestamp with time zone,
    CONSTRAINT deleted_has_time CHECK (((state = 'deleted'::text) = (deleted_on IS NOT NULL))),
    CONSTRAINT tickler_archive_run_state_check CHECK ((state = ANY (ARRAY['selected'::text, 'written'::text, 'deleted'::text]))),
    CONSTRAINT written_has_time CHECK (((state = 'selected'::text) = (written_on IS NULL))),
    CONSTRAINT tickler_archive_run_pkey PRIMARY KEY (id)
);

CREATE UNIQUE INDEX tickler_archive_run_unfinished ON tickler_archive_run USING btree ((true)) WHERE (state <> 'deleted'::text);


-- The events an unfinished run selected; an event is moved by one run only.
CREATE TABLE tickler_archive_item (
    run_id bigint NOT NULL,
    event_id bigint NOT NULL,
    queue text,
    schedule_on timestamp with time zone,
    dequeued_on timestamp with time zone,
    CONSTRAINT tickler_archive_item_pkey PRIMARY KEY (run_id, event_id),
    CONSTRAINT tickler_archive_item_run_id_fkey FOREIGN KEY (run_id) REFERENCES tickler_archive_run(id)
);

COMMENT ON COLUMN tickler_archive_item.queue IS 'The event''s queue, schedule_on and dequeued_on: how the run''s reads find it in history (which has no index by id).';

CREATE UNIQUE INDEX tickler_archive_item_event ON tickler_archive_item USING btree (event_id);


-- Keys whose older history is in the archive: what the timeline API tells its readers.
CREATE TABLE tickler_archived_key (
    queue text NOT NULL,
    item_key text NOT NULL COLLATE pg_catalog."C",
    first_archive_id bigint NOT NULL,
    archive_id bigint NOT NULL,
    archived_through timestamp with time zone NOT NULL,
    events bigint NOT NULL,
    CONSTRAINT tickler_archived_key_events_check CHECK ((events > 0)),
    CONSTRAINT tickler_archived_key_pkey PRIMARY KEY (queue, item_key),
    CONSTRAINT tickler_archived_key_archive_id_fkey FOREIGN KEY (archive_id) REFERENCES tickler_archive_run(id),
    CONSTRAINT tickler_archived_key_first_archive_id_fkey FOREIGN KEY (first_archive_id) REFERENCES tickler_archive_run(id)
);


-- How far the archive has written history: every event finished before archived_through is in
-- it. While a queue asks for archive_before_prune, only days before it are dropped.
CREATE TABLE tickler_archive_progress (
    id boolean DEFAULT true NOT NULL,
    archived_through timestamp with time zone NOT NULL,
    updated_on timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tickler_archive_progress_id_check CHECK (id),
    CONSTRAINT tickler_archive_progress_pkey PRIMARY KEY (id)
);


-- Imports, each committed in bounded batches; a rerun of an unfinished import (the same
-- fingerprint) resumes it.
CREATE TABLE tickler_import (
    id bigint GENERATED ALWAYS AS IDENTITY,
    fingerprint text NOT NULL,
    source text NOT NULL,
    principal text NOT NULL,
    on_conflict text NOT NULL,
    partitions integer NOT NULL,
    batch_rows integer NOT NULL,
    started_on timestamp with time zone DEFAULT now() NOT NULL,
    finished_on timestamp with time zone,
    counts jsonb,
    debounce_max_seconds double precision,
    CONSTRAINT tickler_import_batch_rows_check CHECK ((batch_rows > 0)),
    CONSTRAINT tickler_import_partitions_check CHECK ((partitions > 0)),
    CONSTRAINT tickler_import_pkey PRIMARY KEY (id)
);

CREATE UNIQUE INDEX tickler_import_unfinished ON tickler_import USING btree (fingerprint) WHERE (finished_on IS NULL);


-- The batches an import has written, with their counts: a batch already here is skipped.
CREATE TABLE tickler_import_batch (
    import_id bigint NOT NULL,
    part integer NOT NULL,
    batch integer NOT NULL,
    created integer DEFAULT 0 NOT NULL,
    replaced integer DEFAULT 0 NOT NULL,
    ignored integer DEFAULT 0 NOT NULL,
    rejected integer DEFAULT 0 NOT NULL,
    invalid integer DEFAULT 0 NOT NULL,
    duplicate integer DEFAULT 0 NOT NULL,
    debounced integer DEFAULT 0 NOT NULL,
    CONSTRAINT tickler_import_batch_pkey PRIMARY KEY (import_id, part, batch),
    CONSTRAINT tickler_import_batch_import_id_fkey FOREIGN KEY (import_id) REFERENCES tickler_import(id) ON DELETE CASCADE
);


-- The rows an import did not write, with why and their cells (bytes: a cell may hold a NUL).
CREATE TABLE tickler_import_reject (
    import_id bigint NOT NULL,
    row_number bigint NOT NULL,
    outcome text NOT NULL,
    reason text NOT NULL,
    cells bytea[] NOT NULL,
    CONSTRAINT tickler_import_reject_pkey PRIMARY KEY (import_id, row_number),
    CONSTRAINT tickler_import_reject_import_id_fkey FOREIGN KEY (import_id) REFERENCES tickler_import(id) ON DELETE CASCADE
);


-- One row per erasure: who asked, when and why, which values it erases as keyed hashes (never the
-- values), how far it is and what it changed. Never pruned. database_done_at: the database holds
-- nothing of the subject any more; the archive's files are next (`tickler pipeline erase`).
CREATE TABLE tickler_erasure (
    id bigint GENERATED ALWAYS AS IDENTITY,
    requested_by text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    reason text NOT NULL,
    queues text[],
    group_key_hash text,
    item_key_hashes text[],
    item_key_prefix_hash text,
    status text DEFAULT 'pending'::text NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    database_done_at timestamp with time zone,
    open_events bigint DEFAULT 0 NOT NULL,
    finished_events bigint DEFAULT 0 NOT NULL,
    timeline_entries bigint DEFAULT 0 NOT NULL,
    archive_rows bigint DEFAULT 0 NOT NULL,
    note text,
    leases_end_at timestamp with time zone,
    CONSTRAINT erasure_has_selector CHECK (((group_key_hash IS NOT NULL) OR (item_key_hashes IS NOT NULL) OR (item_key_prefix_hash IS NOT NULL))),
    CONSTRAINT erasure_finished_has_time CHECK (((status = ANY (ARRAY['done'::text, 'failed'::text])) = (finished_at IS NOT NULL))),
    CONSTRAINT tickler_erasure_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text, 'failed'::text]))),
    CONSTRAINT tickler_erasure_pkey PRIMARY KEY (id)
);

CREATE INDEX tickler_erasure_unfinished ON tickler_erasure USING btree (id) WHERE (finished_at IS NULL);

-- What an unfinished erasure looks for, in clear: its runner needs the values to find their rows.
-- The row goes in the transaction that finishes the erasure.
CREATE TABLE tickler_erasure_work (
    erasure_id bigint NOT NULL,
    group_key text COLLATE pg_catalog."C",
    item_keys text[] COLLATE pg_catalog."C",
    item_key_prefix text COLLATE pg_catalog."C",
    item_key_prefix_end text COLLATE pg_catalog."C",
    history_walked_to timestamp with time zone,
    CONSTRAINT tickler_erasure_work_pkey PRIMARY KEY (erasure_id),
    CONSTRAINT tickler_erasure_work_erasure_id_fkey FOREIGN KEY (erasure_id) REFERENCES tickler_erasure(id)
);

-- The keyed hashes of the keys and groups an erasure erased, by queue: what a lookup by value
-- finds (an erasure by prefix names no key itself), and the keys whose timeline ends `erased`.
CREATE TABLE tickler_erased_value (
    erasure_id bigint NOT NULL,
    queue text NOT NULL,
    kind text NOT NULL,
    value_hash text NOT NULL COLLATE pg_catalog."C",
    CONSTRAINT tickler_erased_value_kind_check CHECK ((kind = ANY (ARRAY['item_key'::text, 'group_key'::text]))),
    CONSTRAINT tickler_erased_value_pkey PRIMARY KEY (erasure_id, queue, kind, value_hash),
    CONSTRAINT tickler_erased_value_erasure_id_fkey FOREIGN KEY (erasure_id) REFERENCES tickler_erasure(id)
);

CREATE INDEX tickler_erased_value_hash ON tickler_erased_value USING btree (value_hash);

-- The operations log: who changed how tickler runs, when, and what changed (before and after,
-- never a secret or a token), written in the transaction of the change; kept for
-- TICKLER_AUDIT_RETENTION_DAYS.
CREATE TABLE tickler_operation_log (
    id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    queue text,
    before jsonb,
    after jsonb,
    CONSTRAINT tickler_operation_log_pkey PRIMARY KEY (id)
);

CREATE INDEX tickler_operation_log_queue ON tickler_operation_log USING btree (queue, id);

CREATE INDEX tickler_operation_log_at ON tickler_operation_log USING btree (at);


-- Open events per queue and hour (UTC) they fall due, and per minute of it (60 counts), kept by
-- the event triggers: what a forecast reads. One slot per backend, as tickler_queue_count.
CREATE TABLE tickler_due_count (
    queue text NOT NULL,
    hour timestamp with time zone NOT NULL,
    slot integer NOT NULL,
    n bigint NOT NULL,
    minutes bigint[] NOT NULL,
    CONSTRAINT tickler_due_count_minutes_check CHECK ((cardinality(minutes) = 60)),
    CONSTRAINT tickler_due_count_pkey PRIMARY KEY (queue, hour, slot)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000');


-- When tickler_due_count was counted from the events (one row; none yet: forecasts not exact).
CREATE TABLE tickler_due_count_seeded (
    id boolean DEFAULT true NOT NULL,
    seeded_on timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tickler_due_count_seeded_id_check CHECK (id),
    CONSTRAINT tickler_due_count_seeded_pkey PRIMARY KEY (id)
);

COMMENT ON TYPE tickler_timeline_row IS 'One timeline entry to write: the columns of tickler_timeline that its writers give (see tickler_timeline_write).';
