"""JSON values like ``{"id": 7, "name": "Ada", "score": 1.5}`` upserted by ``id`` into PostgreSQL.

Written only against Relay's public contract (``relay.pipeline``) and one of its sinks. The
transform runs on the executors; each Spark task upserts its rows in one fenced transaction, and a
row is replaced only by a record from a later offset of its partition (the producer keys records by
``id``, so one id's updates stay in one partition, in order): the table holds the newest value per id.
"""

from __future__ import annotations

import os

from relay.pipeline import Pipeline
from relay.sinks.postgres_upsert import PostgresUpsertSink

TOPIC = "json_upsert"
TABLE = "json_upsert_users"
SINK_URL_ENV = "JSON_UPSERT_SINK_URL"  # postgresql://user:password@host:port/db (never in argv or logs)
VALUE_SCHEMA = "id BIGINT, name STRING, score DOUBLE"


def transform(df):  # noqa: ANN001, ANN201 - pyspark DataFrames (imported on the executors, not here)
    """Parse the JSON value; keep topic, partition and offset (the sink's source position).

    A value that is not JSON or has no id parses to a NULL id and is dropped here: the upsert has no
    key for it (the batch record's rows_read counts only the rows that reach the sink).
    """
    from pyspark.sql import functions as F

    parsed = df.select(
        "topic", "partition", "offset", F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v")
    )
    return parsed.where(F.col("v.id").isNotNull()).select(
        "topic", "partition", "offset", "v.id", "v.name", "v.score"
    )


def sink() -> PostgresUpsertSink:
    """Built on the driver at start, where the URL is in the environment (not at ``relay build``)."""
    url = os.environ.get(SINK_URL_ENV)
    if not url:
        raise KeyError(f"{SINK_URL_ENV} is not set")
    return PostgresUpsertSink(url, table=TABLE, key=["id"], columns=["id", "name", "score"])


PIPELINE = Pipeline(
    name="json_upsert",
    topics=(TOPIC,),
    transform=transform,
    sink=sink,
    secret_env=(SINK_URL_ENV,),
)
