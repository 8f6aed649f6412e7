"""The scheduled health check of one pipeline (DAG ``relay_health`` and ``relay health``).

Health compares the ledger's inside view (instances, attempts, leases, batches) with the outside views
(the Spark master's applications, Kafka's offsets) and turns every finding into a :class:`Check` with
a level and a next step an operator can run. It never raises because something is down: a job that is
not running, an unreachable broker or master are exactly what it must report. Each check is a small
pure function over plain inputs, so the rules are unit-tested on real ledgers without a cluster.

Progress follows Burrow's consumer-lag evaluation rules (OK, WARN, STALL, STOP, ERR) over a sliding
window of the cursor history (the ``batches`` table) and the lag history (previous health reports).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from relay.config import RelayConfig
from relay.errors import KafkaError, OperationError, RelayError, SparkError
from relay.launcher import app_prefix
from relay.ledger.models import Attempt, AttemptState, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import STALE_HEARTBEAT_S, Inventory

REPORT_KIND = "health"
DEPLOY = "run the DAG relay_deploy (or `relay deploy`)"
STOP = "run the DAG relay_stop (or `relay stop`)"


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
    UNKNOWN = "UNKNOWN"  # the master could not be asked


class PartitionStatus(str, Enum):
    """Burrow's evaluation of one partition (plus UNOWNED: no lease covers it yet)."""

    OK = "OK"
    WARN = "WARN"  # cursor moves but lag grows: falling behind
    STALL = "STALL"  # job runs, lag > 0, cursor did not move in the window
    STOP = "STOP"  # job down, lag > 0: messages wait and nobody reads them
    ERR = "ERR"  # cursor below the earliest offset: retention removed what it needs
    UNOWNED = "UNOWNED"


_PROGRESS_LEVEL = {
    PartitionStatus.OK: Level.OK,
    PartitionStatus.UNOWNED: Level.OK,
    PartitionStatus.WARN: Level.WARN,
    PartitionStatus.STALL: Level.CRITICAL,
    PartitionStatus.STOP: Level.CRITICAL,
    PartitionStatus.ERR: Level.CRITICAL,
}


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


# --------------------------------------------------------------------------------- small helpers
def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: honest with few samples)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def instance_of_app(pipeline: str, name: str) -> int | None:
    """Instance id an application name ``relay-<pipeline>-<id>`` stands for; None if it is not ours.

    A bare prefix match is not enough: the prefix of pipeline ``exp`` also matches ``relay-exp-foo-3``.
    """
    rest = name[len(app_prefix(pipeline)) :] if name.startswith(app_prefix(pipeline)) else ""
    return int(rest) if rest.isdigit() else None


def is_upgrade(live: list[Instance]) -> bool:
    """Two live instances are expected while one drains and the other starts or runs (blue/green)."""
    states = sorted(i.state.value for i in live)
    return (
        len(live) == 2
        and "DRAINING" in states
        and ("ACTIVE" in states or "STARTING" in states)
        and states[0] != states[1]
    )


def live_attempts(
    instance: Instance, attempts: list[Attempt], now: float
) -> tuple[list[Attempt], list[Attempt]]:
    """(current, superseded) RUNNING attempts with a fresh heartbeat.

    Only the attempt of the instance's current epoch can commit; an older one that still heartbeats
    (the master relaunched a driver that had not finished dying) is already a harmless zombie.
    """
    fresh = [
        a for a in attempts if a.state is AttemptState.RUNNING and a.heartbeat_at > now - STALE_HEARTBEAT_S
    ]
    return (
        [a for a in fresh if a.epoch == instance.current_epoch],
        [a for a in fresh if a.epoch != instance.current_epoch],
    )


