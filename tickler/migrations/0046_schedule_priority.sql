-- Priority and fairness key of recurring schedules (SPEC §10: settable wherever `data` is): every
-- occurrence a schedule enqueues carries them. NULL fairness_key: none (an occurrence then has
-- none either). Constant defaults: no table rewrite.
ALTER TABLE tickler_schedule
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CONSTRAINT schedule_priority_range CHECK (priority BETWEEN -100 AND 100),
    ADD COLUMN fairness_key text COLLATE "C"
        CONSTRAINT schedule_fairness_key_syntax CHECK (char_length(fairness_key) BETWEEN 1 AND 255 AND strpos(fairness_key, '/') = 0);
