"""The chaos run's workloads (issue #29: chaos on the sinks users run): the records each one sends and
what the examples' transforms keep of them, so the outside count expects exactly the right output."""

from __future__ import annotations

import json
from pathlib import Path

from relay.pipeline import load_package
from relay.pipeline.sink_declares import sink_declares
from relay_dev.chaos.workloads import EXAMPLES, USERS, kept_event, record, workload_of


def test_each_example_is_the_workload_its_sink_takes() -> None:
    for workload, folder in EXAMPLES.items():
        _, pipeline = load_package(Path(folder))
        assert workload_of(sink_declares(pipeline).get("type")) == workload, folder


def test_kafka_events_keep_purchases_with_a_positive_amount_and_drop_the_poison() -> None:
    kept = [n for n in range(70) if kept_event(record("kafka", n, False)[1]) == n]
    assert kept == [n for n in range(70) if n % 5 in (0, 2, 4) and n % 7 != 0]
    key, value = record("kafka", 5, True)
    assert key == b"u5" and kept_event(value) is None
    assert json.loads(record("kafka", 12, False)[1])["user"] == record("kafka", 12, False)[0].decode()


def test_upsert_users_cycle_through_their_ids_keyed_by_id_and_the_poison_has_no_id() -> None:
    key, value = record("upsert", USERS + 7, False)
    assert key == b"7" and json.loads(value) == {"id": 7, "name": f"n{USERS + 7}", "score": float(USERS + 7)}
    assert "id" not in json.loads(record("upsert", 3, True)[1])


def test_the_counter_workload_is_the_seeds_counter() -> None:
    assert record("counter", 42, False) == (b"42", b"42")
    assert record("counter", 42, True) == (b"-1", b"poison-42")