# ------------------------------------------------------------------------------------ the checks
def check_single_instance(
    pipeline: str,
    inventory: Inventory,
    instances: list[Instance],
    attempts: dict[int, list[Attempt]],
    now: float,
) -> Check:
    """Ledger vs master: unknown applications, zombies of fenced/ended instances, two live attempts.

    ``instances`` are ALL instances of the pipeline: inventory only lists the live ones, and a FENCED
    instance still running in the master shows up there as an unknown application.
    """
    by_id = {i.id: i for i in instances}
    live = [by_id.get(i.id, i) for i in inventory.live]
    problems: list[str] = []
    actions: list[str] = []
    data: dict[str, Any] = {
        "live_instances": [
            {
                "id": i.id,
                "state": i.state.value,
                "version": i.version,
                "color": i.color.value,
                "submission_id": i.submission_id,
            }
            for i in live
        ],
        "dead_instances": [
            {"id": i.id, "state": i.state.value, "submission_id": i.submission_id} for i in inventory.dead
        ],
        "master_apps": [{"id": a.id, "name": a.name, "state": a.state.value} for a in inventory.apps],
        "master_error": inventory.master_error,
    }
    unknown, zombies = [], []
    for app in inventory.apps:
        if not app.name.startswith(app_prefix(pipeline)):
            continue
        inst_id = instance_of_app(pipeline, app.name)
        if inst_id is None:
            head, _, tail = app.name[len(app_prefix(pipeline)) :].rpartition("-")
            if head and tail.isdigit():
                continue  # another pipeline whose name extends ours (relay-exp-foo-3 for pipeline exp)
        if inst_id is not None and any(i.id == inst_id for i in live):
            continue
        inst = by_id.get(inst_id) if inst_id is not None else None
        if inst is None:
            unknown.append(app)
            problems.append(
                f"Spark application {app.id} ({app.name}) runs but the ledger knows no such instance "
                "(started behind Relay's back?)"
            )
        else:
            zombies.append((app, inst))
            problems.append(
                f"instance {inst.id} is {inst.state.value} in the ledger but still runs in the master "
                f"as {app.id} ({app.name})"
            )
    if unknown:
        actions.append(
            "kill the unknown application(s) in the Spark master, then check that no output was "
            "written outside the ledger (`relay audit`)"
        )
    if zombies:
        fenced = [inst.id for _, inst in zombies if inst.state is InstanceState.FENCED]
        unfenced = [inst.id for _, inst in zombies if inst.state is not InstanceState.FENCED]
        if unfenced:
            actions.append(
                f"fence instance(s) {unfenced} (it is not fenced: it could still commit) and kill "
                f"their driver(s): {STOP}"
            )
        if fenced:
            actions.append(f"kill the driver(s) of fenced instance(s) {fenced} (they cannot commit): {STOP}")
    data["unknown_apps"] = [a.id for a in unknown]
    data["zombie_apps"] = [{"app": a.id, "instance": i.id, "state": i.state.value} for a, i in zombies]

    current: list[dict[str, Any]] = []
    superseded: list[dict[str, Any]] = []
    for inst in live:
        cur, old = live_attempts(inst, attempts.get(inst.id, []), now)
        current += [{"instance": inst.id, "attempt": a.id, "epoch": a.epoch} for a in cur]
        superseded += [{"instance": inst.id, "attempt": a.id, "epoch": a.epoch} for a in old]
    data["live_attempts"], data["superseded_attempts"] = current, superseded
    upgrade = is_upgrade(live)
    data["upgrade_in_progress"] = upgrade
    if len(live) > 1 and not upgrade:
        problems.append(
            f"{len(live)} live instances {[i.id for i in live]} "
            f"({', '.join(i.state.value for i in live)}) while no upgrade is in progress"
        )
        actions.append(f"keep one instance: {STOP}, then {DEPLOY}")
    elif len(current) > (2 if upgrade else 1):
        problems.append(f"{len(current)} attempts alive at once: {current}")
        actions.append(f"keep one instance: {STOP}, then {DEPLOY}")

    nothing_runs = not live and not inventory.apps
    run_state = RunState.DOWN if nothing_runs else RunState.RUNNING
    if inventory.master_error and not live:
        run_state = RunState.UNKNOWN
    data["status"] = run_state.value
    if inventory.master_error:
        problems.insert(0, f"Spark master unreachable: {inventory.master_error}")
        actions.insert(0, "check the Spark master (`relay stack status`); what runs cannot be verified")
    if problems:
        return Check("single_instance", Level.CRITICAL, "; ".join(problems), data, "; ".join(actions))
    if run_state is RunState.DOWN:
        why = (
            f" (instance(s) {[i.id for i in inventory.dead]} are live in the ledger but nothing runs them)"
            if inventory.dead
            else ""
        )
        return Check("single_instance", Level.OK, f"DOWN: nothing runs the pipeline{why}", data)
    what = "; ".join(f"instance {i.id} {i.state.value} ({i.version}, {i.color.value})" for i in live)
    return Check(
        "single_instance", Level.OK, f"RUNNING: {what}" + (" (upgrade in progress)" if upgrade else ""), data
    )


