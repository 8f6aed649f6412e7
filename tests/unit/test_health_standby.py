"""Health's ``standby`` finding: what an operator of a pipeline with ``standby = "hot"`` is told."""

from __future__ import annotations

import pytest
from relay.health.checks_standby import check_standby
from relay.health.report import Level
from relay.ledger.models import Color, Instance, InstanceState


def inst(i: int, state: InstanceState, role: str | None = None) -> Instance:
    return Instance(i, "p", "v1", Color.BLUE, state, "", 1, False, None, f"relay-p-{i}", None, 0.0, 0.0, role)


FAILOVER = {
    "from_instance": 1,
    "to_instance": 2,
    "reason": "no heartbeat of instance 1 for 3.0s",
    "failed_over_at": 100.0,
}


def test_a_pipeline_without_a_standby_configured_is_told_of_failovers_only() -> None:
    old = check_standby([inst(2, InstanceState.ACTIVE)], [FAILOVER], None, 150.0, wanted=False)
    assert old.level is Level.OK and "no hot standby configured" in old.message
    news = check_standby([inst(2, InstanceState.ACTIVE)], [FAILOVER], None, 50.0, wanted=False)
    assert news.level is Level.WARN and "failover: instance 1 -> 2" in news.message


@pytest.mark.parametrize(
    ("situation", "instances", "failovers", "started", "since", "level", "says"),
    [
        (
            "a standby READY",
            [inst(1, InstanceState.ACTIVE), inst(2, InstanceState.READY, "hot-standby")],
            [],
            None,
            0.0,
            Level.OK,
            "hot standby instance 2 READY",
        ),
        (
            "a standby warming up",
            [inst(1, InstanceState.ACTIVE), inst(2, InstanceState.STANDBY, "hot-standby")],
            [],
            None,
            0.0,
            Level.OK,
            "warming up",
        ),
        (
            "no standby, none could start",
            [inst(1, InstanceState.ACTIVE)],
            [],
            {"reason": "no room"},
            0.0,
            Level.WARN,
            "no hot standby: no room",
        ),
        (
            "an upgrade's green is not a standby",
            [inst(1, InstanceState.ACTIVE), inst(2, InstanceState.READY)],
            [],
            None,
            0.0,
            Level.WARN,
            "no hot standby",
        ),
        (
            "a failover since the previous check",
            [inst(2, InstanceState.ACTIVE), inst(3, InstanceState.READY, "hot-standby")],
            [FAILOVER],
            None,
            50.0,
            Level.WARN,
            "failover: instance 1 -> 2",
        ),
        (
            "an older failover is history",
            [inst(2, InstanceState.ACTIVE), inst(3, InstanceState.READY, "hot-standby")],
            [FAILOVER],
            None,
            150.0,
            Level.OK,
            "hot standby instance 3 READY",
        ),
    ],
)
def test_the_standby_finding_per_situation(
    situation: str,
    instances: list[Instance],
    failovers: list[dict],
    started: dict | None,
    since: float,
    level: Level,
    says: str,
) -> None:
    check = check_standby(instances, failovers, started, since)
    assert (check.level, says in check.message) == (level, True), (situation, check.message)
    assert check.level is Level.OK or check.action
    assert check.data["failovers"] == failovers
