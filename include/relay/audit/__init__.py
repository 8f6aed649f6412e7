"""Audit: prove every offset a pipeline read was applied exactly once, or declared lost.

The seeds' "Count = 890 / Experience: 890 -> 890" check made exact and cheap. Per partition, the
ledger's leases and gaps split the offsets into segments (``segments``): read (below a cursor),
declared lost (a gap), unread (at/after a cursor, or beyond every lease). SQL aggregates count how
often each offset of a segment was applied (``ledger_counts``), so the cost is a few indexed queries
per lease, never a Python loop over every offset since 0. Unread offsets are reported apart, so a
healthy stopped pipeline is OK.

Shallow (default) mode trusts the ledger alone and cannot tell an offset Kafka has no record at
(transaction marker, aborted or compacted record) from a lost record: it counts both as missing,
says so, and never calls a pipeline OK it cannot prove. Deep mode re-reads Kafka with read_committed
and walks its record offsets beside the applied offsets (``deep``), so holes are not missing.

Use ``since``/``until`` to audit a window (e.g. an upgrade's handoff), not the whole history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from sqlalchemy.engine import Connection

from relay.audit import ledger_counts as lc
from relay.audit.coverage import RangeCoverage, SqlRows, executor_coverage
from relay.audit.deep import compare
from relay.audit.kafka_records import CommittedRecords
from relay.audit.report import EXAMPLES, AuditReport, PartitionAudit, render
from relay.audit.segments import Kind, Segment, SegmentIndex, Span, split
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.snapshot import read_snapshot
from relay.ledger.store import Ledger

__all__ = ["AuditReport", "PartitionAudit", "audit", "audit_ledger", "render"]

Offsets = dict[int, int]
RecordSource = Callable[[int, int, int], Iterable[int]]  # (partition, start, end) -> record offsets


def audit(
    config: RelayConfig,
    ledger: Ledger | None = None,
    *,
    since: Offsets | None = None,
    until: Offsets | None = None,
    deep: bool = False,
    progress: Callable[[str], None] | None = None,
    stall_s: float = 30.0,
    sink: bool = False,
) -> AuditReport:
    """Audit the configured pipeline and topic; ``deep`` re-reads Kafka (see the module docstring).

    ``since``/``until`` bound the audited offsets per partition (``until`` caps at the given
    offset; a partition missing from ``until`` is not audited). ``sink`` (``relay audit --deep``)
    also reads an executor-side sink and judges it against Kafka's input (``relay.audit.sink``:
    a local Spark session re-evaluates the transform, so it is not for an operation's own steps).
    """
    own = ledger is None
    ledger = ledger or Ledger(config.ledger_url)
    try:
        with KafkaOffsets(config.kafka_bootstrap) as kafka:

            def offsets() -> tuple[Offsets, Offsets]:
                return kafka.earliest(config.topic), kafka.latest(config.topic)

            if not deep:
                report = audit_ledger(
                    ledger, config.pipeline, config.topic, offsets, since=since, until=until
                )
            else:
                with CommittedRecords(config.kafka_bootstrap, config.topic, stall_s, progress) as reader:
                    report = audit_ledger(
                        ledger,
                        config.pipeline,
                        config.topic,
                        offsets,
                        since=since,
                        until=until,
                        records=reader.offsets,
                    )
        if sink:
            from relay.audit.sink import audit_sink

            report.sink = audit_sink(config, ledger, progress or (lambda _: None))
        return report
    finally:
        if own:
            ledger.close()


def audit_ledger(
    ledger: Ledger,
    pipeline: str,
    topic: str,
    offsets: Callable[[], tuple[Offsets, Offsets]],
    *,
    since: Offsets | None = None,
    until: Offsets | None = None,
    records: RecordSource | None = None,
) -> AuditReport:
    """The audit against one read snapshot of the ledger.

    ``offsets`` returns Kafka's (earliest, latest); it is called once the snapshot is fixed, so
    every cursor seen is at or below the latest offset. ``records`` (deep mode) yields the offsets
    of the committed records of a partition's range.
    """
    started = time.perf_counter()
    with read_snapshot(ledger) as conn:
        spans = lc.spans(conn, pipeline, topic)  # the first read fixes the snapshot
        # The counter's sink (LedgerMessagesSink) writes its rows in the ledger's database: count them
        # per offset, without reading every batch's ranges first.
        counted = lc.has_message_ranges(conn, pipeline)
        covered = {} if counted else executor_coverage(conn, pipeline, topic)
        if covered:
            records = None  # committed ranges cover holes too: nothing for Kafka to tell apart
        rows = lc.has_counter_tables(conn)  # absent where the counter never ran: nothing to count
        earliest, latest = offsets()
        parts = [
            _partition(
                conn,
                lc.Key(pipeline, topic, p),
                spans.get(p, ([], [])),
                earliest,
                latest,
                since,
                until,
                records,
                covered.get(p, RangeCoverage([])) if covered or not rows else None,
            )
            for p in sorted(set(latest) | set(spans))
        ]
        message_count, applied_rows = lc.sink_totals(conn, pipeline)
    report = AuditReport(
        pipeline, topic, "deep" if records is not None else "shallow", parts, message_count, applied_rows
    )
    report.notes = _notes(report)
    if covered:
        report.notes.insert(
            0,
            "executor-side sink: every offset below the cursors must lie in exactly one committed "
            "batch range (the sink's fenced, idempotent task writes ran before each commit); "
            "--deep adds nothing here (ranges cover offsets without a record too)",
        )
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _bounds(
    key: lc.Key, leases: list[Span], earliest: int, latest: int, since: Offsets | None, until: Offsets | None
) -> tuple[int, int]:
    """The audited range: from the first lease (before it nothing was the pipeline's) to the latest."""
    lo = min((lease.start for lease in leases), default=earliest)
    if since is not None and key.partition in since:
        lo = max(lo, since[key.partition])
    hi = max([latest, *(lease.cursor or 0 for lease in leases)])
    if until is not None:
        hi = min(hi, until.get(key.partition, lo))
    return lo, max(lo, hi)


def _outside(a: int, b: int, window: tuple[int, int]) -> list[tuple[int, int]]:
    """``[a, b)`` minus ``window``."""
    return [(x, y) for x, y in ((a, min(b, window[0])), (max(a, window[1]), b)) if x < y]


def _partition(
    conn: Connection,
    key: lc.Key,
    spans: tuple[list[Span], list[Span]],
    earliest: Offsets,
    latest: Offsets,
    since: Offsets | None,
    until: Offsets | None,
    records: RecordSource | None,
    covered: RangeCoverage | None = None,
) -> PartitionAudit:
    leases, gaps = spans
    src = covered if covered is not None else SqlRows(conn, key)
    first, last = earliest.get(key.partition, 0), latest.get(key.partition, 0)
    lo, hi = _bounds(key, leases, first, last, since, until)
    frontier = max((lease.cursor for lease in leases if lease.cursor is not None), default=None)
    pa = PartitionAudit(key.partition, first, last, frontier, lo, hi)
    segments = split(lo, hi, leases, gaps)
    # Deep mode judges [window) by Kafka: from the earliest available to the last offset read.
    judged = [seg for seg in segments if seg.kind is not Kind.UNREAD]
    window = (max(lo, first), min(judged[-1].end, last)) if records is not None and judged else (hi, hi)
    for seg in segments:
        _count_segment(src, seg, pa, window)
    if records is None:
        pa.missing = pa.not_applied_below_cursor
        return pa
    pa.holes = pa.applied_without_record = 0
    if window[0] < window[1]:
        found = compare(
            SegmentIndex(segments),
            window[0],
            window[1],
            records(key.partition, *window),
            lc.applied_stream(conn, key, *window),
        )
        pa.holes, pa.applied_without_record = found.holes, found.applied_without_record
        for a, b in found.missing_ranges:
            pa.example("missing", [a, b])
        for a, b in found.hole_ranges:
            pa.example("holes", [a, b])
        for offset in found.without_record:
            pa.example("applied_without_record", offset)
    pa.missing = pa.not_applied_below_cursor - pa.holes
    if "missing" in pa.examples:
        pa.examples["missing"].sort()
    return pa


def _count_segment(
    src: SqlRows | RangeCoverage, seg: Segment, pa: PartitionAudit, window: tuple[int, int]
) -> None:
    """Add one segment's counts to the partition; keep a few examples of anything wrong."""
    c = src.counts(seg.start, seg.end)
    empty = seg.size - c.handled
    if seg.kind.read:
        pa.applied_once += c.once
        pa.duplicates += c.duplicates
        pa.dead_letters += c.dead_once
        if c.duplicates:
            for offset in src.duplicate_offsets(seg.start, seg.end, EXAMPLES):
                pa.example("duplicates", offset)
    elif c.handled:
        pa.applied_unread += c.handled
        for offset in src.row_offsets(seg.start, seg.end, EXAMPLES):
            pa.example("applied_unread", offset)
    if seg.kind.lost:
        pa.declared_lost += empty
    elif seg.kind.expects_record:
        pa.not_applied_below_cursor += empty
        if empty:
            for a, b in _outside(seg.start, seg.end, window):  # inside the window Kafka decides
                for x, y in src.missing_ranges(a, b, EXAMPLES, _empty(src, a, b, seg, c)):
                    pa.example("missing", [x, y])
    else:
        pa.unread += empty


def _empty(src: SqlRows | RangeCoverage, a: int, b: int, seg: Segment, c: lc.Counts) -> int:
    """Offsets of ``[a, b)`` (part of ``seg``, whose counts are ``c``) with no row and no dead letter."""
    if (a, b) == (seg.start, seg.end):
        return seg.size - c.handled
    return (b - a) - src.handled(a, b)


def _notes(report: AuditReport) -> list[str]:
    """What a reader needs to interpret the numbers (and what to do about them)."""
    t, notes = report.totals, []
    if t["unread"]:
        notes.append(f"{t['unread']} offset(s) at or after the cursors are not read yet: not missing")
    if report.mode == "shallow" and t["not_applied_below_cursor"]:
        notes.append(
            f"{t['not_applied_below_cursor']} offset(s) below the cursors left no row: lost records, or "
            "offsets Kafka has no record at (transaction markers, aborted or compacted records). The "
            "ledger alone cannot tell them apart, so they count as missing: `relay audit --deep` "
            "re-reads Kafka and separates holes from missing records"
        )
    if t["applied_unread"]:
        notes.append(
            f"{t['applied_unread']} offset(s) have rows although no lease's cursor passed them: written "
            "outside the commit protocol (a copy of the job Relay did not start?)"
        )
    if t["applied_without_record"]:
        notes.append(
            f"{t['applied_without_record']} applied offset(s) have no committed record in Kafka now: "
            "compacted after they were applied, or an aborted transaction read with read_uncommitted"
        )
    if report.message_count != report.applied_rows:
        notes.append(
            f"the sink's count ({report.message_count}) differs from its rows ({report.applied_rows})"
        )
    return notes