def check_driver(
    instances: list[Instance],
    attempts: dict[int, list[Attempt]],
    live_ids: set[int],
    now: float,
    crash_window_s: float = 600.0,
    crash_attempts: int = 3,
) -> Check:
    """Restarts, crash loops and failed instances.

    Supervision relaunches ANY non-zero exit forever, so a crash loop looks like a running job from the
    master: only the attempt count per instance tells.
    """
    data: dict[str, Any] = {"instances": []}
    problems: list[str] = []
    actions: list[str] = []
    considered = [i for i in instances if i.id in live_ids]
    latest = instances[-1] if instances else None
    if latest is not None and latest.id not in live_ids:
        considered.append(latest)  # the last one explains why nothing runs (FAILED, STOPPED)
    for inst in considered:
        atts = attempts.get(inst.id, [])
        recent = [a for a in atts if a.started_at >= now - crash_window_s]
        last = atts[-1] if atts else None
        data["instances"].append(
            {
                "id": inst.id,
                "state": inst.state.value,
                "restarts": max(len(atts) - 1, 0),
                "attempts_in_window": len(recent),
                "error": inst.error,
                "last_attempt": last.to_json() if last else None,
            }
        )
        if len(recent) >= crash_attempts:
            errors = sorted({a.error for a in recent if a.error})
            problems.append(
                f"crash loop: instance {inst.id} started {len(recent)} attempts in the last "
                f"{_fmt_s(crash_window_s)}" + (f" (errors: {'; '.join(errors)[:300]})" if errors else "")
            )
            actions.append(
                f"read the driver log (var/logs or the Spark worker), fix the cause, {STOP}, then {DEPLOY}"
            )
        failure = inst.error if inst.state is InstanceState.FAILED else None
        if not failure and last is not None and last.state is AttemptState.FAILED and inst.id in live_ids:
            failure = last.error or "its last attempt FAILED"
        if failure:
            problems.append(f"instance {inst.id} {inst.state.value}: {failure}")
            if "data loss" in failure.lower():
                actions.append("run the recovery DAG relay_recover (strategy earliest; dry-run first)")
            else:
                actions.append(f"read the driver log, fix the cause, then {DEPLOY}")
    data["restarts"] = sum(d["restarts"] for d in data["instances"] if d["id"] in live_ids)
    if problems:
        return Check("driver", Level.CRITICAL, "; ".join(problems), data, "; ".join(dict.fromkeys(actions)))
    if not considered:
        return Check("driver", Level.OK, "no instance yet", data)
    return Check("driver", Level.OK, f"{data['restarts']} restart(s) of the live instance(s)", data)


