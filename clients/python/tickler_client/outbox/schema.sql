-- The tickler outbox: calls to tickler written in the service's own PostgreSQL, inside the
-- service's own transaction, and forwarded by a relay once committed (tickler_client.outbox).
-- Create it with `tickler_client.outbox.install(conn)`, `tickler-outbox install`, or by running
-- this file in a migration of your own. Running it again changes nothing.

-- One row per call, in the order the calls of one key were committed. The writer takes a
-- transaction-level advisory lock on (queue, item_key) before inserting, so two transactions
-- writing the same key insert and commit one after the other: per key, `id` order is commit
-- order, and the relay forwards in `id` order.
CREATE TABLE IF NOT EXISTS tickler_outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL,
    item_key    text NOT NULL,
    operation   text NOT NULL CHECK (operation IN ('schedule', 'reschedule', 'cancel')),
    -- The call's fields as tickler's HTTP API takes them. Every time is absolute (a `delay` is
    -- turned into `schedule_on` from the database clock when the row is written), so a call
    -- sent again means the same thing.
    body        jsonb NOT NULL DEFAULT '{}',
    written_on  timestamptz NOT NULL DEFAULT now(),
    -- Sends that got no usable answer (tickler unreachable, 5xx, 401/403) and the last reason.
    tries       integer NOT NULL DEFAULT 0,
    last_error  text
);

-- The relay's pick: the oldest row of each key.
CREATE INDEX IF NOT EXISTS tickler_outbox_key_order ON tickler_outbox (queue, item_key, id);

-- Rows whose request a relay has started to send, written (and committed) before the request
-- goes out. A row found here by a later relay may have reached tickler already (its relay died
-- before deleting it): the relay reads the key in tickler before sending it again.
CREATE TABLE IF NOT EXISTS tickler_outbox_sent (
    id       bigint PRIMARY KEY,
    sent_on  timestamptz NOT NULL DEFAULT now()
);
