-- The target table of the json_upsert example. Create it before the first deploy (the sink checks
-- it at start and creates only its own fence table, relay_sink_fences).
-- The three _relay_ columns hold each row's source position (topic, partition, offset): the sink
-- replaces a row only with a record from a later position (newest wins, a replay is a no-op).
CREATE TABLE IF NOT EXISTS json_upsert_users (
    id               bigint PRIMARY KEY,
    name             text,
    score            double precision,
    _relay_topic     text,
    _relay_partition integer,
    _relay_offset    bigint
);
