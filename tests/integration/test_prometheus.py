"""A real Prometheus (Debian's package) scrapes ``relay metrics serve`` on the test stack: its query
for a partition's lag follows a load step (up, then back to 0) and an upgrade under load (two live
instances during the handoff, the pause, green ACTIVE, the lag back to 0), the applied count grows
by what was produced, and a health check's findings appear. Both processes run on free loopback
ports with their files in the test's folder, and are stopped by PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from relay.config import RelayConfig
from relay.config.env import config_env
from relay.health.run import run_health
from relay.kafka.producer import produce
from relay.ledger.engine import create_ledger
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.upgrade import upgrade

from tests.conftest import free_port, stop_process, wait_for
from tests.integration.helpers import pipeline_run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed"),
]
RECORDS = 6000
UPGRADE_LOAD = 3000  # records at 100/s while the upgrade runs


@pytest.fixture()
def scraped(stack: RelayConfig, tmp_path: Path) -> Iterator[tuple[RelayConfig, str]]:
    """A pipeline of its own (batches of 500, a 1 s trigger: a load step takes a while to drain),
    its exporter and a Prometheus scraping it every second; (config, Prometheus' URL)."""
    name = f"m{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{stack.data_dir / (name + '.db')}"
    create_ledger(url)
    cfg = stack.with_(
        pipeline=name, topic=name, ledger_url=url, max_offsets_per_trigger=500, trigger_seconds=1.0
    )
    exporter_port, prom_port = free_port(), free_port()
    env = {**os.environ, **config_env(cfg)}
    relay = [sys.executable, "-m", "relay.cli", "metrics", "serve", "--port", str(exporter_port)]
    log = (tmp_path / "exporter.log").open("wb")
    exporter = subprocess.Popen(relay, env=env, stdout=log, stderr=subprocess.STDOUT)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: relay\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        with pipeline_run(cfg):
            yield cfg, f"http://127.0.0.1:{prom_port}"
    finally:
        stop_process(prom)
        stop_process(exporter)
        log.close()


def query(prom: str, expr: str) -> float | None:
    """The single value of an instant query (None: no series)."""
    reply = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    result = reply["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_prometheus_sees_the_lag_rise_and_fall_and_the_records_applied(
    scraped: tuple[RelayConfig, str],
) -> None:
    cfg, prom = scraped
    p = f'pipeline="{cfg.pipeline}"'
    produce(cfg.kafka_bootstrap, cfg.topic, 100, None, partitions=cfg.partitions)
    deploy(cfg, wait_s=300)
    wait_for(
        "Prometheus to scrape the pipeline", lambda: query(prom, f"relay_pipeline_up{{{p}}}") == 1.0, 120, 1
    )
    wait_for(
        "the first records applied",
        lambda: (query(prom, f"relay_applied_records_total{{{p}}}") or 0) >= 100,
        120,
        1,
    )
    t0 = time.time()
    produce(cfg.kafka_bootstrap, cfg.topic, RECORDS, None, partitions=cfg.partitions)
    peak = f"max_over_time(sum(relay_lag_records{{{p}}})[60s:1s])"
    wait_for("the lag to rise in Prometheus", lambda: (query(prom, peak) or 0) > 1000, 60, 1)
    wait_for(
        "the lag to fall back to 0", lambda: query(prom, f"sum(relay_lag_records{{{p}}})") == 0.0, 180, 1
    )
    window = int(time.time() - t0) + 5
    assert (query(prom, f"increase(relay_applied_records_total{{{p}}}[{window}s])") or 0) > RECORDS * 0.8
    ledger = Ledger(cfg.ledger_url)
    committed = lambda: float(len(ledger.recent_batches(cfg.pipeline, 100_000)))  # noqa: E731
    wait_for(
        "the batch count scraped", lambda: query(prom, f"relay_batches_total{{{p}}}") == committed(), 30, 1
    )
    run_health(cfg)  # persisted: its findings become series
    wait_for(
        "the health findings", lambda: query(prom, f'relay_health_level{{{p}, check="lag"}}') == 0.0, 60, 1
    )
    assert query(prom, f'relay_lag_seconds{{{p}, partition="0"}}') == 0.0

    # An upgrade under a steady load: Prometheus follows the handoff and the lag through it.
    t1 = time.time()
    load = threading.Thread(
        target=produce, args=(cfg.kafka_bootstrap, cfg.topic, UPGRADE_LOAD, 100.0), kwargs={"partitions": 3}
    )
    load.start()
    try:
        result = upgrade(cfg, "v2", grace_s=240, drain_timeout_s=240)
    finally:
        load.join()
    assert result["state"] == "DONE" and result["duplicates"] == 0 and result["gaps"] == 0, result
    wait_for(
        "green ACTIVE in Prometheus",
        lambda: query(prom, f'relay_instance_info{{{p}, version="v2", state="ACTIVE"}}') == 1.0,
        60,
        1,
    )
    wait_for(
        "the lag back to 0 after the upgrade",
        lambda: query(prom, f"sum(relay_lag_records{{{p}}})") == 0.0,
        180,
        1,
    )
    window = int(time.time() - t1) + 5
    assert query(prom, f"max_over_time(relay_instances_live{{{p}}}[{window}s])") == 2.0  # blue and green
    assert (query(prom, f'max_over_time(relay_lag_records{{{p}, partition="0"}}[{window}s])') or 0) > 0
    wait_for(  # a scrape may time out on a loaded machine: the next one brings it
        "the upgrade DONE in Prometheus",
        lambda: query(prom, f'relay_operations_total{{{p}, kind="upgrade", state="DONE"}}') == 1.0,
        60,
        1,
    )
    pause: float | None = None

    def pause_scraped() -> bool:  # the value the wait saw: a second query may meet a failed scrape
        nonlocal pause
        pause = query(prom, f"relay_upgrade_last_pause_seconds{{{p}}}")
        return pause is not None

    # a failed scrape marks every series stale until the next one: wait for a scrape that has it
    wait_for("the upgrade's pause in Prometheus", pause_scraped, 60, 1)
    assert pause is not None and 0 < pause < 60, pause
    applied = query(prom, f"increase(relay_applied_records_total{{{p}}}[{window}s])") or 0
    assert applied > UPGRADE_LOAD * 0.8, applied  # one counter across blue and green
