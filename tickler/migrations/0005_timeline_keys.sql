-- One B-tree per timeline row instead of two.
--
-- Every claim and every finish appends a timeline row in the same statement, so each B-tree on
-- tickler_timeline is WAL written for every delivered event (pg_waldump, bench/walprofile.py:
-- the timeline's two B-trees were 4 of the 10 index entries a delivered event wrote).
-- The timeline is read by key, and (queue, item_key, id) is unique because id is: it becomes the
-- primary key, in place of a separate B-tree on id alone. Range reads by id (the pipeline's
-- partitioned reads) get a BRIN index: append-only ids are physically ordered, and a
-- BRIN index is not written on insert until its page range is summarised. (The report's one
-- min(id)/max(id) per run becomes a scan of the timeline: seconds at tens of millions of rows.)

ALTER TABLE tickler_timeline DROP CONSTRAINT tickler_timeline_pkey;
DROP INDEX tickler_timeline_key;
ALTER TABLE tickler_timeline ADD CONSTRAINT tickler_timeline_pkey PRIMARY KEY (queue, item_key, id);
CREATE INDEX tickler_timeline_id ON tickler_timeline USING brin (id) WITH (autosummarize = on);
