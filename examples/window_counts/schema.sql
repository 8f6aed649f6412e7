-- The target table of the window_counts example. Create it before the first deploy (the sink checks
-- it at start and creates only its own fence table, relay_sink_fences).
-- For a stateful pipeline the three _relay_ columns hold the WRITER's position, not a record's:
-- ('relay-state', generation, micro-batch id). A newer writer (green after an upgrade's handoff)
-- replaces an older one's count; a replayed batch writes the same count again (a no-op).
CREATE TABLE IF NOT EXISTS window_counts (
    window_start     bigint NOT NULL,
    word             text   NOT NULL,
    n                bigint NOT NULL,
    _relay_topic     text,
    _relay_partition integer,
    _relay_offset    bigint,
    PRIMARY KEY (window_start, word)
);
