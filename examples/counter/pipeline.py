"""The seeds' counter: every record ``key = value = counter`` becomes one row of the ledger's
``messages`` table, written by the executors; poison keys become dead letters.

Written only against Relay's public contract (``relay.pipeline``) and one of its sinks. It is the
reference job (``spark_jobs/reference_job.py``) without the driver-side collect: same topic, same
table, same count (``pipelines.message_count``), so ``relay audit --deep`` and the seeds' count check
read it exactly as they read the reference job.
"""

from __future__ import annotations

from relay.pipeline import Pipeline
from relay.sinks.ledger_messages import LedgerMessagesSink

NAME = "experience"
TOPIC = "experience"  # the reference job's default topic


def transform(df):  # noqa: ANN001, ANN201 - pyspark DataFrames (imported on the executors, not here)
    """The record as it came: its source position (the contract) plus the key and value the sink
    stores; nothing is parsed here, so a poison key reaches the sink and becomes a dead letter."""
    return df.select("topic", "partition", "offset", "key", "value")


def sink() -> LedgerMessagesSink:
    """Built on the driver at start: the ledger's URL is in every driver's environment (Relay puts
    it there as RELAY_LEDGER_URL), so it needs no ``secret_env`` of its own."""
    return LedgerMessagesSink()


PIPELINE = Pipeline(
    name=NAME,
    topics=(TOPIC,),
    transform=transform,
    sink=sink,
    max_offsets_per_trigger=20000,
    trigger_seconds=1.0,
)
