-- tickler schema: queues, events, their timeline, per-queue counters and API tokens.
-- The state machine of an event lives here: CHECK constraints tie each state to its columns,
-- and the partial unique index is what guarantees one open event per (queue, item_key).

CREATE TABLE tickler_queue (
    name                      text PRIMARY KEY
                              CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    delivery_mode             text NOT NULL CHECK (delivery_mode IN ('pull', 'webhook')),
    webhook_url               text,
    webhook_timeout_seconds   double precision,
    signing_secret            text,
    -- While a secret is rotated, deliveries are signed with both (Standard Webhooks allows
    -- several signatures), so receivers can switch without dropping a delivery.
    previous_signing_secret   text,
    previous_secret_until     timestamptz,
    lease_seconds             double precision NOT NULL CHECK (lease_seconds > 0),
    max_attempts              integer NOT NULL CHECK (max_attempts >= 1),
    backoff_initial_seconds   double precision NOT NULL CHECK (backoff_initial_seconds >= 0),
    backoff_max_seconds       double precision NOT NULL CHECK (backoff_max_seconds >= backoff_initial_seconds),
    backoff_multiplier        double precision NOT NULL CHECK (backoff_multiplier >= 1),
    created_on                timestamptz NOT NULL DEFAULT now(),
    updated_on                timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_has_url_and_secret CHECK (
        delivery_mode <> 'webhook'
        OR (webhook_url IS NOT NULL AND webhook_timeout_seconds > 0 AND signing_secret IS NOT NULL)
    )
);

CREATE TABLE tickler_event (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL REFERENCES tickler_queue (name),
    -- "C" collation: byte order, so item_key_prefix searches are plain index range scans.
    item_key          text COLLATE "C" NOT NULL,
    group_key         text COLLATE "C",
    schedule_on       timestamptz NOT NULL,
    data              jsonb NOT NULL DEFAULT '{}',
    enqueued_on       timestamptz NOT NULL DEFAULT now(),
    enqueued_by       text NOT NULL,
    dequeued_on       timestamptz,
    dequeued_by       text,
    outcome           text,
    claimed_on        timestamptz,
    claimed_by        text,
    lease_id          uuid,
    lease_expires_on  timestamptz,
    redeliver_count   integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL,
    last_error        text,
    version           integer NOT NULL DEFAULT 1,

    CONSTRAINT item_key_syntax CHECK (char_length(item_key) BETWEEN 1 AND 255 AND strpos(item_key, '/') = 0),
    CONSTRAINT group_key_syntax CHECK (group_key IS NULL OR char_length(group_key) BETWEEN 1 AND 255),
    CONSTRAINT data_is_object CHECK (jsonb_typeof(data) = 'object'),
    CONSTRAINT outcome_known CHECK (outcome IN ('delivered', 'cancelled', 'dead')),
    -- Finished means: an outcome, a time and an actor, all three or none.
    CONSTRAINT finished_has_outcome CHECK ((dequeued_on IS NULL) = (outcome IS NULL)),
    CONSTRAINT finished_has_actor CHECK ((dequeued_on IS NULL) = (dequeued_by IS NULL)),
    CONSTRAINT claim_has_claimer CHECK ((claimed_on IS NULL) = (claimed_by IS NULL)),
    CONSTRAINT lease_has_expiry CHECK ((lease_id IS NULL) = (lease_expires_on IS NULL)),
    CONSTRAINT lease_has_claim CHECK (lease_id IS NULL OR claimed_on IS NOT NULL),
    CONSTRAINT redeliver_count_not_negative CHECK (redeliver_count >= 0),
    CONSTRAINT max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT version_positive CHECK (version >= 1)
);

-- At most one open event per key. The database enforces it, also under concurrent requests.
CREATE UNIQUE INDEX tickler_event_open_key
    ON tickler_event (queue, item_key) WHERE dequeued_on IS NULL;

-- Open events by time: claims of due events, due counts, searches over open events.
-- Finished events are not in it, so a claim never steps over history however long it grows.
CREATE INDEX tickler_event_open_schedule
    ON tickler_event (queue, schedule_on, id) WHERE dequeued_on IS NULL;

