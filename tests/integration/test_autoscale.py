"""The lag policy on the users' path (the shuffling Kafka-to-Kafka example, a PostgreSQL ledger):
a load step the pipeline can't keep up with on one executor makes the health checks' lag rise, the
policy scales it up by the exact handoff; caught up and idle, it scales it back down. Every input
record is in the output once, read by confluent-kafka (``read_committed``). ~5 min: make test-long;
the decisions themselves are tests/unit/test_autoscale_policy.py's table."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.artifacts import build_artifact
from relay.config import AutoscalePolicy, RelayConfig
from relay.health import run_health
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from relay.operations.autoscale import autoscale, worst_lag_s
from relay.operations.deploy import deploy
from relay.operations.stop import stop

from tests.conftest import wait_for
from tests.integration.test_user_path_kafka import send, shuffling, witness  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow]
POLICY = AutoscalePolicy(max_executors=2, lag_seconds=1.0, runs=2, idle_runs=2, busy_below=0.95)


def _active(ledger: Ledger, cfg: RelayConfig) -> int:
    live = ledger.instances(cfg.pipeline, live_only=True)
    return next(i.id for i in live if i.state is InstanceState.ACTIVE)


def _scaled(decision: dict, action: str, target: int) -> None:
    assert decision["action"] == action and decision["target"] == target, f"{decision['why']}: {decision}"
    done = decision["scale"]
    assert done["state"] == "DONE" and done["duplicates"] == 0 and done["gaps"] == 0, decision


def test_the_lag_policy_scales_up_when_behind_and_down_when_idle_each_record_once(
    shuffling: tuple[RelayConfig, Path, str],  # noqa: F811 - the fixture, imported above
) -> None:
    cfg, package, output = shuffling
    cfg = cfg.with_(autoscale=POLICY, max_offsets_per_trigger=200, trigger_seconds=1.0)
    ledger = Ledger(cfg.ledger_url)
    build_artifact(cfg, f"{cfg.pipeline}-a1", pipeline_code=package)
    send(cfg.kafka_bootstrap, cfg.topic, range(0, 200))
    deploy(cfg, version=f"{cfg.pipeline}-a1", wait_s=300)
    try:
        send(cfg.kafka_bootstrap, cfg.topic, range(200, 6200))  # 30 batches of 200: behind
        wait_for(
            "the health check to see the pipeline behind",
            lambda: (worst_lag_s(run_health(cfg, persist=False).to_json()) or 0) > POLICY.lag_seconds,
            timeout=120,
            interval=1,
        )
        held = autoscale(cfg)  # one check behind is not a trend
        assert held["action"] == "hold", held
        for _ in range(POLICY.runs):
            run_health(cfg)
        up = autoscale(cfg)
        _scaled(up, "up", 2)
        wide = ledger.instance(_active(ledger, cfg))
        assert wide.resources is not None and wide.resources["cores_max"] == 2, wide.resources
        witness(cfg, ledger, output)  # caught up, each record once

        for _ in range(POLICY.idle_runs):
            run_health(cfg)
        down = autoscale(cfg)
        _scaled(down, "down", 1)
        narrow = ledger.instance(_active(ledger, cfg))
        assert narrow.resources is not None and narrow.resources["cores_max"] == 1
        send(cfg.kafka_bootstrap, cfg.topic, range(6200, 6400))
        witness(cfg, ledger, output)

        shown = {c.name: c for c in run_health(cfg).checks}["autoscale"]
        assert shown.level.value == "OK" and "down 2 -> 1" in shown.message, shown.message
    finally:
        stop(cfg, timeout_s=120)
