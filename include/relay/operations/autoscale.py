"""The lag policy: the health check moves a pipeline to more or fewer executors by the exact handoff.

Why on the health check's history: each check persists the lag of every partition in seconds, so
"behind by more than ``lag_seconds`` in each of the last ``runs`` checks" needs no new measurement
and survives restarts; a scale is ``relay.operations.scale`` (an upgrade to the same code: the pause
is about one batch, nothing applied twice). Up when behind within the policy's ``max_executors`` and
the cluster's room (the upgrade's plan says whether green fits); down when the last ``idle_runs``
checks found the pipeline caught up and its batches busy less than ``busy_below`` of that time.
Every decision, a hold included, is recorded (report kind ``autoscale``) and shown by health.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select

from relay.config import AutoscalePolicy, RelayConfig
from relay.errors import OperationError
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.operations.upgrade_state import ALL_TERMINAL

REPORT_KIND = "autoscale"
UP, DOWN, HOLD = "up", "down", "hold"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Decision:
    action: str  # up, down or hold
    executors: int  # now
    target: int  # after (= executors on hold)
    why: str
    wanted_more: bool = False  # a hold although behind: at max_executors, or green would not fit

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def worst_lag_s(report_body: dict[str, Any]) -> float | None:
    """The worst partition's lag in seconds in one persisted health report (None: not measured)."""
    for check in report_body.get("checks", []):
        if check.get("name") == "lag":
            seconds = [p.get("lag_seconds") for p in (check.get("data") or {}).get("partitions", [])]
            known = [float(x) for x in seconds if x is not None]
            return max(known) if known else None
    return None


def decide(policy: AutoscalePolicy, lags: list[float | None], executors: int, busy: float | None) -> Decision:
    """The policy on the newest-first lags of the last checks, the executors now and the batches'
    busy fraction over the idle window (None: unknown). Pure: the table in the unit tests."""
    behind = lags[: policy.runs]
    if len(behind) == policy.runs and all(lag is not None and lag > policy.lag_seconds for lag in behind):
        if executors >= policy.max_executors:
            why = f"behind > {policy.lag_seconds:g}s in {policy.runs} checks, at max_executors"
            return Decision(HOLD, executors, executors, why, wanted_more=True)
        why = f"behind > {policy.lag_seconds:g}s in the last {policy.runs} checks"
        return Decision(UP, executors, executors + 1, why)
    idle = lags[: policy.idle_runs]
    caught_up = len(idle) == policy.idle_runs and all(lag == 0 for lag in idle)
    if caught_up and executors > policy.min_executors and busy is not None and busy < policy.busy_below:
        why = f"caught up in {policy.idle_runs} checks, batches busy {busy:.0%} < {policy.busy_below:.0%}"
        return Decision(DOWN, executors, executors - 1, why)
    return Decision(HOLD, executors, executors, "within the policy")


def busy_fraction(ledger: Ledger, pipeline: str, since: float, now: float) -> float | None:
    """The share of ``[since, now]`` the pipeline's batches ran (their durations summed)."""
    if now - since <= 0:
        return None
    b = s.batches
    with ledger.tx() as conn:
        ran_ms = conn.execute(
            select(func.coalesce(func.sum(b.c.duration_ms), 0)).where(
                b.c.pipeline == pipeline, b.c.committed_at >= since
            )
        ).scalar()
    return min(float(ran_ms or 0) / 1000 / (now - since), 1.0)


def autoscale(config: RelayConfig, progress: Progress = lambda _: None, act: bool = True) -> dict[str, Any]:
    """Judge the pipeline by its policy, record the decision, and scale when it says so (``act``)."""
    from relay.operations.scale import executors_of, running_resources, scale

    policy = config.autoscale
    if policy is None:
        return {"pipeline": config.pipeline, "action": "off"}
    ledger = Ledger(config.ledger_url)
    if ledger.in_progress(config.pipeline, ALL_TERMINAL):
        return _record(ledger, config, Decision(HOLD, 0, 0, "an operation is in progress"), None)
    try:
        _active, resources = running_resources(config, ledger)
    except OperationError as exc:  # not exactly one ACTIVE instance: nothing to scale now
        return _record(ledger, config, Decision(HOLD, 0, 0, str(exc)), None)
    executors = executors_of(resources)
    reports = ledger.reports(config.pipeline, "health", max(policy.runs, policy.idle_runs))
    lags = [worst_lag_s(r["body"]) for r in reports]
    busy = None
    if len(reports) >= policy.idle_runs:
        busy = busy_fraction(
            ledger, config.pipeline, reports[policy.idle_runs - 1]["created_at"], time.time()
        )
    decision = decide(policy, lags, executors, busy)
    if decision.action == HOLD or not act:
        return _record(ledger, config, decision, None)
    plan = scale(config, decision.target, plan=True)
    if plan.get("blocked"):
        why = f"{decision.why}; can't: {'; '.join(plan['blocked'])}"
        held = Decision(HOLD, executors, executors, why, wanted_more=True)
        return _record(ledger, config, held, None)
    progress(f"autoscale {config.pipeline}: {decision.why}: {executors} -> {decision.target} executors")
    result = scale(config, decision.target, progress=progress)
    return _record(ledger, config, decision, result)


def _record(
    ledger: Ledger, config: RelayConfig, decision: Decision, result: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"pipeline": config.pipeline, **decision.to_json()}
    if result is not None:
        keys = ("state", "green_id", "duplicates", "gaps", "green_first_commit_s")
        body["scale"] = {k: result.get(k) for k in keys}
    ledger.save_report(config.pipeline, REPORT_KIND, decision.action, body)
    return body


__all__ = ["Decision", "autoscale", "busy_fraction", "decide", "worst_lag_s"]
