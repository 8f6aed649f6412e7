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


def test_section_is_registered() -> None:
    assert "pipeline" in SECTIONS and "pipeline" in SECTION_FUNCS and "pipeline" in NEEDS_STACK
    assert BenchOptions.build(only="pipeline").only == ("pipeline",)


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
    assert 'name="ju_m200000"' in patched and "max_offsets_per_trigger=200000" in patched
    changed = [(a, b) for a, b in zip(source.splitlines(), patched.splitlines()) if a != b]
    assert len(changed) == 2 and len(source.splitlines()) == len(patched.splitlines())
    with pytest.raises(OperationError, match="changed"):
        patch_pipeline(source.replace("max_offsets_per_trigger=", "limit="), "x", 1)


def test_growth_and_the_results_copy_name() -> None:
    assert growth_pct(200.0, 230.0) == pytest.approx(15.0)
    assert growth_pct(None, 1.0) is None and growth_pct(1.0, None) is None
    only = BenchOptions.build(only="pipeline")
    assert (
        results_copy_path(Path("bench/results"), only, "20250101-000000").name
        == "pipeline-20250101-000000.json"
    )
    assert results_copy_path(Path("r"), BenchOptions.build(), "s").name == "all-s.json"


def test_figures_name_the_two_core_run_and_compare_memory_on_one_core() -> None:
    """The third deploy (two executor cores) is labelled as such; the driver's memory growth
    compares the two one-core deploys (the read limits), not the two-core one."""
    from relay_dev.bench.pipeline import pipeline_figures

    def run(limit: int, cores: int, msg_s: float, jvm_mb: float) -> dict:
        relay = {
            "msg_s": msg_s,
            "warm_msg_s": msg_s,
            "first_batch_s": 1.0,
            "max_batch_rows": limit,
            "batches": 3,
        }
        memory = {"jvm_vmhwm_mb": jvm_mb, "python_vmhwm_mb": 50.0}
        return {
            "limit": limit,
            "executor_cores": cores,
            "relay": relay,
            "memory": memory,
            "deploy_to_caught_up_s": 9,
        }

    runs = [run(10_000, 1, 1000.0, 400.0), run(200_000, 1, 1500.0, 440.0), run(200_000, 2, 2400.0, 900.0)]
    figures = {(f["name"], f["baseline_name"]): f for f in pipeline_figures(5000.0, 2000.0, runs)}
    two = figures[("json_upsert applied e2e, limit 200,000, 2 cores", "kafka-python json.loads + upsert")]
    assert two["value"] == 2400.0 and two["ratio"] == 1.2
    growth = figures[("driver JVM peak RSS growth", "goal (at most)")]
    assert growth["value"] == 10.0  # 400 -> 440 MiB, the two-core run's 900 left out
