-- Erasing a subject (SPEC §12): the erasure log, kept whatever the retention, and the timeline's
-- last word on an erased key (`erased`, an entry of no event).

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

-- The timeline of an erased key ends with `erased`, an entry of the erasure, not of an event.
ALTER TABLE tickler_timeline DROP CONSTRAINT tickler_timeline_action_check;
ALTER TABLE tickler_timeline ADD CONSTRAINT tickler_timeline_action_check CHECK ((action = ANY (ARRAY['enqueued'::text, 'replaced'::text, 'rescheduled'::text, 'updated'::text, 'claimed'::text, 'delivered'::text, 'failed'::text, 'released'::text, 'lease_expired'::text, 'cancelled'::text, 'dead'::text, 'debounced'::text, 'retried'::text, 'schedule_created'::text, 'schedule_updated'::text, 'schedule_deleted'::text, 'erased'::text])));
ALTER TABLE tickler_timeline DROP CONSTRAINT timeline_event_id_present;
ALTER TABLE tickler_timeline ADD CONSTRAINT timeline_event_id_present CHECK (((event_id IS NOT NULL) OR (action = ANY (ARRAY['schedule_created'::text, 'schedule_updated'::text, 'schedule_deleted'::text, 'erased'::text]))));
