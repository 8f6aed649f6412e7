"""Records counted per key and 10-second window of their Kafka timestamp, upserted into PostgreSQL.

Written only against Relay's public contract (``relay.pipeline``) and one of its sinks. The
transform is STATEFUL (``stateful=True``): Spark applies it to the stream, keeps each open window's
count in the checkpoint, and hands the sink the windows each micro-batch updated. An upgrade's new
version starts ``warm_up_s`` back and reads in shadow, writing nothing, so its counts are whole when
it starts writing at the handoff: the table ends as it would have without the upgrade.
"""

from __future__ import annotations

import os

from relay.pipeline import Pipeline
from relay.sinks.postgres_upsert import PostgresUpsertSink

NAME = "window_counts"
TOPIC = "window_counts"
TABLE = "window_counts"
SINK_URL_ENV = "WINDOW_COUNTS_SINK_URL"  # postgresql://user:password@host:port/db
WINDOW = "10 seconds"
WATERMARK = "10 seconds"  # a record more than this behind the newest one seen may be dropped
WARM_UP_S = 60.0  # >= window + watermark delay, with room for a slow standby


def transform(df):  # noqa: ANN001, ANN201 - a pyspark streaming DataFrame
    """(window_start epoch seconds, word = the record's key, n records), per updated window."""
    from pyspark.sql import functions as F

    words = df.where(F.col("key").isNotNull()).select("timestamp", F.col("key").cast("string").alias("word"))
    counts = (
        words.withWatermark("timestamp", WATERMARK).groupBy(F.window("timestamp", WINDOW), "word").count()
    )
    return counts.select(
        F.col("window.start").cast("long").alias("window_start"), "word", F.col("count").alias("n")
    )


def sink() -> PostgresUpsertSink:
    """Built on the driver at start, where the URL is in the environment (not at ``relay build``)."""
    url = os.environ.get(SINK_URL_ENV)
    if not url:
        raise KeyError(f"{SINK_URL_ENV} is not set")
    return PostgresUpsertSink(
        url, table=TABLE, key=["window_start", "word"], columns=["window_start", "word", "n"]
    )


PIPELINE = Pipeline(
    name=NAME,
    topics=(TOPIC,),
    transform=transform,
    sink=sink,
    stateful=True,
    warm_up_s=WARM_UP_S,
    max_offsets_per_trigger=5000,
    secret_env=(SINK_URL_ENV,),
)
