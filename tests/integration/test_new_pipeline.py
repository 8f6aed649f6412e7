"""``relay new pipeline`` on the path a new user takes: the package it writes, unchanged, is built,
deployed on the embedded stack and writes each kept input record exactly once (counted from outside
with confluent-kafka ``read_committed``), then stops gracefully.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer
from relay.artifacts import build_artifact
from relay.config import RelayConfig, load_config
from relay.config.env import config_env
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.pipeline.scaffold import new_pipeline

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, pipeline_run
from tests.integration.witness import exactly_once, input_positions, read_committed

pytestmark = pytest.mark.integration


def kept(_key: bytes | None, value: bytes | None) -> bool:
    """What the written transform keeps: an id and a positive amount."""
    try:
        e = json.loads(value or b"")
    except ValueError:
        return False
    return isinstance(e, dict) and e.get("id") is not None and (e.get("amount") or 0) > 0


def test_a_new_pipeline_deploys_as_written_and_writes_each_record_once(
    stack: RelayConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = f"n{uuid.uuid4().hex[:8]}"
    done = new_pipeline(name, tmp_path, stack.data_dir / f"{name}.toml", current=None)
    monkeypatch.setenv(f"{name.upper()}_BOOTSTRAP", stack.kafka_bootstrap)
    # As `relay --pipeline NAME` reads it: the stack's settings and the declaration just written.
    cfg = load_config({**config_env(stack), "RELAY_PIPELINES_FILE": done["pipelines_file"]}, pipeline=name)
    assert (cfg.topic, cfg.pipeline_code) == (name, Path(done["folder"]))
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    for n in range(300):
        producer.send(cfg.topic, json.dumps({"id": n, "amount": (n % 5) - 1.5}).encode())  # 3 in 5 kept
    producer.send(cfg.topic, b"not json")
    producer.flush(60)
    producer.close()
    ledger = Ledger(cfg.ledger_url)
    with pipeline_run(cfg):
        build_artifact(cfg, "v1")  # the declared folder, as `relay build --version v1` does
        deploy(cfg, version="v1", wait_s=300)
        wait_for("the new pipeline to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
        want = input_positions(cfg.kafka_bootstrap, cfg.topic, kept)
        assert len(want) == 180
        exactly_once(read_committed(cfg.kafka_bootstrap, done["output_topic"]), want)
        assert stop(cfg, timeout_s=120)["stopped"][0]["graceful"]
