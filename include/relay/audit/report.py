"""What the audit found, per partition and in total, as objects, JSON and readable text.

Every offset of the audited range lands in exactly one bucket, so the buckets add up to its size:
``applied_once + duplicates + declared_lost + unread + not_applied_below_cursor + applied_unread``.
``not_applied_below_cursor`` is what the ledger alone cannot judge: offsets a lease read that left
no row, either a lost record or an offset Kafka has no record at (transaction marker, aborted or
compacted record). The shallow audit counts all of them as ``missing`` (it never calls a pipeline
OK it cannot prove); the deep audit re-reads Kafka and splits them into ``holes`` and ``missing``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.audit.sink_report import SinkAudit

EXAMPLES = 10  # offsets or ranges listed per kind of finding and partition

COUNTS = (
    "applied_once",
    "duplicates",
    "dead_letters",
    "declared_lost",
    "unread",
    "not_applied_below_cursor",
    "holes",
    "missing",
    "applied_unread",
    "applied_without_record",
)


@dataclass
class PartitionAudit:
    """One partition: the audited range ``[audited_from, audited_to)`` and where each offset landed."""

    partition: int
    earliest: int  # Kafka's log start (retention and delete_records move it)
    latest: int  # Kafka's high watermark
    frontier: int | None  # the highest cursor of any lease; None when no lease ever covered it
    audited_from: int  # the first lease's start (offsets before it were never the pipeline's), or since
    audited_to: int  # the high watermark (or the ledger's reach, if higher), or until
    applied_once: int = 0  # read and applied exactly once: one sink row or one dead letter
    duplicates: int = 0  # read and applied more than once (rows + dead letters > 1)
    dead_letters: int = 0  # of applied_once, those whose one application is a dead letter
    declared_lost: int = 0  # inside a gap (lost to retention or skipped on purpose) and not applied
    unread: int = 0  # at/after the cursor of its lease or beyond every lease: not read yet
    not_applied_below_cursor: int = 0  # read (or in no lease below the frontier) and no row
    holes: int | None = None  # deep: of not_applied_below_cursor, offsets Kafka has no record at
    missing: int = 0  # records that were read and never applied (shallow: every not-applied offset)
    applied_unread: int = 0  # rows at offsets no cursor has passed: written outside the protocol
    applied_without_record: int | None = None  # deep: rows at offsets Kafka now has no record at
    examples: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def applied_twice_or_more(self) -> int:
        """The older name of ``duplicates`` (the upgrade's DONE step reads it)."""
        return self.duplicates

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.applied_unread == 0

    def example(self, kind: str, item: Any) -> None:
        """Keep ``item`` as an example of ``kind`` unless EXAMPLES are kept already."""
        found = self.examples.setdefault(kind, [])
        if len(found) < EXAMPLES:
            found.append(item)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["applied_twice_or_more"] = self.duplicates
        data["ok"] = self.ok
        return data


@dataclass
class AuditReport:
    pipeline: str
    topic: str
    mode: str  # "shallow": the ledger's SQL aggregates; "deep": compared with Kafka offset by offset
    partitions: list[PartitionAudit]
    message_count: int  # the counter's running count (its sink's counter_totals; 0 for other sinks)
    applied_rows: int  # rows in the sink table: must equal message_count
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    sink: SinkAudit | None = None  # --deep on an executor-side sink: what the sink holds (``sink``)

    @property
    def totals(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for name in COUNTS:
            values = [getattr(p, name) for p in self.partitions]
            out[name] = None if any(v is None for v in values) else sum(values)
        return out

    @property
    def ok(self) -> bool:
        sink_ok = self.sink is None or self.sink.ok
        return all(p.ok for p in self.partitions) and self.message_count == self.applied_rows and sink_ok

    def to_json(self) -> dict[str, Any]:
        sink = {} if self.sink is None else {"sink": self.sink.to_json()}
        return {
            "pipeline": self.pipeline,
            "topic": self.topic,
            "mode": self.mode,
            "ok": self.ok,
            "totals": self.totals,
            "message_count": self.message_count,
            "applied_rows": self.applied_rows,
            "partitions": [p.to_json() for p in self.partitions],
            "notes": self.notes,
            "seconds": self.seconds,
            **sink,
        }


def _ranges(items: list[Any]) -> str:
    return ", ".join(f"[{i[0]}, {i[1]})" if isinstance(i, list | tuple) else str(i) for i in items)


def render(result: dict[str, Any]) -> str:
    """The readable form of ``AuditReport.to_json()`` (what ``relay audit`` prints)."""
    columns = ["partition", "earliest", "latest", "frontier", *(c for c in COUNTS if c != "holes")]
    if result["mode"] == "deep":
        columns.insert(columns.index("missing"), "holes")
    columns = [c for c in columns if c not in ("not_applied_below_cursor", "applied_without_record")]
    rows = [[str(p.get(c) if p.get(c) is not None else "-") for c in columns] for p in result["partitions"]]
    totals = result["totals"]
    rows.append(["total", "", "", "", *(str(totals.get(c, "")) for c in columns[4:])])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    sink = result.get("sink")
    read = ", sink read" if sink is not None and sink["read"] else ""
    lines = [f"audit of pipeline {result['pipeline']}, topic {result['topic']} ({result['mode']}{read})"]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in [columns, *rows]]
    for p in result["partitions"]:
        for kind, items in p["examples"].items():
            lines.append(f"partition {p['partition']} {kind.replace('_', ' ')}: {_ranges(items)}")
    lines += [f"note: {n}" for n in result["notes"]]
    if sink is not None:
        from relay.audit.sink_report import FAILURES, render_sink

        lines += render_sink(sink)
    counts = f"count = {result['message_count']}, applied rows = {result['applied_rows']}"
    if result["ok"]:
        verdict = "OK: every offset read was applied exactly once or declared lost"
        if totals["unread"]:
            verdict += f"; {totals['unread']} offset(s) not read yet"
        if sink is not None:
            verdict += "; the sink was NOT read (ledger only)" if not sink["read"] else "; the sink agrees"
    else:
        wrong = [
            f"{totals[k]} {k.replace('_', ' ')}"
            for k in ("duplicates", "missing", "applied_unread")
            if totals[k]
        ]
        if result["message_count"] != result["applied_rows"]:
            wrong.append("count differs from rows")
        if sink is not None and not sink["ok"]:
            wrong += [f"sink: {sink['counts'][k]} {k}" for k in FAILURES if sink["counts"].get(k)]
        verdict = "NOT OK: " + ", ".join(wrong)
    lines.append(f"{counts}: {verdict} ({result['seconds']}s)")
    return "\n".join(lines)
