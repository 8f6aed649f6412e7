"""JSON events in, purchases out: filtered and reshaped, written exactly once to another Kafka topic.

Written only against Relay's public contract (``relay.pipeline``) and one of its sinks. Input values
look like ``{"id": 7, "kind": "purchase", "user": "u3", "amount": 12.5}``; the transform spreads the
parsing over more tasks than the topic has partitions (a shuffle), keeps the purchases with a
positive amount and writes ``{"id", "user", "cents"}`` keyed by user. Relay regroups each batch by
source partition before the sink, and each source partition's rows go out in ONE Kafka transaction
together with a marker of the source range: a replay after a crash writes nothing again, and a
read_committed consumer of the output sees every purchase exactly once.
"""

from __future__ import annotations

import os

from relay.pipeline import Pipeline
from relay.sinks.kafka_transactional import KafkaTransactionalSink

NAME = "kafka_to_kafka"
TOPIC = "kafka_to_kafka"
OUTPUT_TOPIC = "kafka_to_kafka_purchases"
BOOTSTRAP_ENV = "KAFKA_TO_KAFKA_BOOTSTRAP"  # the OUTPUT cluster, host:port[,host:port]
VALUE_SCHEMA = "id BIGINT, kind STRING, user STRING, amount DOUBLE"
PARSE_TASKS = 4  # more than the topic's partitions: the parse spreads over every executor core


def transform(df):  # noqa: ANN001, ANN201 - pyspark DataFrames (imported on the executors, not here)
    """Parse, keep purchases with a positive amount, reshape to ``key`` and a JSON ``value``.

    ``repartition`` is any shuffle a user may write (a join, a groupBy, dropDuplicates): Relay sees
    that the plan is not narrow and regroups the batch by source partition before the Kafka sink.
    ``topic``, ``partition``, ``offset`` stay (the contract: the sink's markers are source ranges,
    and each output record carries its source position). Values that are not JSON parse to NULL
    and drop.
    """
    from pyspark.sql import functions as F

    v = F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v")
    events = df.repartition(PARSE_TASKS).select("topic", "partition", "offset", v)
    kept = events.where((F.col("v.kind") == "purchase") & (F.col("v.amount") > 0) & F.col("v.id").isNotNull())
    cents = F.round(F.col("v.amount") * 100).cast("long")
    body = F.struct(F.col("v.id").alias("id"), F.col("v.user").alias("user"), cents.alias("cents"))
    return kept.select(
        "topic",
        "partition",
        "offset",
        F.col("v.user").alias("key"),  # output partition follows the user: one user's purchases in order
        F.to_json(body).alias("value"),
    )


def sink() -> KafkaTransactionalSink:
    """Built on the driver at start, where Relay put the variable (not when ``relay build`` imports)."""
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        raise KeyError(f"{BOOTSTRAP_ENV} is not set")
    return KafkaTransactionalSink(bootstrap, OUTPUT_TOPIC, key_column="key", value_column="value")


PIPELINE = Pipeline(
    name=NAME,
    topics=(TOPIC,),
    transform=transform,
    sink=sink,
    secret_env=(BOOTSTRAP_ENV,),  # how a setting reaches the driver (security settings would too)
)
