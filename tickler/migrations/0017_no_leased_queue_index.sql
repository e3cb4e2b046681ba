-- The live leases of a queue are counted through the lease-expiry indexes of 0014
-- ((queue, lease_expires_on), ungrouped and grouped apart), which hold exactly each queue's
-- leased, open rows: `lease_expires_on > now` is one range scan in each. The (queue, lease_id)
-- index of 0009 served only that count, and every claim and every finish wrote an entry to it.
DROP INDEX tickler_event_leased_queue;
