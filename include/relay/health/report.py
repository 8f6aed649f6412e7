"""The vocabulary of a health report: levels, statuses, one check's finding, the report, tunables,
and the guard that makes a check that cannot run a finding.

Kept apart from the checks so that every check module, the run and the Airflow notifier share one
definition of what a finding is (and of what the summary an operator receives looks like).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from relay.errors import OperationError, RelayError

REPORT_KIND = "health"
DEPLOY = "run the DAG relay_deploy (or `relay deploy`)"
STOP = "run the DAG relay_stop (or `relay stop`)"
REFUSAL_WINDOW_S = 3600.0  # refused starts stay in the report for an hour


class Level(str, Enum):
    """Severity of a check and of the whole report; ordered so the worst check sets the report's."""

    OK = "OK"
    WARN = "WARN"
    CRITICAL = "CRITICAL"

    @property
    def rank(self) -> int:
        return {"OK": 0, "WARN": 1, "CRITICAL": 2}[self.value]

    @classmethod
    def worst(cls, levels: list[Level]) -> Level:
        return max(levels, key=lambda lv: lv.rank, default=cls.OK)


class RunState(str, Enum):
    """Whether the pipeline's job runs, as both views say (DOWN is a finding, not a severity)."""

    RUNNING = "RUNNING"
    DOWN = "DOWN"
    STOPPED = "STOPPED"  # stopped on purpose (`relay stop`): nothing runs, and nothing should
    UNKNOWN = "UNKNOWN"  # the master could not be asked


class PartitionStatus(str, Enum):
    """Burrow's evaluation of one partition (plus UNOWNED: no lease covers it yet)."""

    OK = "OK"
    WARN = "WARN"  # cursor moves but lag grows: falling behind
    STALL = "STALL"  # job runs, lag > 0, cursor did not move in the window
    STOP = "STOP"  # job down, lag > 0: messages wait and nobody reads them
    ERR = "ERR"  # cursor below the earliest offset: retention removed what it needs
    UNOWNED = "UNOWNED"
    STOPPED = "STOPPED"  # stopped on purpose, lag > 0: the records wait for the next deploy


@dataclass
class Check:
    """One finding: ``action`` says what to run next when the level is not OK."""

    name: str
    level: Level
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    action: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "level": self.level.value,
            "message": self.message,
            "action": self.action,
            "data": self.data,
        }


@dataclass
class Thresholds:
    """Tunables of the rules; defaults fit the 5-minute relay_health schedule."""

    window_s: float = 300.0  # Burrow-style evaluation window over the cursor history
    interval_s: float = 300.0  # how often health runs: retention must leave more than 2 intervals
    crash_window_s: float = 600.0
    crash_attempts: int = 3
    lag_warn_records: int = 100_000
    lag_warn_seconds: float = 300.0
    latency_critical_factor: float = 10.0
    history_reports: int = 50  # previous reports read for the lag/produce-rate history


@dataclass
class HealthReport:
    """One structured report: persisted in the ledger, returned as XCom, printed by the CLI."""

    pipeline: str
    created_at: float
    status: Level
    checks: list[Check]
    data: dict[str, Any] = field(default_factory=dict)
    report_id: int | None = None

    @property
    def down(self) -> bool:
        return bool(self.data.get("down"))

    @property
    def critical(self) -> list[Check]:
        return [c for c in self.checks if c.level is Level.CRITICAL]

    def check(self, name: str) -> Check:
        """The check called ``name`` (KeyError names the ones there are)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; have {[c.name for c in self.checks]}")

    def summary(self) -> str:
        """One line per non-OK check: what is wrong and what to run next (the alert's text)."""
        lines = [f"{self.pipeline}: {self.status.value}" + (" (job DOWN)" if self.down else "")]
        for c in self.checks:
            if c.level is not Level.OK:
                lines.append(
                    f"[{c.level.value}] {c.name}: {c.message}" + (f" -> {c.action}" if c.action else "")
                )
        if self.down and not any(c.level is not Level.OK for c in self.checks):
            lines.append(f"[WARN] single_instance: nothing runs the pipeline -> {DEPLOY} if it should run")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "created_at": self.created_at,
            "status": self.status.value,
            "report_id": self.report_id,
            "data": self.data,
            "checks": [c.to_json() for c in self.checks],
            "summary": self.summary(),
        }

    def raise_for_status(self) -> None:
        """Raise OperationError (with the summary) when anything is CRITICAL: for callers that must fail."""
        if self.status is Level.CRITICAL:
            raise OperationError(self.summary())


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: honest with few samples)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def guard(name: str, fn: Callable[[], Check]) -> Check:
    """A check that cannot run is a CRITICAL finding, never a crashed health run."""
    try:
        return fn()
    except RelayError as exc:
        return Check(
            name,
            Level.CRITICAL,
            f"could not evaluate: {exc}",
            {"error": str(exc)},
            "check the component named in the message",
        )
