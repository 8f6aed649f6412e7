"""What ``relay health`` said while the chaos run hurt the stack (issue #34: health reporting each
fault while it lasts and OK after), sampled from outside the pipeline every few seconds.

Why sampled and judged per fault afterwards: a fault lasts from its injection to the pipeline's next
commit; the samples inside that span say whether health saw it (a level above OK), and the report
taken after the run caught up says whether health is OK again. A broker blip of one second between
two samples is not seen, and is not meant to be: it cost no commit either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from relay.config import RelayConfig
from relay.errors import RelayError

LEVELS = ("OK", "WARN", "CRITICAL")


def _findings(report: Any, detail: bool) -> dict[str, Any]:
    above = [c for c in report.checks if c.level.value != "OK"]
    found: dict[str, Any] = {"status": report.status.value, "not_ok": {c.name: c.level.value for c in above}}
    if detail:  # what a failed assertion on the final report has to show
        found["messages"] = {c.name: c.message for c in above}
    return found


def health_now(config: RelayConfig, detail: bool = False) -> dict[str, Any]:
    """One report, not persisted and healing nothing: the level and the findings above OK (with
    ``detail``, their messages too)."""
    from relay.health import run_health

    try:
        return _findings(run_health(config, persist=False, heal=False), detail)
    except RelayError as exc:  # the ledger locked or away: health could not say (itself a finding)
        return {"status": "ERROR", "not_ok": {}, "error": f"{type(exc).__name__}: {exc}"[:300]}


class HealthWatcher:
    """Samples :func:`health_now` every ``interval_s`` on a thread of its own; ``samples`` holds
    ``{"at", "status", "not_ok"}`` dicts, wall-clock seconds."""

    def __init__(self, config: RelayConfig, interval_s: float = 5.0) -> None:
        self.config, self.interval_s = config, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)

    def _run(self) -> None:  # a long-running sampler: it stops with the run
        while not self._stop.is_set():
            started = time.time()
            sample = health_now(self.config)
            sample["at"] = started
            self.samples.append(sample)
            self._stop.wait(max(0.0, self.interval_s - (time.time() - started)))


def worst(levels: Iterable[str]) -> str | None:
    """The most severe of OK/WARN/CRITICAL (ERROR, health failing to report, counts as CRITICAL)."""
    ranked = [LEVELS.index(lv) if lv in LEVELS else len(LEVELS) - 1 for lv in levels]
    return LEVELS[max(ranked)] if ranked else None


def health_during(events: list[dict[str, Any]], samples: list[dict[str, Any]]) -> None:
    """Per injected fault: ``health_seen``, the worst level sampled from the injection to the next
    commit, and ``health_findings``, the checks above OK then (None: no sample fell in the span)."""
    for e in events:
        if not e.get("at") or e.get("next_commit_s") is None:
            continue
        inside = [s for s in samples if e["at"] <= s["at"] <= e["at"] + e["next_commit_s"]]
        e["health_seen"] = worst(s["status"] for s in inside)
        e["health_findings"] = sorted({name for s in inside for name in s["not_ok"]})


def health_summary(events: list[dict[str, Any]], final: dict[str, Any] | None) -> dict[str, Any]:
    """Per kind: faults with a sample inside, and how many of those health reported (above OK); the
    report after the run caught up."""
    kinds: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("health_seen") is None:
            continue
        row = kinds.setdefault(e["kind"], {"sampled": 0, "reported": 0})
        row["sampled"] += 1
        row["reported"] += int(e["health_seen"] != "OK")
    return {"kinds": kinds, "final": final}
