"""The pure parts of ``relay bench``'s pipeline section: the backlog, the baseline's rows, the patch."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from relay.errors import OperationError
from relay_dev.bench.options import SECTIONS, BenchOptions
from relay_dev.bench.pipeline import growth_pct, patch_pipeline
from relay_dev.bench.pipeline_backlog import (
    EXAMPLE,
    TABLE,
    TOPIC,
    id_count,
    json_record,
    newest_name_sql,
    newest_rows,
)
from relay_dev.bench.runner import NEEDS_STACK, SECTION_FUNCS, results_copy_path


def test_sections_are_registered() -> None:
    for name in ("pipeline", "latency"):
        assert name in SECTIONS and name in SECTION_FUNCS and name in NEEDS_STACK
        assert BenchOptions.build(only=name).only == (name,)
    assert SECTIONS.index("latency") == SECTIONS.index("pipeline") + 1


def test_backlog_keys_by_id_and_updates_each_id_in_rounds() -> None:
    ids = id_count(23)
    assert ids == 4
    key, value = json_record(9, ids)
    assert key == b"1" and json.loads(value) == {"id": 1, "name": "user1-r2", "score": 2.000001}


def test_newest_rows_keeps_each_ids_highest_offset_in_id_order_and_drops_junk() -> None:
    def rec(offset: int, ident: int | None, name: str) -> tuple[int, int, bytes]:
        return 0, offset, json.dumps({"id": ident, "name": name, "score": 1.0}).encode()

    records = [
        rec(5, 2, "b-old"),
        rec(3, 1, "a"),
        rec(9, 2, "b-new"),
        (0, 10, b"not json"),
        rec(11, None, "x"),
    ]
    records.append((1, 12, None))
    assert newest_rows(records) == [(1, "a", 1.0, TOPIC, 0, 3), (2, "b-new", 1.0, TOPIC, 0, 9)]


@pytest.mark.parametrize("messages", [1, 20, 23, 24])
def test_newest_name_sql_counts_exactly_the_last_round_of_every_id(messages: int) -> None:
    ids = id_count(messages)
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE {TABLE} (id integer primary key, name text)")
    for i in range(messages):  # newest wins: the last record of an id stays
        doc = json.loads(json_record(i, ids)[1])
        db.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?)", (doc["id"], doc["name"]))
    assert db.execute(newest_name_sql(messages, ids)).fetchone()[0] == ids
    db.execute(f"UPDATE {TABLE} SET name = 'user0-r0-stale' WHERE id = 0")
    assert db.execute(newest_name_sql(messages, ids)).fetchone()[0] == ids - 1


def test_patch_changes_only_the_name_and_the_read_limit_of_the_example() -> None:
    source = (EXAMPLE / "pipeline.py").read_text()
    patched = patch_pipeline(source, "ju_m200000", 200_000)
    assert 'name="ju_m200000",' in patched and patched.count("max_offsets_per_trigger=") == 1
    assert "max_offsets_per_trigger=200000," in patched
    compile(patched, "pipeline.py", "exec")
    # nothing else: take the two patched lines away and the rest is the example without its limit
    rest = [line for line in patched.splitlines() if "ju_m200000" not in line and "=200000" not in line]
    assert rest == [
        line
        for line in source.splitlines()
        if 'name="json_upsert"' not in line and "max_offsets_per" not in line
    ]
    with pytest.raises(OperationError, match="changed"):
        patch_pipeline(source.replace('name="json_upsert"', 'name="other"'), "x", 1)
    with pytest.raises(OperationError, match="of digits"):
        bad = source.replace('name="json_upsert",', 'name="json_upsert",\n    max_offsets_per_trigger=LIMIT,')
        assert bad != source
        patch_pipeline(bad, "x", 1)


WITH_LIMIT = """TOPIC = "json_upsert"

