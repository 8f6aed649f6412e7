"""Issue #31: a trigger that finds nothing new in Kafka makes no ledger transaction (a short trigger
polls often: 113 row-lock transactions a second idle at ProcessingTime(0) before), and a new record
is planned under the ledger's guard as always."""

from __future__ import annotations

from typing import Any

import kafka_source
import pytest
from kafka_source_options import SourceSettings
from pyspark.sql.streaming.datasource import ReadAllAvailable

START = {"t": {"0": 5, "1": 7}}


class Reader(kafka_source.KafkaStreamReader):
    def __init__(self, latest: dict[tuple[str, int], int]) -> None:
        super().__init__(SourceSettings.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t"}))
        self.latest, self.plans = latest, 0

    def _topic_partitions(self) -> list[Any]:
        return []

    def _offsets(self, tps: list[Any]) -> tuple[dict, dict]:
        return {("t", 0): 0, ("t", 1): 0}, dict(self.latest)

    def _plan(self, plan: Any) -> Any:
        self.plans += 1
        return plan(None)


def test_nothing_new_returns_the_start_without_a_plan() -> None:
    reader = Reader({("t", 0): 5, ("t", 1): 7})
    reader._outage.since = 1.0  # a Kafka blip earlier: Kafka answering ends it
    assert reader.latestOffset(START, ReadAllAvailable()) == START
    assert reader.plans == 0 and reader._outage.since is None


@pytest.mark.parametrize("latest", [{("t", 0): 6, ("t", 1): 7}, {("t", 0): 5, ("t", 1): 7, ("t", 2): 0}])
def test_a_new_record_or_partition_is_planned(latest: dict[tuple[str, int], int]) -> None:
    reader = Reader(latest)
    reader.latestOffset(START, ReadAllAvailable())
    assert reader.plans == 1
