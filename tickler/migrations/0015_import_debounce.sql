-- The import debounces as the API does (--on-conflict debounce, --debounce-max-seconds): the
-- ledger counts the debounced rows of each batch, and keeps the cap an import started with, so a
-- resumed import debounces its remaining batches with the same one.
ALTER TABLE tickler_import_batch ADD COLUMN debounced integer NOT NULL DEFAULT 0;
ALTER TABLE tickler_import ADD COLUMN debounce_max_seconds double precision;