PIPELINE = Pipeline(
    name="json_upsert",
    topics=(TOPIC,),
    max_offsets_per_trigger=5_000,
    secret_env=(SINK_URL_ENV,),
)
"""
WITHOUT_LIMIT = WITH_LIMIT.replace("    max_offsets_per_trigger=5_000,\n", "")


def test_patch_default_leaves_the_limit_as_declared_present_or_absent() -> None:
    for source in (WITH_LIMIT, WITHOUT_LIMIT):
        patched = patch_pipeline(source, "ju_warm_default", None, "json_upsert_warm_default")
        assert patched == source.replace('name="json_upsert"', 'name="ju_warm_default"').replace(
            'TOPIC = "json_upsert"', 'TOPIC = "json_upsert_warm_default"'
        )
    assert "max_offsets_per_trigger" not in patch_pipeline(WITHOUT_LIMIT, "x", None)


@pytest.mark.parametrize("source", [WITH_LIMIT, WITHOUT_LIMIT])
def test_patch_best_limit_sets_one_limit_line_whether_or_not_the_example_has_one(source: str) -> None:
    patched = patch_pipeline(source, "ju_cold_200000", 200_000)
    assert patched.count("max_offsets_per_trigger=") == 1
    assert '    name="ju_cold_200000",\n    max_offsets_per_trigger=200000,\n' in patched
    assert 'TOPIC = "json_upsert"' in patched  # the topic stays unless asked


def test_variant_config_forces_no_limit_by_default_and_the_operators_at_best() -> None:
    from relay.config import RelayConfig, load_config
    from relay.spark.launcher import operator_limits
    from relay_dev.bench.pipeline import variant_config

    base = load_config({"RELAY_MAX_OFFSETS_PER_TRIGGER": "10000", "RELAY_TRIGGER_SECONDS": "1"})
    assert operator_limits(base) == ("max_offsets_per_trigger", "trigger_seconds")
    default = variant_config(base, "ju_cold_default", "json_upsert", "sqlite:///x.db", None)
    assert operator_limits(default) == ()  # the package's value (or Relay's) applies
    assert default.max_offsets_per_trigger == RelayConfig().max_offsets_per_trigger
    assert default.trigger_seconds == RelayConfig().trigger_seconds
    # relay bench --trigger-seconds 0.25: that trigger stays the operator's, the size Relay's
    fast = load_config({"RELAY_MAX_OFFSETS_PER_TRIGGER": "10000", "RELAY_TRIGGER_SECONDS": "0.25"})
    latency_mode = variant_config(
        fast, "ju_latency", "json_upsert", "sqlite:///x.db", None, keep_trigger=True
    )
    assert operator_limits(latency_mode) == ("trigger_seconds",) and latency_mode.trigger_seconds == 0.25
    assert latency_mode.max_offsets_per_trigger == RelayConfig().max_offsets_per_trigger
    best = variant_config(base, "ju_cold_200000", "json_upsert", "sqlite:///x.db", 200_000)
    assert best.max_offsets_per_trigger == 200_000 and "max_offsets_per_trigger" in operator_limits(best)
    assert (best.pipeline, best.topic, best.ledger_url) == ("ju_cold_200000", "json_upsert", "sqlite:///x.db")
    unset = variant_config(load_config({}), "ju_cold_200000", "json_upsert", "sqlite:///x.db", 200_000)
    assert operator_limits(unset) == ("max_offsets_per_trigger",) and unset.max_offsets_per_trigger == 200_000


def _batch(batch_id: int, start: float, end: float, rows: int, to: dict[int, int]) -> dict:
    return {
        "batch_id": batch_id,
        "started_at": start,
        "committed_at": end,
        "rows_read": rows,
        "ranges": [{"topic": "t", "partition": p, "from": 0, "to": o} for p, o in to.items()],
    }


def test_burst_runs_from_its_start_to_the_commit_reaching_its_end() -> None:
    from relay_dev.bench.pipeline import burst_from_batches

    end = {0: 1100, 1: 1100}
    batches = [
        _batch(0, 1.0, 3.0, 100, {0: 50, 1: 50}),  # the warm-up: before the burst
        _batch(1, 9.0, 9.2, 0, {}),  # idle
        _batch(2, 10.5, 12.0, 800, {0: 450, 1: 450}),
        _batch(4, 14.5, 15.0, 5, {0: 1103}),  # a later trickle: not the burst's
        _batch(3, 12.5, 14.0, 1300, {0: 1100, 1: 1100}),
    ]
    r = burst_from_batches(batches, 10.0, end, 2000)
    assert r["reached"] and r["seconds"] == pytest.approx(4.0) and r["msg_s"] == pytest.approx(500.0)
    assert r["batches"] == 2 and r["rows_read"] == 2100 and r["max_batch_rows"] == 1300
    assert r["first_batch_start_s"] == pytest.approx(0.5)
    short = burst_from_batches(batches[:3], 10.0, end, 2000)
    assert not short["reached"] and short["msg_s"] is None


def test_burst_counts_every_partition_once_each_has_reached_its_end() -> None:
    """Partitions reach their ends in different batches; the last one decides."""
    from relay_dev.bench.pipeline import burst_from_batches

    batches = [_batch(0, 0.0, 2.0, 10, {0: 10}), _batch(1, 2.0, 5.0, 10, {1: 10})]
    assert burst_from_batches(batches, 0.5, {0: 10, 1: 10}, 20)["seconds"] == pytest.approx(4.5)


def test_growth_and_the_results_copy_name() -> None:
    assert growth_pct(200.0, 230.0) == pytest.approx(15.0)
    assert growth_pct(None, 1.0) is None and growth_pct(1.0, None) is None
    only = BenchOptions.build(only="pipeline")
    assert (
        results_copy_path(Path("bench/results"), only, "20250101-000000").name
        == "pipeline-20250101-000000.json"
    )
    assert results_copy_path(Path("r"), BenchOptions.build(), "s").name == "all-s.json"


def test_figures_name_their_baseline_and_compare_relay_with_b1_b3_b4() -> None:
    from relay_dev.bench.pipeline import pipeline_figures

    def run(limit: int | None, warm: float, cold_s: float, jvm_mb: float) -> dict:
        return {
            "limit": limit,
            "warm": {
                "burst": {"msg_s": warm, "seconds": 1000 / warm},
                "memory": {"jvm_vmhwm_mb": jvm_mb, "python_vmhwm_mb": 50.0},
            },
            "cold": {"msg_s": 1000 / cold_s, "deploy_to_caught_up_s": cold_s},
        }

    base = {"b1": 1000.0, "b2": 1500.0, "b3": 2500.0, "b4": 4000.0}
    figures = pipeline_figures(base, [run(None, 800.0, 4.0, 400.0), run(200_000, 3000.0, 2.0, 440.0)], 1000)
    by = {(f["name"], f["baseline_name"]): f for f in figures}
    assert by[("b3: b2 in 2 processes", "b1")]["ratio"] == 2.5
    warm = by[("warm: 1,000 burst applied, limit 200,000", "b3")]
    assert warm["ratio"] == pytest.approx(1.2) and warm["better"] == "higher"
    assert by[("warm: 1,000 burst applied, default limit", "b4")]["ratio"] == pytest.approx(0.2)
    cold = by[("cold: deploy -> every id newest, default limit", "b1")]
    assert cold["value"] == 250.0 and cold["ratio"] == 0.25
    assert {k for n, k in by if n.startswith(("warm: 1,000", "cold: deploy ->"))} == {"b1", "b3", "b4"}
    growth = by[("warm driver JVM peak RSS growth, default limit -> limit 200,000", "goal (at most)")]
    assert growth["value"] == pytest.approx(10.0)