def cursor_moves(batches: list[dict], topic: str, since: float) -> dict[int, int]:
    """Records the cursor moved per partition in batches committed after ``since`` (from the ledger)."""
    moved: dict[int, int] = {}
    for b in batches:
        if b["committed_at"] < since:
            continue
        for r in b.get("ranges") or []:
            if r.get("topic") == topic:
                p = int(r["partition"])
                moved[p] = moved.get(p, 0) + max(int(r["to"]) - int(r["from"]), 0)
    return moved


def history_samples(reports: list[dict]) -> list[dict]:
    """Offsets per partition seen by previous health reports, oldest first: ``[{at, offsets: {p: row}}]``."""
    out = []
    for r in reports:
        body = r.get("body") or {}
        rows = (body.get("data") or {}).get("offsets")
        if rows:
            out.append(
                {
                    "at": float(body.get("created_at") or r["created_at"]),
                    "offsets": {int(row["partition"]): row for row in rows},
                }
            )
    return sorted(out, key=lambda s: s["at"])


def window_samples(samples: list[dict], now: float, window_s: float) -> list[dict]:
    """The samples inside the window, preceded by the last one before it (the window's baseline)."""
    start = now - window_s
    before = [s for s in samples if s["at"] <= start]
    inside = [s for s in samples if start < s["at"] < now]
    return ([before[-1]] if before else []) + inside


def _offset_rates(
    offsets: list[dict], samples: list[dict], now: float, field: str
) -> dict[int, float | None]:
    """Records/s by which ``field`` (latest or earliest) moved per partition since the oldest sample."""
    rates: dict[int, float | None] = {}
    for row in offsets:
        p = int(row["partition"])
        old = next((s for s in samples if p in s["offsets"]), None)
        if old is None or now - old["at"] <= 0:
            rates[p] = None
        else:
            rates[p] = max(int(row[field]) - int(old["offsets"][p][field]), 0) / (now - old["at"])
    return rates


def produce_rates(offsets: list[dict], samples: list[dict], now: float) -> dict[int, float | None]:
    """Records/s written per partition since the oldest sample (None without history)."""
    return _offset_rates(offsets, samples, now, "latest")


def earliest_rates(offsets: list[dict], samples: list[dict], now: float) -> dict[int, float | None]:
    """Records/s retention removed per partition since the oldest sample (None without history)."""
    return _offset_rates(offsets, samples, now, "earliest")


