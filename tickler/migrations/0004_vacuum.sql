-- Keep the claim indexes small however long tickler runs: every claim and every finish leaves a
-- dead tuple (and a dead entry in the claim indexes) behind, so tickler_event is vacuumed after
-- 1% of it changed instead of PostgreSQL's default 20%, without throttling. The queue rows are
-- rewritten by every dispatcher going to sleep; they stay tiny if vacuumed often.
-- (These settings act only where autovacuum runs: tickler logs a warning when it is off.)
ALTER TABLE tickler_event SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE tickler_queue SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
ALTER TABLE tickler_queue_count SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
