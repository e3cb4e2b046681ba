-- Reads from a replica (SPEC §13): how far behind the primary a server is.

-- name: replica_lag
-- Seconds the server's data is behind its primary: 0 on a primary, and 0 on a standby that
-- streams from its primary and has replayed all the WAL it received (an idle primary sends
-- nothing, so the time of the last replayed transaction grows old without the standby being
-- behind); else the age of the last transaction it replayed. A standby whose WAL receiver is not
-- streaming (its primary gone, or unreachable) cannot know what it misses: its age counts, however
-- idle the primary may be. (One cut off silently keeps its receiver until wal_receiver_timeout,
-- 60 s by default, ends it.) A role without pg_read_all_stats sees the receiver but not its
-- status: a receiver that runs counts as streaming. NULL (a standby that replayed nothing yet):
-- as far behind as can be.
SELECT CASE
           WHEN NOT pg_is_in_recovery() THEN 0.0
           WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
                AND EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE coalesce(status, 'streaming') = 'streaming')
               THEN 0.0
           ELSE CAST(extract(epoch FROM now() - pg_last_xact_replay_timestamp()) AS double precision)
       END AS lag_seconds;