def check_progress(
    offsets: list[dict],
    batches: list[dict],
    samples: list[dict],
    run_state: RunState,
    now: float,
    window_s: float = 300.0,
    started_at: float | None = None,
    topic: str | None = None,
) -> Check:
    """Burrow's rules per partition over the window.

    ERR when the cursor is below the earliest offset; STOP when the job is down with lag; STALL when it
    runs with lag but the cursor did not move in the window (not before the current attempt has been up
    for a whole window: a driver takes 20-40 s to its first batch); WARN when the cursor moves but the
    lag grew over every sample of the window; OK otherwise.
    """
    moves = cursor_moves(batches, topic or (offsets[0]["topic"] if offsets else ""), now - window_s)
    window = window_samples(samples, now, window_s)
    young = started_at is not None and started_at > now - window_s
    parts: list[dict[str, Any]] = []
    for row in offsets:
        p, cursor, lag = int(row["partition"]), row.get("cursor"), row.get("lag")
        earliest = int(row["earliest"])
        lags = [
            int(s["offsets"][p]["lag"])
            for s in window
            if p in s["offsets"] and s["offsets"][p].get("lag") is not None
        ]
        advanced = moves.get(p, 0) > 0
        growing = (
            lag is not None
            and len(lags) >= 1
            and all(b > a for a, b in zip(lags + [lag], (lags + [lag])[1:]))
        )
        if cursor is None:
            status = PartitionStatus.UNOWNED
        elif cursor < earliest:
            status = PartitionStatus.ERR
        elif not lag:
            status = PartitionStatus.OK
        elif run_state is RunState.DOWN:
            status = PartitionStatus.STOP
        elif advanced:
            status = PartitionStatus.WARN if growing else PartitionStatus.OK
        elif young or run_state is RunState.UNKNOWN:
            status = PartitionStatus.OK
        else:
            status = PartitionStatus.STALL
        parts.append(
            {
                "partition": p,
                "status": status.value,
                "cursor": cursor,
                "lag": lag,
                "moved_in_window": moves.get(p, 0),
                "lag_history": lags,
            }
        )
    by_status: dict[PartitionStatus, list[int]] = {}
    for d in parts:
        by_status.setdefault(PartitionStatus(d["status"]), []).append(d["partition"])
    data = {"window_s": window_s, "partitions": parts, "run_state": run_state.value}
    level = Level.worst([_PROGRESS_LEVEL[st] for st in by_status])
    msgs, actions = [], []
    if PartitionStatus.ERR in by_status:
        msgs.append(
            f"ERR on partition(s) {by_status[PartitionStatus.ERR]}: the cursor is below the earliest "
            "offset, retention removed records the pipeline had not read"
        )
        actions.append("run the recovery DAG relay_recover (strategy earliest; dry-run first)")
    if PartitionStatus.STOP in by_status:
        msgs.append(
            f"STOP on partition(s) {by_status[PartitionStatus.STOP]}: messages are waiting and nothing "
            "reads them"
        )
        actions.append(DEPLOY)
    if PartitionStatus.STALL in by_status:
        msgs.append(
            f"STALL on partition(s) {by_status[PartitionStatus.STALL]}: the job runs but the cursor did "
            f"not move in {_fmt_s(window_s)} although records are waiting"
        )
        actions.append(f"read the driver log; if it hangs, {STOP} then {DEPLOY}")
    if PartitionStatus.WARN in by_status:
        msgs.append(
            f"falling behind on partition(s) {by_status[PartitionStatus.WARN]}: the cursor moves but the "
            "lag grows"
        )
        actions.append("raise RELAY_MAX_OFFSETS_PER_TRIGGER or the worker's cores, or lower the produce rate")
    if not msgs:
        msgs.append("every partition is caught up or moving" if parts else "no offsets to evaluate")
    return Check("progress", level, "; ".join(msgs), data, "; ".join(actions) or None)


def check_lag(
    offsets: list[dict],
    batches: list[dict],
    now: float,
    window_s: float = 300.0,
    warn_records: int = 100_000,
    warn_seconds: float = 300.0,
    topic: str | None = None,
) -> Check:
    """Lag per partition in records and in seconds at the window's consumption rate (None if it is 0)."""
    moves = cursor_moves(batches, topic or (offsets[0]["topic"] if offsets else ""), now - window_s)
    parts, over = [], []
    for row in offsets:
        p, lag = int(row["partition"]), row.get("lag")
        rate = moves.get(p, 0) / window_s if window_s > 0 else 0.0
        seconds = lag / rate if lag is not None and rate > 0 else None
        parts.append(
            {
                "partition": p,
                "lag": lag,
                "rate_per_s": round(rate, 3),
                "lag_seconds": None if seconds is None else round(seconds, 1),
            }
        )
        if lag is not None and (lag > warn_records or (seconds is not None and seconds > warn_seconds)):
            over.append(f"[{p}] {lag} records ({_fmt_s(seconds)})")
    total = sum(int(d["lag"] or 0) for d in parts)
    data = {"partitions": parts, "total": total, "warn_records": warn_records, "warn_seconds": warn_seconds}
    if over:
        return Check(
            "lag",
            Level.WARN,
            f"lag above {warn_records} records or {_fmt_s(warn_seconds)}: " + ", ".join(over),
            data,
            "check progress; if the job keeps up too slowly raise RELAY_MAX_OFFSETS_PER_TRIGGER or cores",
        )
    return Check("lag", Level.OK, f"total lag {total} records", data)


