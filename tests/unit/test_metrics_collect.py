"""The collector over a real SQLite ledger (Kafka unreachable): what a scrape says while an operation
is in progress, after one ended, and of the last health report."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.config import RelayConfig, load_config
from relay.ledger.store import Ledger
from relay.metrics.serve import exposition
from relay.operations.upgrade_state import ALL_TERMINAL

from tests.conftest import free_port


@pytest.fixture()
def cfg(tmp_path: Path) -> RelayConfig:
    """Pipeline ``p`` with a ledger in ``tmp_path``; Kafka on a port nothing listens on."""
    return load_config(
        {
            "RELAY_DATA_DIR": str(tmp_path),
            "RELAY_PIPELINE": "p",
            "RELAY_TOPIC": "p",
            "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        }
    )


def test_a_scrape_names_operations_in_progress_ended_ones_and_health_levels(cfg: RelayConfig) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    done = ledger.open_operation("p", "recovery", "APPROVED", {}, {}, ALL_TERMINAL)
    ledger.move_operation(done["id"], "EXECUTED")
    ledger.open_operation("p", "upgrade", "GREEN_WARMING", {}, {}, ALL_TERMINAL)
    checks = [{"name": "lag", "level": "WARN", "data": {}}, {"name": "driver", "level": "CRITICAL"}]
    ledger.save_report("p", "health", "CRITICAL", {"checks": checks})
    ledger.close()
    lines = exposition(lambda: [cfg])[0].decode().splitlines()
    assert 'relay_operations_in_progress{kind="upgrade",pipeline="p",state="GREEN_WARMING"} 1.0' in lines
    assert 'relay_operations_total{kind="recovery",pipeline="p",state="EXECUTED"} 1.0' in lines
    assert 'relay_health_level{check="lag",pipeline="p"} 1.0' in lines
    assert 'relay_health_level{check="driver",pipeline="p"} 2.0' in lines
    assert 'relay_pipeline_up{pipeline="p"} 0.0' in lines  # Kafka is away: said, not a failed scrape


def test_an_upgrade_seen_done_has_its_pause_even_before_its_report_is_saved(cfg: RelayConfig) -> None:
    """The upgrade's report is saved after its move to DONE: a scrape between the two must still
    show the pause (a Prometheus test saw DONE with no pause series)."""
    ledger = Ledger(cfg.ledger_url, create=True)
    op = ledger.open_operation("p", "upgrade", "GREEN_STARTING", {}, {"green_id": 2}, ALL_TERMINAL)
    ledger.move_operation(op["id"], "DRAINING_BLUE", green_first_commit_s=3.25)
    ledger.move_operation(op["id"], "DONE")  # no report saved yet
    ledger.close()
    lines = exposition(lambda: [cfg])[0].decode().splitlines()
    assert 'relay_operations_total{kind="upgrade",pipeline="p",state="DONE"} 1.0' in lines
    assert 'relay_upgrade_last_pause_seconds{pipeline="p"} 3.25' in lines
