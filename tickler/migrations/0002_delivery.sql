-- Delivery: claims, leases and on-time wake-ups.

-- Exactly the rows an ungrouped claim may take, in the order it takes them: a claim never steps
-- over leased, grouped or finished rows, however many there are.
CREATE INDEX tickler_event_claimable
    ON tickler_event (queue, schedule_on, id)
    WHERE dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NULL;

-- The same for grouped rows: a group claim finds the groups with due events through it.
CREATE INDEX tickler_event_claimable_group
    ON tickler_event (queue, schedule_on, id)
    INCLUDE (group_key)
    WHERE dequeued_on IS NULL AND lease_id IS NULL AND group_key IS NOT NULL;

-- The earliest time at which a sleeping dispatcher of this queue will look at it again.
-- Writers of events due before it send a NOTIFY (and only they: NOTIFY serialises commits).
-- Dispatchers set it under FOR UPDATE right before they sleep; writers read it FOR KEY SHARE
-- (the lock their foreign key takes anyway), so either a writer's event is committed before a
-- dispatcher computes its next wake-up, or the writer sees the new value and notifies.
-- Until a dispatcher sleeps, no writer needs to notify: the epoch is before every event (rules).
ALTER TABLE tickler_queue ADD COLUMN next_wake timestamptz NOT NULL DEFAULT '1970-01-01 00:00:00+00';
