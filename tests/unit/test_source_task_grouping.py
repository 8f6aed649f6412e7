"""Issue #11: a batch's Kafka partitions share tasks when the session has fewer task slots.

Every Spark task pays a fixed cost (launch, two Python workers' hand-offs, one sink transaction);
with one executor core the three tasks of a 3-partition batch ran one after another for no
parallelism. The source now plans at most ``relay.maxTasksPerBatch`` tasks (default: the session's
task slots), each reading its ranges one after another.
"""

from __future__ import annotations

from typing import Any

import kafka_source
import pytest
from kafka_offsets_plan import group_ranges
from kafka_source_options import SourceSettings, session_task_slots
from relay.errors import ConfigError

R = [("t", 0, 0, 100), ("t", 1, 10, 40), ("t", 2, 0, 90), ("u", 0, 5, 6)]


def test_no_bound_or_enough_slots_is_one_task_per_range() -> None:
    assert group_ranges(R, None) == [(r,) for r in R]
    assert group_ranges(R, 4) == [(r,) for r in R]
    assert group_ranges([], 1) == []


def test_one_slot_is_one_task_with_every_range_in_partition_order() -> None:
    assert group_ranges(R, 1) == [tuple(sorted(R))]


def test_groups_are_balanced_by_records_and_deterministic() -> None:
    groups = group_ranges(R, 2)
    assert sorted(r for g in groups for r in g) == sorted(R), "every range read exactly once"
    sizes = sorted(sum(r[3] - r[2] for r in g) for g in groups)
    assert sizes == [101, 120], "largest first into the lightest task"
    assert group_ranges(list(reversed(R)), 2) == groups


def test_session_task_slots() -> None:
    assert session_task_slots({}, "local[3]") == 3
    assert session_task_slots({}, "local") == 1
    assert session_task_slots({"spark.task.cpus": "2"}, "local[4]") == 2
    assert session_task_slots({}, "local[*]") is not None
    assert session_task_slots({"spark.cores.max": "1"}, "spark://127.0.0.1:7077") == 1
    assert session_task_slots({}, "spark://127.0.0.1:7077") is None, "standalone takes every core"
    dyn = {"spark.cores.max": "4", "spark.dynamicAllocation.enabled": "true"}
    assert session_task_slots(dyn, "spark://h:7077") is None


def test_option_overrides_the_session_default() -> None:
    base = {"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:1"}
    assert SourceSettings.from_options(base).max_tasks is None
    assert SourceSettings.from_options(base, 1).max_tasks == 1
    assert SourceSettings.from_options({**base, "relay.maxtasksperbatch": "8"}, 1).max_tasks == 8
    with pytest.raises(ConfigError, match="maxTasksPerBatch"):
        SourceSettings.from_options({**base, "relay.maxtasksperbatch": "0"})


def test_partitions_and_read_of_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = SourceSettings(bootstrap_servers="127.0.0.1:1", topics=("t",), max_tasks=1)
    reader = kafka_source.KafkaStreamReader(settings)
    parts = reader.partitions({"t": {"0": 0, "1": 5, "2": 9}}, {"t": {"0": 10, "1": 5, "2": 20}})
    assert len(parts) == 1 and isinstance(parts[0], kafka_source.KafkaInputGroup)
    assert parts[0].ranges == (("t", 0, 0, 10), ("t", 2, 9, 20)), "an empty range is no read"
    calls: list[tuple[Any, ...]] = []

    def fake_read(s: SourceSettings, schema: Any, topic: str, number: int, begin: int, end: int) -> Any:
        calls.append((topic, number, begin, end))
        yield (topic, number)

    monkeypatch.setattr(kafka_source, "read_partition", fake_read)
    assert list(reader.read(parts[0])) == [("t", 0), ("t", 2)]
    assert calls == [("t", 0, 0, 10), ("t", 2, 9, 20)]
    single = kafka_source.KafkaStreamReader(SourceSettings(bootstrap_servers="x:1", topics=("t",)))
    one = single.partitions({"t": {"0": 0}}, {"t": {"0": 3}})
    assert [type(p) for p in one] == [kafka_source.KafkaInputPartition]
    calls.clear()
    assert list(single.read(one[0])) == [("t", 0)] and calls == [("t", 0, 0, 3)]
