"""The sink audit's judgement on small fixtures (no broker, no database, no Spark): the ledger's
applied runs, a Kafka output grouped by source offset, upsert rows and stateful groups."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from relay.audit.applied import Applied, clip, merge, union
from relay.audit.report import AuditReport, PartitionAudit, render
from relay.audit.sink_kafka import (
    SOURCE_HEADER,
    WRITER_HEADER,
    Expected,
    OutputIndex,
    OutputRecord,
    compare,
    parse_source,
)
from relay.audit.sink_report import SinkAudit
from relay.audit.sink_tables import NewestRows, compare_groups, compare_upsert, norm, position
from relay.ledger.store import Ledger

from tests.ledger_builder import LedgerBuilder

P, T = "shop", "events"


@pytest.fixture()
def applied(ledger: Ledger) -> Applied:
    """v1 (instance 1) applied events[0] [0, 14) and events[1] [0, 4); v2 (instance 2) events[0]
    [14, 18), its cursor; an older lease of v1 closed at 14."""
    b = LedgerBuilder(ledger, P, T)
    one, two = b.instance("v1"), b.instance("v2")
    b.lease(one, 0, 0, 14, end=14)
    b.lease(one, 1, 0, 4)
    b.lease(two, 0, 14, 18)
    return Applied.from_ledger(ledger, P, T)


def test_applied_runs_say_which_version_applied_each_offset(applied: Applied) -> None:
    assert applied.newest_version == "v2" and applied.applied_versions() == ["v1", "v2"]
    assert applied.run_at(0, 13).version == "v1" and applied.run_at(0, 14).version == "v2"
    assert applied.run_at(0, 18) is None and applied.run_at(2, 0) is None
    assert applied.ranges("v2") == {0: [(14, 18)]} and applied.ranges() == {0: [(0, 18)], 1: [(0, 4)]}
    assert applied.generation_version(applied.run_at(0, 15).lease_id) == "v2"
    assert applied.size() == 22
    assert clip({0: [(0, 18)], 1: [(0, 4)]}, {0: 3}, {1: 2}) == {0: [(3, 18)], 1: [(0, 2)]}
    assert merge([(5, 6), (0, 2), (2, 3), (4, 5)]) == [(0, 3), (4, 6)]
    assert union({0: [(0, 2)]}, {0: [(2, 4)], 1: [(7, 8)]}) == {0: [(0, 4)], 1: [(7, 8)]}


def rec(partition: int, offset: int, source: str | None, writer: str | None, key: bytes, value: bytes):
    headers = [(SOURCE_HEADER, source.encode())] if source else []
    headers += [(WRITER_HEADER, writer.encode())] if writer else []
    return OutputRecord(partition, offset, key, value, headers)


def test_kafka_output_is_judged_per_input_offset_missing_duplicated_wrong_and_apart(applied: Applied) -> None:
    expected = Expected()
    for o in [*range(1, 5), *range(6, 14)]:  # 0 deleted by retention, 5 is a transaction marker
        expected.add_input("v1", 0, o)
        if o != 8:  # the transform filters record 8 out
            expected.add_output("v1", 0, o, f"k{o}", f"v{o}")
    expected.add_output("v1", 0, 7, "k7", "second")  # record 7 makes two output records
    for o in range(4):
        expected.add_input("v1", 1, o)
        expected.add_output("v1", 1, o, b"p1", f"{o}".encode())
    for o in range(14, 18):
        expected.add_input("v2", 0, o)
        expected.add_output("v2", 0, o, f"k{o}", f"new{o}")
    expected.add_input("v1", 0, 15)  # written by v1's instance (an aborted green's kind of write)
    expected.add_output("v1", 0, 15, "k15", "old15")

    out, audit, n = OutputIndex(T), SinkAudit("kafka", "topic out"), iter(range(1000))

    def put(o: int, writer: str, key: str, value: str, partition: int = 0) -> None:
        record = rec(partition, next(n), f"{T}:{partition}:{o}", writer, key.encode(), value.encode())
        out.add(record, audit, "out")

    for o in (0, 1, 3, 4, 5, 6, 9, 9, 10, 11, 12):
        put(o, "1:1:0", f"k{o}", "WRONG" if o == 4 else f"v{o}")
    put(3, "99:1:0", "k3", "v3")  # another producer copied record 3's source header: a duplicate
    put(7, "1:1:0", "k7", "v7")
    put(7, "1:1:0", "k7", "second")
    put(14, "2:1:5", "k14", "new14")
    put(16, "2:1:6", "k16", "new16")
    put(15, "1:2:6", "k15", "old15")  # judged by its writer's version's output
    put(40, "2:1:9", "k40", "new40")  # the ledger has not committed offset 40: ahead
    for o in range(4):
        put(o, "1:1:0", "p1", str(o), partition=1)
    out.add(rec(0, 999, None, None, b"x", b"y"), audit, "out")  # no header: written outside Relay
    out.add(rec(0, 998, "other:0:1", "1:1:0", b"x", b"y"), audit, "out")  # another topic's record

    compare(applied, expected, out, {0: 1, 1: 0}, audit)

    assert dict(audit.counts) == {
        "ok": 14,  # 0:{1, 6, 7, 8, 10, 11, 12, 14, 15, 16} and 1:{0..3}
        "missing": 3,  # 0:{2, 13, 17}
        "duplicated": 1,  # 0:3
        "wrong": 3,  # 0:4 content, 0:9 two records for one, 0:5 output without an input record
        "unverified": 1,  # 0:0, deleted by retention
        "ahead": 1,  # 0:40, beyond every cursor
        "foreign": 2,
    }
    assert audit.examples["missing"] == [f"{T}:0:2", f"{T}:0:13", f"{T}:0:17"]
    (dup,) = audit.examples["duplicated"]
    assert dup["source"] == f"{T}:0:3" and dup["writers"] == ["1:1:0", "99:1:0"] and len(dup["output"]) == 2
    wrong = {w["source"]: w["why"] for w in audit.examples["wrong"]}
    assert wrong == {
        f"{T}:0:4": "content",
        f"{T}:0:9": "2 record(s), 1 expected",
        f"{T}:0:5": "no input record",
    }
    assert audit.examples["foreign"] == ["out[0]@999", "out[0]@998"] and not audit.ok


def test_kafka_output_of_a_clean_run_is_ok(applied: Applied) -> None:
    expected, out, audit = Expected(), OutputIndex(T), SinkAudit("kafka", "topic out")
    for o in range(14, 18):
        expected.add_input("v2", 0, o)
        expected.add_output("v2", 0, o, None, f"{o}")
        out.add(
            OutputRecord(
                0,
                o,
                None,
                f"{o}".encode(),
                [(SOURCE_HEADER, f"{T}:0:{o}".encode()), (WRITER_HEADER, b"2:1:3")],
            ),
            audit,
            "out",
        )
    compare(applied, expected, out, {}, audit)
    assert dict(audit.counts) == {"ok": 4} and audit.ok


def test_source_headers_name_the_input_topic_and_a_position_or_nothing() -> None:
    assert parse_source(b"my.topic-1:3:42", "my.topic-1") == (3, 42)
    for raw in (None, b"", b"other:3:42", b"my:3", b"my:x:1", b"my:-1:4", b"\xff"):
        assert parse_source(raw, "my") is None


def test_values_from_postgresql_and_spark_compare_equal() -> None:
    naive = dt.datetime(2026, 1, 2, 3, 4, 5)
    assert norm(memoryview(b"ab")) == b"ab" and norm(Decimal("3")) == 3 and norm(Decimal("1.5")) == 1.5
    assert norm(naive) == naive.replace(tzinfo=dt.UTC) and norm(0.1 + 0.2) == norm(0.3)
    assert norm({"b": [1, 2], "a": None}) == (("a", None), ("b", (1, 2)))


def test_upsert_rows_are_the_newest_per_key_in_the_sinks_order() -> None:
    newest = NewestRows()
    for key, pos, values in [
        ((1,), (T, 0, 5), ("a",)),
        ((1,), (T, 0, 3), ("older",)),
        ((2,), (T, 0, 6), ("b",)),
        ((3,), (T, 1, 2), ("c",)),
        ((4,), (T, 0, 7), ("d",)),
        ((5,), (T, 1, 3), ("e",)),
        ((9,), (T, 0, 2), ("i",)),
    ]:
        newest.add(key, position(*pos), values)
    assert newest.rows[(1,)] == (position(T, 0, 5), {("a",)})
    states = {(0, 99): "ahead", (0, 0): "unverified", (0, 3): "applied", (1, 9): "ahead"}
    stored = [
        ((1,), ("a",), position(T, 0, 5)),  # ok
        ((2,), ("b",), position(T, 0, 4)),  # stale: an older record's row
        ((3,), ("x",), position(T, 1, 2)),  # wrong values at the right position
        ((6,), ("f",), None),  # no position: written outside Relay
        ((7,), ("g",), position(T, 0, 99)),  # not applied yet: ahead
        ((8,), ("h",), position(T, 0, 0)),  # input deleted: unverified
        ((9,), ("z",), position(T, 0, 3)),  # an applied record whose output has no row of key 9
        ((5,), ("e2",), position(T, 1, 9)),  # newer than the expected row, not applied: ahead
    ]  # key 4 has no row: missing
    audit = SinkAudit("upsert", "table t")
    compare_upsert(T, newest, stored, lambda p, o: states[(p, o)], audit)
    assert dict(audit.counts) == {
        "ok": 1,
        "stale": 1,
        "wrong": 2,
        "foreign": 1,
        "ahead": 2,
        "unverified": 1,
        "missing": 1,
    }
    assert audit.examples["missing"] == [{"key": "4", "expected": f"{T}:0:7"}]
    assert audit.examples["stale"] == [{"key": "2", "stored": f"{T}:0:4", "expected": f"{T}:0:6"}]
    assert [w["key"] for w in audit.examples["wrong"]] == ["3", "9"] and not audit.ok


def test_positions_order_topics_bytewise_then_partition_then_offset() -> None:
    newest = NewestRows()
    newest.add((1,), position("a", 0, 1), ("lower-case topic",))
    newest.add((1,), position("B", 5, 99), ("upper-case topic",))  # b"B" < b"a": older
    assert newest.rows[(1,)][1] == {("lower-case topic",)}


def test_stateful_groups_are_judged_by_their_writers_version_and_open_windows_apart() -> None:
    expected = {
        "v2": {(10, "a"): (3,), (10, "b"): (2,), (20, "a"): (1,)},
        "v1": {(0, "a"): (5,)},
    }
    versions = {7: "v1", 9: "v2"}
    stored = [((0, "a"), (5,), 7), ((10, "a"), (3,), 9), ((10, "b"), (1,), 9), ((30, "z"), (1,), 9)]
    first = SinkAudit("stateful", "")
    differ = compare_groups(stored, expected, versions.get, "v2", first)
    assert sorted(differ) == [(10, "b"), (20, "a"), (30, "z")]
    assert dict(first.counts) == {"ok": 2, "wrong": 2, "missing": 1}

    audit = SinkAudit("stateful", "")
    compare_groups(
        stored,
        expected,
        versions.get,
        "v2",
        audit,
        open_keys=frozenset({(20, "a")}),
        edge_keys=frozenset({(10, "b")}),
    )
    assert dict(audit.counts) == {"ok": 2, "unverified": 1, "wrong": 1, "open": 1}
    assert audit.examples["wrong"] == [
        {"group": "30,z", "stored": [1], "why": "no such group in the transform's output"}
    ]


def _report(sink: SinkAudit) -> AuditReport:
    part = PartitionAudit(0, 0, 10, 10, 0, 10, applied_once=10)
    return AuditReport(P, T, "shallow", [part], 0, 0, sink=sink)


def test_a_sink_finding_fails_the_audit_and_is_named_in_the_verdict() -> None:
    sink = SinkAudit("kafka", "topic out")
    sink.add("ok", n=9)
    sink.add("missing", f"{T}:0:4")
    sink.add("foreign", "out[0]@7")
    report = _report(sink)
    data = report.to_json()
    assert not report.ok and data["sink"]["counts"] == {"foreign": 1, "missing": 1, "ok": 9}
    text = render(data)
    assert f"missing: {T}:0:4" in text and "sink verdict: NOT OK: 1 missing" in text
    assert text.splitlines()[-1].endswith("NOT OK: sink: 1 missing (0.0s)")


def test_an_unreadable_sink_says_ledger_only_instead_of_ok() -> None:
    sink = SinkAudit("foreach_batch", "a ForEachBatch function", read=False, notes=["cannot read"])
    report = _report(sink)
    text = render(report.to_json())
    assert report.ok and "LEDGER ONLY" in text
    assert "the sink was NOT read (ledger only)" in text.splitlines()[-1]
    assert "the sink agrees" in render(_report(SinkAudit("kafka", "topic out")).to_json())
