"""``relay health`` exits 2 on a CRITICAL report (so cron or CI can alert), 0 otherwise, with the summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import relay.health
from relay.cli import main
from relay.config import load_config
from relay.health import Check, HealthReport, Level
from relay.ledger.store import Ledger

from tests.conftest import free_port


@pytest.fixture()
def unreachable_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """RELAY_* pointing at a real ledger and at a broker and a Spark master that do not listen."""
    env = {
        "RELAY_DATA_DIR": str(tmp_path),
        "RELAY_PIPELINE": "orders",
        "RELAY_TOPIC": "orders",
        "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "RELAY_SPARK_MASTER_UI_URL": f"http://127.0.0.1:{free_port()}",
        "RELAY_SPARK_REST_URL": f"http://127.0.0.1:{free_port()}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    url = load_config().ledger_url
    Ledger(url, create=True).close()
    return url


def test_critical_report_exits_2_and_prints_the_summary(unreachable_stack, capsys) -> None:
    code = main(["--json", "health"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines()[0] == "orders: CRITICAL"
    assert "Spark master unreachable" in err and "Kafka unreachable" in err
    assert json.loads(out)["status"] == "CRITICAL"
    ledger = Ledger(unreachable_stack)
    try:
        assert ledger.reports("orders", "health", 1)[0]["status"] == "CRITICAL"  # persisted as well
    finally:
        ledger.close()


@pytest.mark.parametrize("level", [Level.OK, Level.WARN])
def test_ok_and_warn_exit_0(unreachable_stack, capsys, monkeypatch, level: Level) -> None:
    check = Check("lag", level, "total lag 12 records" if level is Level.OK else "lag above 10 records")
    report = HealthReport("orders", time.time(), level, [check])
    asked: list[bool] = []
    monkeypatch.setattr(relay.health, "run_health", lambda cfg, heal: asked.append(heal) or report)
    assert main(["--json", "health", "--heal"]) == 0
    capsys.readouterr()
    assert main(["--json", "health"]) == 0
    assert asked == [True, False]  # the CLI relaunches nothing unless asked; the DAG follows RELAY_HEAL
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"orders: {level.value}"
    assert json.loads(out)["status"] == level.value
