"""The shipped Prometheus alerting rules are valid (``promtool check rules``) and fire on what they say."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT

RULES = PROJECT_ROOT / "include" / "relay" / "metrics" / "rules.yml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) is not installed")


def alert(at: str, name: str, summary: str | None = None, **labels: str) -> dict:
    """One expectation of promtool's rule tests: ``name`` firing at ``at`` (none when no summary)."""
    fired = [{"exp_labels": {"pipeline": "p", **labels}, "exp_annotations": {"summary": summary}}]
    return {"eval_time": at, "alertname": name, "exp_alerts": fired if summary else []}


# promtool's unit test format (YAML; JSON is YAML): series over time, the alerts expected when.
CASES = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": 'relay_lag_records{pipeline="p", topic="p", partition="0"}', "values": "500x30"},
                {"series": 'relay_applied_records_total{pipeline="p"}', "values": "1000x30"},
                {"series": 'relay_health_level{pipeline="p", check="progress"}', "values": "0 0 2 2 2"},
                {
                    "series": 'relay_operations_total{pipeline="p", kind="failover", state="DONE"}',
                    "values": "0 0 0 1 1 1",
                },
            ],
            "alert_rule_test": [
                alert(
                    "20m",
                    "RelayNoProgress",
                    "p has records waiting and applied none in 10 minutes",
                    severity="critical",
                ),
                alert("1m", "RelayHealthCritical"),
                alert(
                    "4m",
                    "RelayHealthCritical",
                    "p: a health finding is CRITICAL (relay health says which)",
                    severity="critical",
                ),
                alert(
                    "4m",
                    "RelayFailover",
                    "p failed over to its hot standby: read why the active died",
                    severity="warning",
                    kind="failover",
                    state="DONE",
                ),
            ],
        }
    ],
}


def test_the_shipped_rules_are_valid() -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout


def test_the_rules_fire_on_a_stuck_pipeline_a_critical_finding_and_a_failover(tmp_path: Path) -> None:
    tests = tmp_path / "rules_test.yml"
    tests.write_text(json.dumps({"rule_files": [str(RULES)], **CASES}))
    out = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