def check_retention(
    offsets: list[dict],
    retention_ms: int | None,
    produce: dict[int, float | None],
    earliest_rate: dict[int, float | None],
    consume: dict[int, float],
    interval_s: float = 300.0,
    config_error: str | None = None,
) -> Check:
    """Margin (cursor - earliest) per partition and an honest estimate of the time before retention
    overtakes the cursor. Two estimates, the smaller wins, None when neither can be made:

    * age: the record at the cursor was produced about ``lag / produce_rate`` ago and expires
      ``retention.ms`` after it was produced (time-based retention, segment granularity aside);
    * chase: the earliest offset advances at the rate retention removed records over the history,
      the cursor at the consumption rate; the margin closes at the difference.
    """
    retention_s = retention_ms / 1000 if retention_ms is not None and retention_ms >= 0 else None
    parts, invalid, short = [], [], []
    for row in offsets:
        p, cursor, lag = int(row["partition"]), row.get("cursor"), row.get("lag")
        earliest = int(row["earliest"])
        if cursor is None:
            parts.append({"partition": p, "margin": None, "time_left_s": None, "invalidated": False})
            continue
        margin = cursor - earliest
        estimates: list[float] = []
        if margin < 0:
            invalid.append(f"[{p}] cursor {cursor} < earliest {earliest} ({-margin} records gone)")
        elif lag:
            rate_p = produce.get(p)
            if retention_s is not None and rate_p:
                estimates.append(retention_s - lag / rate_p)
            chase = (earliest_rate.get(p) or 0.0) - consume.get(p, 0.0)
            if chase > 0:
                estimates.append(margin / chase)
        left = max(min(estimates), 0.0) if estimates else None
        parts.append(
            {
                "partition": p,
                "margin": margin,
                "time_left_s": None if left is None else round(left, 1),
                "invalidated": margin < 0,
                "produce_rate": produce.get(p),
                "consume_rate": consume.get(p, 0.0),
            }
        )
        if left is not None and left < 2 * interval_s:
            short.append(f"[{p}] {_fmt_s(left)} left (margin {margin} records)")
    data = {
        "partitions": parts,
        "retention_ms": retention_ms,
        "interval_s": interval_s,
        "config_error": config_error,
        "suggested_strategy": "earliest" if invalid else None,
    }
    if invalid:
        return Check(
            "retention",
            Level.CRITICAL,
            "invalidated: retention removed records the pipeline had not read: " + ", ".join(invalid),
            data,
            "run the recovery DAG relay_recover (strategy earliest; dry-run first to see the plan)",
        )
    if short:
        return Check(
            "retention",
            Level.WARN,
            "retention will overtake the cursor within 2 health intervals: " + ", ".join(short),
            data,
            f"make sure the job runs and keeps up ({DEPLOY} if down), or raise the topic's retention.ms",
        )
    note = "" if retention_s is not None else " (retention.ms unknown or infinite)"
    margins = [d["margin"] for d in parts if d["margin"] is not None]
    return Check(
        "retention", Level.OK, f"smallest margin {min(margins) if margins else 'n/a'} records{note}", data
    )


