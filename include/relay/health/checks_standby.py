"""The ``standby`` finding of a pipeline with ``standby = "hot"``: its standby, readiness, failovers.

OK while a standby waits READY (or warms up); WARN without one (the pipeline is back to the master's
relaunch, 15-70 s, until one is started: the health check with self-heal starts it) and for a
failover since the previous check, so a person reads why the active died, and for a standby on the
active's worker while another worker could hold it (one host loss would take both). Never CRITICAL: the
pipeline runs either way, and the ``driver`` and ``progress`` findings page when it does not.
"""

from __future__ import annotations

from typing import Any

from relay.health.report import Check, Level
from relay.ledger.models import Instance, InstanceState


def check_standby(
    instances: list[Instance],
    failovers: list[dict],
    started: dict | None,
    since: float,
    wanted: bool = True,
    shares_worker: bool = False,
) -> Check:
    """``failovers`` newest first (relay.operations.standby.failovers); ``started``: what this
    check's self-heal did (relay.operations.standby.ensure_standby), None without self-heal;
    ``since``: the previous check's time (a failover after it is news); ``wanted``: the pipeline is
    configured with ``standby = "hot"`` (else only its failovers are news); ``shares_worker``: the
    standby's driver runs on the active's worker although another live worker declares room for it
    (relay.spark.placement)."""
    from relay.protocol.failover import HOT_STANDBY

    waiting = [i for i in instances if i.role == HOT_STANDBY and i.state.standby]
    recent = [f for f in failovers if float(f.get("failed_over_at", 0)) > since]
    data: dict[str, Any] = {
        "instance": waiting[0].id if waiting else None,
        "state": waiting[0].state.value if waiting else None,
        "failovers": failovers,
        "started": started,
        "shares_worker": shares_worker,
    }
    parts = []
    if waiting:
        ready = waiting[0].state is InstanceState.READY
        parts.append(f"hot standby instance {waiting[0].id} {'READY' if ready else 'warming up'}")
        if shares_worker:
            parts.append(
                "on the active's worker: losing that host takes both (the next relay standby moves it)"
            )
    elif not wanted:
        parts.append('no hot standby configured (standby = "hot" in the pipelines file)')
    else:
        why = (started or {}).get("reason")
        parts.append("no hot standby" + (f": {why}" if why else ""))
    for f in recent:
        parts.append(f"failover: instance {f['from_instance']} -> {f['to_instance']} ({f['reason']})")
    level = Level.OK if (waiting or not wanted) and not recent and not shares_worker else Level.WARN
    action = (
        "read the failed-over driver's log (why it died); relay standby starts a standby now"
        if level is Level.WARN
        else None
    )
    return Check("standby", level, "; ".join(parts), data, action)