-- Open events of a group by time: group claims take all due events of one group at once.
CREATE INDEX tickler_event_open_group
    ON tickler_event (queue, group_key, schedule_on, id)
    WHERE dequeued_on IS NULL AND group_key IS NOT NULL;

-- Events held under a lease (few at any time): ack/nack/extend by lease id, the lease reaper.
CREATE INDEX tickler_event_leased
    ON tickler_event (lease_id) WHERE dequeued_on IS NULL AND lease_id IS NOT NULL;

-- Groups holding a lease: "at most one lease per group" is checked on this small index.
CREATE INDEX tickler_event_leased_group
    ON tickler_event (queue, group_key)
    WHERE dequeued_on IS NULL AND lease_id IS NOT NULL AND group_key IS NOT NULL;

-- Finished events by time: searches by outcome and the archive.
CREATE INDEX tickler_event_finished_schedule
    ON tickler_event (queue, schedule_on, id) WHERE dequeued_on IS NOT NULL;

-- The status users see, derived the same way everywhere: an outcome, a live lease, or pending.
CREATE FUNCTION tickler_status(outcome text, lease_expires_on timestamptz, at timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN outcome IS NOT NULL THEN outcome
        WHEN lease_expires_on > at THEN 'in_flight'
        ELSE 'pending'
    END
$$;


-- Append-only history of every key. No foreign key to tickler_event: the history of a key
-- outlives its events (finished events may be archived away).
CREATE TABLE tickler_timeline (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    item_key     text COLLATE "C" NOT NULL,
    event_id     bigint NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    action       text NOT NULL CHECK (action IN (
                     'enqueued', 'replaced', 'rescheduled', 'updated', 'claimed', 'delivered',
                     'failed', 'released', 'lease_expired', 'cancelled', 'dead')),
    actor        text NOT NULL,
    schedule_on  timestamptz,
    details      jsonb NOT NULL DEFAULT '{}'
);

CREATE INDEX tickler_timeline_key ON tickler_timeline (queue, item_key, id);

CREATE FUNCTION tickler_timeline_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The archive job is the one writer allowed to remove history, and says so explicitly.
    IF TG_OP IN ('DELETE', 'TRUNCATE') AND current_setting('tickler.archiving', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'tickler_timeline is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER tickler_timeline_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tickler_timeline
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_timeline_append_only();


-- Counts of events per queue and state, kept by statement-level triggers so that the queue
-- endpoint never counts rows. Each backend writes its own slot, so concurrent writers do not
-- queue up behind one counter row; readers add the slots up.
CREATE TABLE tickler_queue_count (
    queue  text NOT NULL,
    state  text NOT NULL CHECK (state IN ('open', 'delivered', 'cancelled', 'dead')),
    slot   integer NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (queue, state, slot)
);

CREATE FUNCTION tickler_count_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, count(*)
        FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, coalesce(outcome, 'open'), pg_backend_pid() % 64, -count(*)
        FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    ELSE
        INSERT INTO tickler_queue_count AS c (queue, state, slot, n)
        SELECT queue, state, pg_backend_pid() % 64, sum(delta)
        FROM (
            SELECT queue, coalesce(outcome, 'open') AS state, 1 AS delta FROM new_rows
            UNION ALL
            SELECT queue, coalesce(outcome, 'open'), -1 FROM old_rows
        ) AS changes
        GROUP BY 1, 2 HAVING sum(delta) <> 0 ORDER BY 1, 2
        ON CONFLICT (queue, state, slot) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tickler_count_inserted AFTER INSERT ON tickler_event
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();
CREATE TRIGGER tickler_count_deleted AFTER DELETE ON tickler_event
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();
CREATE TRIGGER tickler_count_updated AFTER UPDATE ON tickler_event
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tickler_count_events();


-- API tokens: only a SHA-256 of each token is kept (tokens are 256-bit random, so a fast hash
-- is enough); the token itself is shown once, when it is created.
CREATE TABLE tickler_token (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal   text NOT NULL CHECK (char_length(principal) BETWEEN 1 AND 200),
    token_hash  bytea NOT NULL UNIQUE,
    is_admin    boolean NOT NULL DEFAULT false,
    queues      text[] NOT NULL DEFAULT '{}',
    created_on  timestamptz NOT NULL DEFAULT now(),
    revoked_on  timestamptz
);
