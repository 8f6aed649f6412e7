"""Issue #11: PostgresUpsertSink takes a task's Arrow batches as they are (``write_arrow``).

The row path built a dict per row and adapted and rendered every value in Python; the Arrow path
filters the ranges with vectorised kernels and stages CSV written by pyarrow. What it can't carry
with the row path's meaning goes to ``write_task`` with the same rows. No database here: the
decisions before the transaction, the helpers, and ``partition_writer`` choosing the path (the
writes themselves: tests/integration/test_pg_upsert_sink.py and the pipeline tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pytest
from relay.pipeline.tasks import partition_writer
from relay.sinks import pg_values as pv
from relay.sinks.base import TaskContext, TaskResult
from relay.sinks.postgres_upsert import PostgresUpsertSink

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("id", pa.int64()),
        ("name", pa.string()),
    ]
)


def batch(rows: list[dict[str, Any]], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def row(offset: int, ident: int | None, partition: int = 0, name: str | None = "n") -> dict[str, Any]:
    return {"topic": "t", "partition": partition, "offset": offset, "id": ident, "name": name}


class RowPathSpy(PostgresUpsertSink):
    """Records what reaches the row path instead of writing it."""

    def write_task(self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]]) -> TaskResult:
        self.rows = list(rows)
        return TaskResult(rows_in=len(self.rows))


def sink() -> RowPathSpy:
    return RowPathSpy("postgresql://u:p@127.0.0.1:1/db", table="t", key=["id"], columns=["id", "name"])


CTX = TaskContext("p", 1, 1, 0, {("t", 0): (10, 20)})


def test_in_ranges_keeps_exactly_the_rows_the_row_path_keeps() -> None:
    rows = [row(o, o, p) for p in (0, 1) for o in (9, 10, 19, 20)]
    kept = pv.in_ranges(batch(rows), CTX.ranges)
    assert kept.column("offset").to_pylist() == [10, 19]
    assert [r["offset"] for r in rows if CTX.allows(r["topic"], r["partition"], r["offset"])] == [10, 19]
    assert pv.in_ranges(batch(rows), {}).num_rows == 0
    assert pv.in_ranges(batch([{**row(10, 1), "offset": None}]), CTX.ranges) is None


def test_csv_keeps_empty_strings_nulls_and_quotes() -> None:
    b = batch([row(10, 1, name=""), row(11, 2, name=None), row(12, 3, name='a"b,\nc')])
    assert pv.csv_of(b, ["id", "name"]).to_pybytes() == b'1,""\n2,\n3,"a""b,\nc"\n'
    reader = pv.CopyReader(pv.csv_of(b, ["id"]))
    assert reader.read(3) + reader.read() == b"1\n2\n3\n" and reader.read() == b""


def test_kinds_and_target_types() -> None:
    kinds = [
        pv.arrow_kind(t) for t in (pa.int64(), pa.string(), pa.float64(), pa.timestamp("us"), pa.uint64())
    ]
    assert kinds == ["int", "str", "float", None, None]
    names, key = ["id", "name", "score"], ["id"]
    assert pv.staged_text_keys(["int", "str", "float"], [20, 25, 701], names, key) == frozenset()
    assert pv.staged_text_keys(["str", "str", "float"], [25, 25, 701], names, ["id"]) == {"id"}
    assert pv.staged_text_keys(["int", "str", "float"], [20, 25, 1700], names, key) is None, (
        "float -> numeric"
    )
    assert pv.staged_text_keys(["str", "str", "float"], [1042, 25, 701], names, key) is None, "char(n) key"


def test_nothing_inside_the_ranges_writes_nothing_and_opens_no_connection() -> None:
    s = sink()
    result = s.write_arrow(CTX, iter([batch([row(1, 1), row(2, 2)]), batch([row(30, 3, partition=1)])]))
    assert (result.rows_in, result.rows_skipped, result.rows_written) == (3, 3, 0)
    assert not hasattr(s, "rows"), "the row path was not used"
    assert s.write_arrow(CTX, iter([])).rows_in == 0


@pytest.mark.parametrize(
    "batches",
    [
        [batch([row(10, 1)]), batch([row(11, None)])],  # a NULL key: the row path names it
        [batch([row(10, 1, name=None)], pa.schema([*SCHEMA][:4] + [pa.field("name", pa.timestamp("us"))]))],
        [batch([{k: v for k, v in row(10, 1).items() if k != "name"}], pa.schema([*SCHEMA][:4]))],
    ],
    ids=["null-key", "timestamp-column", "missing-column"],
)
def test_what_the_staged_path_cant_carry_goes_to_the_row_path_whole(batches: list[pa.RecordBatch]) -> None:
    s = sink()
    s.write_arrow(CTX, iter(batches))
    assert s.rows == [r for b in batches for r in b.to_pylist()]


def test_partition_writer_prefers_the_arrow_path() -> None:
    class ArrowSink:
        def write_arrow(self, ctx: TaskContext, batches: Iterable[Any]) -> TaskResult:
            return TaskResult(rows_in=sum(b.num_rows for b in batches), rows_written=1)

        def write_task(self, ctx: TaskContext, rows: Iterable[Mapping[str, Any]]) -> TaskResult:
            raise AssertionError("row path used")

    out = list(partition_writer(ArrowSink(), CTX)(iter([batch([]), batch([row(10, 1), row(11, 2)])])))  # type: ignore[arg-type]
    assert out[0].to_pylist()[0]["rows_in"] == 2
