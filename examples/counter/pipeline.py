"""The seeds' counter: every record ``key = value = counter`` becomes one row of the ledger's
``messages`` table, written by the executors; poison keys become dead letters.

Written only against Relay's public contract (``relay.pipeline``) and one of its sinks. It is what
Relay runs for a pipeline declared without ``pipeline_code`` (under that pipeline's name and topic):
the sink creates its tables (``messages``, ``message_ranges``, ``counter_totals``) in the ledger's
database, where ``relay audit --deep`` and the seeds' count check read them.
"""

from __future__ import annotations

from relay.pipeline import Pipeline
from relay.sinks.ledger_messages import LedgerMessagesSink

NAME = "experience"
TOPIC = "experience"  # Relay's default topic (RelayConfig.topic)


def transform(df):  # noqa: ANN001, ANN201 - pyspark DataFrames (imported on the executors, not here)
    """The record as it came: its source position (the contract) plus the key and value the sink
    stores; nothing is parsed here, so a poison key reaches the sink and becomes a dead letter."""
    return df.select("topic", "partition", "offset", "key", "value")


def sink() -> LedgerMessagesSink:
    """Built on the driver at start: the ledger's URL is in every driver's environment (Relay puts
    it there as RELAY_LEDGER_URL), so it needs no ``secret_env`` of its own."""
    return LedgerMessagesSink()


# No batch limits of its own: as Relay's default pipeline it runs with the configured ones
# (RELAY_MAX_OFFSETS_PER_TRIGGER, RELAY_TRIGGER_SECONDS, a pipelines file; else 20000 and 1 s).
PIPELINE = Pipeline(name=NAME, topics=(TOPIC,), transform=transform, sink=sink)
