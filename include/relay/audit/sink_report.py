"""What the sink audit read and found: counts per finding, examples, how each side was read.

The unit of the counts depends on the sink: an input offset for a Kafka output, a key for an upsert
table, a group (window and key) for a stateful table. Findings that fail the audit (exit code 3):
``missing``, ``duplicated``, ``wrong``, ``stale``. Reported apart, without failing it: ``ahead`` (an
effect of an offset the ledger has not committed yet: a batch in flight, or a dead instance's write
that its successor takes over), ``foreign`` (written outside Relay: no source position),
``open`` (a window still receiving records at the end of the input), ``unverified`` (the input was
deleted by retention, or the version's artifact is gone: nothing to re-evaluate).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from relay.audit.report import EXAMPLES
from relay.errors import RelayError

FAILURES = ("missing", "duplicated", "wrong", "stale")
APART = ("ahead", "foreign", "open", "unverified")
UNITS = {"kafka": "input offset", "upsert": "key", "stateful": "group"}
MEANING = {  # said under the counts when found
    "ahead": "effects of offsets the ledger has not committed yet (a batch in flight, or a dead "
    "instance's write its successor takes over): not judged",
    "foreign": "written outside Relay (no source position, or another topic's): not judged",
    "open": "windows that received records within warm_up_s of the newest record: may still change",
    "unverified": "input deleted by retention, or a version's artifact gone: nothing to re-evaluate",
}


class SinkAuditError(RelayError):
    """The sink audit cannot run: a version's code does not load, its sink can't be built or read."""


@dataclass
class SinkAudit:
    """The sink side of ``relay audit --deep`` (``AuditReport.sink``)."""

    kind: str  # kafka | upsert | stateful | counter | foreach_batch | unknown
    target: str  # what was read (passwords masked)
    read: bool = True  # False: Relay cannot read this sink; the audit is the ledger's only
    how: list[str] = field(default_factory=list)  # what was read, and how, one line each
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, finding: str, example: Any = None, n: int = 1) -> None:
        """Count ``n`` of ``finding``; keep ``example`` unless EXAMPLES are kept already."""
        self.counts[finding] += n
        if example is not None:
            kept = self.examples.setdefault(finding, [])
            if len(kept) < EXAMPLES:
                kept.append(example)

    @property
    def ok(self) -> bool:
        return not any(self.counts[f] for f in FAILURES)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "read": self.read,
            "unit": UNITS.get(self.kind, "offset"),
            "ok": self.ok,
            "counts": dict(sorted(self.counts.items())),
            "examples": self.examples,
            "how": self.how,
            "notes": self.notes,
            "timings": self.timings,
        }


def render_sink(data: dict[str, Any]) -> list[str]:
    """The readable lines of ``SinkAudit.to_json()`` (after the ledger's table)."""
    lines = [f"sink: {data['kind']} {data['target']}"]
    lines += [f"  read: {h}" for h in data["how"]]
    if not data["read"]:
        lines += [f"  note: {n}" for n in data["notes"]]
        lines.append("sink verdict: LEDGER ONLY: the sink was not read, nothing about it is proven")
        return lines
    counts = data["counts"]
    if counts:
        lines.append(f"  {data['unit']}s: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for kind, items in data["examples"].items():
        lines.append(f"  {kind}: {', '.join(_shown(i) for i in items)}")
    lines += [f"  note: {k}: {MEANING[k]}" for k in APART if counts.get(k)]
    lines += [f"  note: {n}" for n in data["notes"]]
    seconds = ", ".join(f"{k} {v:.1f}s" for k, v in data["timings"].items())
    if data["ok"]:
        verdict = f"OK: every applied {data['unit']}'s effect is in the sink exactly once"
    else:
        verdict = "NOT OK: " + ", ".join(f"{counts[k]} {k}" for k in FAILURES if counts.get(k))
    lines.append(f"sink verdict: {verdict} ({seconds})")
    return lines


def _shown(item: Any) -> str:
    if isinstance(item, dict):
        return "{" + " ".join(f"{k}={v}" for k, v in item.items()) + "}"
    return str(item)