def check_latency(
    batches: list[dict],
    trigger_seconds: float,
    now: float,
    window_s: float = 300.0,
    critical_factor: float = 10.0,
) -> Check:
    """Median and p95 of batch and ledger-commit durations against the trigger interval.

    A batch slower than its trigger means the job can never keep its cadence; slow checkpoint or ledger
    storage shows up here first (it is how the seed jobs died).
    """
    recent = [b for b in batches if b["committed_at"] >= now - window_s]
    dur = [float(b["duration_ms"]) for b in recent]
    com = [float(b["commit_ms"]) for b in recent]
    data = {
        "batches": len(recent),
        "window_s": window_s,
        "trigger_ms": trigger_seconds * 1000,
        "duration_ms": {"median": statistics.median(dur) if dur else None, "p95": _pct(dur, 95)},
        "commit_ms": {"median": statistics.median(com) if com else None, "p95": _pct(com, 95)},
    }
    if not recent:
        return Check("latency", Level.OK, f"no batch committed in the last {_fmt_s(window_s)}", data)
    med, trig = data["duration_ms"]["median"], trigger_seconds * 1000
    text = (
        f"batch median {med:.0f} ms, p95 {data['duration_ms']['p95']:.0f} ms; commit median "
        f"{data['commit_ms']['median']:.0f} ms over {len(recent)} batch(es), trigger {trig:.0f} ms"
    )
    if trig <= 0:
        return Check("latency", Level.OK, text + " (trigger 0: no target)", data)
    action = (
        "check checkpoint and ledger storage latency and the batch size (RELAY_MAX_OFFSETS_PER_TRIGGER); "
        "or raise RELAY_TRIGGER_SECONDS"
    )
    if med > critical_factor * trig:
        return Check(
            "latency",
            Level.CRITICAL,
            f"batches take over {critical_factor:g}x the trigger: {text}",
            data,
            action,
        )
    if med > trig:
        return Check("latency", Level.WARN, f"batches are slower than the trigger: {text}", data, action)
    return Check("latency", Level.OK, text, data)


def check_dead_letters(count: int, previous: dict | None) -> Check:
    """Dead letters and their growth since the previous persisted health report."""
    prev_count = prev_at = None
    if previous is not None:
        body = previous.get("body") or {}
        prev_count = (body.get("data") or {}).get("dead_letters")
        prev_at = previous.get("created_at")
    growth = None if prev_count is None else count - int(prev_count)
    data = {"count": count, "previous": prev_count, "previous_at": prev_at, "growth": growth}
    if growth is not None and growth > 0:
        return Check(
            "dead_letters",
            Level.WARN,
            f"{growth} new dead letter(s) since the previous check ({count} in all)",
            data,
            "inspect the table dead_letters (error column) and fix the producer or the job's parser",
        )
    suffix = "" if growth is not None else " (no previous report to compare)"
    return Check("dead_letters", Level.OK, f"{count} dead letter(s), no growth{suffix}", data)


# ------------------------------------------------------------------------------------- the run
def _guard(name: str, fn: Callable[[], Check]) -> Check:
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


def _inventory(config: RelayConfig, ledger: Ledger) -> Inventory:
    """take_inventory without reconcile; a master that fails mid-way becomes ``master_error``.

    take_inventory catches an unreachable master for the application list but not for the per-driver
    status calls, so a second pass falls back to the ledger's view of live instances.
    """
    from relay.operations.inventory import take_inventory

    try:
        return take_inventory(config, ledger, reconcile=False)
    except SparkError as exc:
        return Inventory(live=ledger.instances(config.pipeline, live_only=True), master_error=str(exc))


def _offsets(config: RelayConfig, ledger: Ledger) -> list[dict]:
    from relay.status import offsets_view

    return offsets_view(config, ledger)


def _retention_ms(config: RelayConfig) -> int | None:
    from relay.kafka_offsets import KafkaOffsets

    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        raw = kafka.topic_config(config.topic).get("retention.ms")
    return int(raw) if raw not in (None, "") else None


