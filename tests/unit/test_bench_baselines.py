"""The pure parts of the pipeline and latency sections' baselines and latency figures."""

from __future__ import annotations

import pytest
from relay_dev.bench.baselines import COLUMNS, MERGE, STAGE, copy_text, split_partitions
from relay_dev.bench.latency import due_at, latency_figures, latency_stats


def test_partitions_are_split_round_robin_and_none_is_left_out() -> None:
    assert split_partitions([2, 0, 1], 2) == [[0, 2], [1]]
    assert split_partitions(range(6), 2) == [[0, 2, 4], [1, 3, 5]]
    assert split_partitions([0], 2) == [[0]]  # one partition: one process, not an idle one
    assert split_partitions([0, 1, 2], 1) == [[0, 1, 2]]
    shares = split_partitions(range(7), 3)
    assert sorted(p for s in shares for p in s) == list(range(7)) and len(shares) == 3
    with pytest.raises(ValueError):
        split_partitions([0], 0)


def test_copy_text_escapes_like_postgres_text_format() -> None:
    rows = [(1, "a\tb\\c\nd", 1.5, "json_upsert", 0, 7), (2, None, None, "json_upsert", 1, 8)]
    assert copy_text(rows) == "1\ta\\tb\\\\c\\nd\t1.5\tjson_upsert\t0\t7\n2\t\\N\t\\N\tjson_upsert\t1\t8\n"
    assert copy_text([(3, "x", 0.1 + 0.2, "t", 0, 1)]).split("\t")[2] == repr(0.1 + 0.2)  # no precision lost
    assert copy_text([]) == ""


def test_merge_keeps_b1s_newest_wins_by_offset() -> None:
    assert MERGE.startswith(f"INSERT INTO json_upsert_users AS t ({', '.join(COLUMNS)}) SELECT")
    assert f"FROM {STAGE} ON CONFLICT (id) DO UPDATE" in MERGE
    assert MERGE.endswith("WHERE t._relay_offset < EXCLUDED._relay_offset")


def test_the_schedule_does_not_drift() -> None:
    assert due_at(100.0, 0, 1000.0) == 100.0
    assert due_at(100.0, 60_000, 1000.0) == pytest.approx(160.0)
    assert due_at(100.0, 3, 50.0) == pytest.approx(100.06)


def test_latency_stats_percentiles_in_ms_and_counts() -> None:
    seen = [(10.0, 10.0 + ms / 1000) for ms in range(1, 101)]  # 1..100 ms
    s = latency_stats(100, seen)
    assert s["seen"] == 100 and s["missing"] == 0 and s["produced"] == 100
    assert s["p50_ms"] == pytest.approx(50.5) and s["p95_ms"] == pytest.approx(95.05)
    assert s["p99_ms"] == pytest.approx(99.01) and s["max_ms"] == pytest.approx(100.0)
    assert s["min_ms"] == pytest.approx(1.0)
    partial = latency_stats(5, [(0.0, 0.25)])
    assert partial["missing"] == 4 and partial["p50_ms"] == 250.0
    assert latency_stats(3, [])["p99_ms"] is None


def test_latency_figures_set_each_half_beside_its_baseline() -> None:
    relay = latency_stats(2, [(0.0, 1.0), (0.0, 3.0)])
    b2 = latency_stats(2, [(0.0, 0.5), (0.0, 0.5)])
    k2k = latency_stats(3, [(0.0, 0.3), (0.0, 0.3)])
    loop = latency_stats(3, [(0.0, 0.1), (0.0, 0.1), (0.0, 0.1)])
    by = {f["name"]: f for f in latency_figures(relay, b2, k2k, loop)}
    p50 = by["json_upsert, default limit: produce -> row visible, p50"]
    assert p50["value"] == 2000.0 and p50["baseline_name"] == "b2 continuous" and p50["ratio"] == 4.0
    assert p50["better"] == "lower"
    k50 = by["kafka_to_kafka, default limit: produce -> read_committed sees it, p50"]
    assert k50["value"] == 300.0 and k50["baseline_name"] == "confluent-kafka txn loop"
    assert k50["ratio"] == pytest.approx(3.0)
    seen = by["json_upsert: new records seen"]
    assert seen["value"] == 2 and seen["baseline"] == 2 and seen["ratio"] == 1.0
    short = by["kafka_to_kafka: new records seen"]  # one of three never seen: the ratio shows it
    assert short["value"] == 2 and short["baseline"] == 3 and short["better"] == "higher"
