-- The import's ledger: each import commits in bounded batches, and each batch records itself here
-- in the transaction that writes its events. A batch already recorded is skipped (a retried task,
-- or a rerun of an import that died part-way, resumes instead of reporting its own rows as
-- conflicts), and the counts and rejects reported come from here, once per row whatever Spark
-- retried. See docs/pipeline.md.

CREATE TABLE tickler_import (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- what makes a rerun the same import: the file (path, size, time), principal, options
    fingerprint   text NOT NULL,
    source        text NOT NULL,
    principal     text NOT NULL,
    on_conflict   text NOT NULL,
    -- how rows were cut into batches: a resumed import must cut them the same way
    partitions    integer NOT NULL CHECK (partitions > 0),
    batch_rows    integer NOT NULL CHECK (batch_rows > 0),
    started_on    timestamptz NOT NULL DEFAULT now(),
    finished_on   timestamptz,
    -- {"created": n, ...} once finished (the batch and reject rows are then deleted)
    counts        jsonb
);

-- One unfinished import per fingerprint: a rerun finds it and resumes.
CREATE UNIQUE INDEX tickler_import_unfinished ON tickler_import (fingerprint) WHERE finished_on IS NULL;

CREATE TABLE tickler_import_batch (
    import_id   bigint NOT NULL REFERENCES tickler_import (id) ON DELETE CASCADE,
    part        integer NOT NULL,
    batch       integer NOT NULL,
    created     integer NOT NULL DEFAULT 0,
    replaced    integer NOT NULL DEFAULT 0,
    ignored     integer NOT NULL DEFAULT 0,
    rejected    integer NOT NULL DEFAULT 0,
    invalid     integer NOT NULL DEFAULT 0,
    duplicate   integer NOT NULL DEFAULT 0,
    PRIMARY KEY (import_id, part, batch)
);

-- Rows that were not written, with why and their cells, for the rejects file.
CREATE TABLE tickler_import_reject (
    import_id   bigint NOT NULL REFERENCES tickler_import (id) ON DELETE CASCADE,
    row_number  bigint NOT NULL,
    outcome     text NOT NULL,
    reason      text NOT NULL,
    -- the cells as UTF-8 bytes: a rejected cell may hold a NUL, which text cannot
    cells       bytea[] NOT NULL,
    PRIMARY KEY (import_id, row_number)
);
