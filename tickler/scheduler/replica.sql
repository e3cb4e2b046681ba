-- Reads from a replica (SPEC §13): how far behind the primary a server is.

-- name: replica_lag
-- Seconds the server's data is behind its primary: 0 on a primary, and 0 on a standby that has
-- replayed all the WAL it received (an idle primary sends nothing, so the time of the last
-- replayed transaction grows old without the standby being behind); else the age of the last
-- transaction it replayed. NULL (a standby that replayed nothing yet, and has WAL waiting): as
-- far behind as can be.
SELECT CASE
           WHEN NOT pg_is_in_recovery() THEN 0.0
           WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0.0
           ELSE CAST(extract(epoch FROM now() - pg_last_xact_replay_timestamp()) AS double precision)
       END AS lag_seconds;