def run_health(
    config: RelayConfig,
    ledger: Ledger | None = None,
    persist: bool = True,
    now: float | None = None,
    *,
    offsets: list[dict] | None = None,
    inventory: Inventory | None = None,
    retention_ms: int | None = None,
    thresholds: Thresholds | None = None,
) -> HealthReport:
    """Run every check of ``config.pipeline`` and persist the report (kind ``health``).

    ``offsets`` (rows as :func:`relay.status.offsets_view` returns), ``inventory`` and ``retention_ms``
    replace the live Kafka / Spark master lookups (tests, or a caller that already has them).
    """
    ledger = ledger or Ledger(config.ledger_url)
    th = thresholds or Thresholds()
    now = time.time() if now is None else now
    pipeline = config.pipeline
    checks: list[Check] = []

    inv = inventory if inventory is not None else _inventory(config, ledger)
    instances = ledger.instances(pipeline)
    attempts = {i.id: ledger.attempts(i.id) for i in instances}
    single = _guard("single_instance", lambda: check_single_instance(pipeline, inv, instances, attempts, now))
    checks.append(single)
    run_state = RunState(single.data.get("status", RunState.UNKNOWN.value))
    live_ids = {i.id for i in inv.live}
    checks.append(
        _guard(
            "driver",
            lambda: check_driver(instances, attempts, live_ids, now, th.crash_window_s, th.crash_attempts),
        )
    )

    kafka_error: str | None = None
    live_kafka = offsets is None
    if offsets is None:
        try:
            offsets = _offsets(config, ledger)
        except KafkaError as exc:
            kafka_error = str(exc)
            offsets = []
    batches = [
        b
        for b in ledger.recent_batches(pipeline, limit=2000)
        if b["committed_at"] >= now - max(th.window_s, th.crash_window_s)
    ]
    previous = ledger.reports(pipeline, REPORT_KIND, th.history_reports)
    samples = history_samples(previous)
    current = [a for i in inv.live for a in attempts.get(i.id, []) if a.epoch == i.current_epoch]
    started = max((a.started_at for a in current), default=None)

    if kafka_error:
        checks.append(
            Check(
                "kafka",
                Level.CRITICAL,
                f"Kafka unreachable: {kafka_error}; progress, lag and "
                "retention were not evaluated (the job cannot read either)",
                {"error": kafka_error},
                f"check the broker at {config.kafka_bootstrap}",
            )
        )
    else:
        checks.append(
            _guard(
                "progress",
                lambda: check_progress(
                    offsets, batches, samples, run_state, now, th.window_s, started, config.topic
                ),
            )
        )
        checks.append(
            _guard(
                "lag",
                lambda: check_lag(
                    offsets, batches, now, th.window_s, th.lag_warn_records, th.lag_warn_seconds, config.topic
                ),
            )
        )
        config_error = None
        if retention_ms is None and live_kafka:
            try:
                retention_ms = _retention_ms(config)
            except KafkaError as exc:
                config_error = str(exc)
        consume = {
            p: n / th.window_s for p, n in cursor_moves(batches, config.topic, now - th.window_s).items()
        }
        checks.append(
            _guard(
                "retention",
                lambda: check_retention(
                    offsets,
                    retention_ms,
                    produce_rates(offsets, samples, now),
                    earliest_rates(offsets, samples, now),
                    consume,
                    th.interval_s,
                    config_error,
                ),
            )
        )
    checks.append(
        _guard(
            "latency",
            lambda: check_latency(
                batches, config.trigger_seconds, now, th.window_s, th.latency_critical_factor
            ),
        )
    )
    dead_count = ledger.dead_letter_count(pipeline)
    checks.append(
        _guard("dead_letters", lambda: check_dead_letters(dead_count, previous[0] if previous else None))
    )

    down = run_state is RunState.DOWN
    status = Level.worst([c.level for c in checks])
    if down and status is Level.OK:
        status = Level.WARN
    data = {
        "down": down,
        "run_state": run_state.value,
        "dead_letters": dead_count,
        "offsets": offsets,
        "kafka_error": kafka_error,
    }
    report = HealthReport(pipeline, now, status, checks, data)
    if persist:
        try:
            report.report_id = ledger.save_report(pipeline, REPORT_KIND, status.value, report.to_json())
        except RelayError as exc:
            report.checks.append(
                Check(
                    "persist",
                    Level.CRITICAL,
                    f"the report could not be saved: {exc}",
                    {"error": str(exc)},
                    "check the ledger database",
                )
            )
            report.status = Level.CRITICAL
    return report
