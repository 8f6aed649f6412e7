"""The pure parts of ``relay bench``'s pipeline section: the backlog, the baseline's rows, the patch."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from relay.errors import OperationError
from relay_dev.bench.options import SECTIONS, BenchOptions
from relay_dev.bench.pipeline import (
    EXAMPLE,
    TABLE,
    TOPIC,
    growth_pct,
    id_count,
    json_record,
    newest_name_sql,
    newest_rows,
    patch_pipeline,
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
