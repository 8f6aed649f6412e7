"""The path users run, with an outside witness: a shuffling Kafka-to-Kafka pipeline (the
``examples/kafka_to_kafka`` package as a user would copy it) on a PostgreSQL ledger, through a task
killed inside its Kafka transaction and an upgrade aborted after green wrote and before green
committed. (On the same example: the short chaos run kills every other part under load;
test_hot_standby.py fails over and scales, two exact handoffs, under load.)

The output is read with confluent-kafka (librdkafka, ``read_committed``), not kafka-python (which
the sink writes with): every kept input position must appear exactly once, nothing else. Issue
#29: with the transform's ``repartition`` the old sink lost 75% of the records, and the aborted
upgrade wrote green's records twice; Relay's own audit said OK both times.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer
from relay.artifacts import build_artifact
from relay.audit import audit, render
from relay.config import PROJECT_ROOT, RelayConfig
from relay.crashpoints import CRASH_ONCE_DIR_ENV, arm_once
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from relay.operations import upgrade_steps as steps
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.operations.upgrade import UpgradeState, open_upgrade
from relay.operations.waits import DrainedWait, wait_in_process
from relay.sinks import kafka_clients as kc
from relay.sinks.kafka_transactional import KafkaTransactionalSink
from relay.spark.first_commit import FirstCommitWait

from tests.conftest import wait_for
from tests.integration.helpers import (
    caught_up,
    example_package,
    pipeline_run,
)
from tests.integration.witness import exactly_once, input_positions, read_committed

pytestmark = pytest.mark.integration

EXAMPLE = PROJECT_ROOT / "examples" / "kafka_to_kafka"
KINDS = ("purchase", "view", "purchase", "refund", "purchase")  # 3 in 5 are purchases


def kept(_key: bytes | None, value: bytes | None) -> bool:
    """What the example's transform keeps: a purchase with a positive amount and an id."""
    try:
        e = json.loads(value or b"")
    except ValueError:
        return False
    return isinstance(e, dict) and e.get("kind") == "purchase" and (e.get("amount") or 0) > 0 and "id" in e


def send(bootstrap: str, topic: str, ids: range, rate: float | None = None) -> None:
    """Events ``ids`` keyed by user (a purchase with amount 0 every 7th: dropped), one value that is
    not JSON; at ``rate`` per second when given."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    t0 = time.monotonic()
    try:
        for sent, n in enumerate(ids, 1):
            e = {"id": n, "kind": KINDS[n % 5], "user": f"u{n % 13}", "amount": 0.0 if n % 7 == 0 else n / 4}
            producer.send(topic, key=e["user"].encode(), value=json.dumps(e).encode())
            if rate and sent % 20 == 0:
                time.sleep(max(0.0, sent / rate - (time.monotonic() - t0)))
        producer.send(topic, key=b"junk", value=b"not json")
        producer.flush(60)
    finally:
        producer.close()


class Stream:
    """Events at ``rate``/s on a thread while the block runs (ids continue from ``first``)."""

    def __init__(self, cfg: RelayConfig, first: int, rate: float = 200.0) -> None:
        self.cfg, self.next, self.rate = cfg, first, rate
        self._on = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while self._on.is_set():
            send(self.cfg.kafka_bootstrap, self.cfg.topic, range(self.next, self.next + 100), self.rate)
            self.next += 100

    def __enter__(self) -> Stream:
        self._on.set()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._on.clear()
        self._thread.join()


@pytest.fixture()
def shuffling(
    stack: RelayConfig, postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[RelayConfig, Path, str]]:
    """The example copied as the user's package (its own pipeline, input and output topics) on the
    PostgreSQL ledger; crash points armed through a folder the drivers and tasks see."""
    name = f"k{uuid.uuid4().hex[:8]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=postgres_url)
    package = example_package(EXAMPLE, cfg.data_dir / f"{cfg.pipeline}-project", cfg, "kafka_to_kafka")
    output = f"{cfg.topic}_out"
    code = package / "pipeline.py"
    text = code.read_text()
    assert 'OUTPUT_TOPIC = "kafka_to_kafka_purchases"' in text and "df.repartition(PARSE_TASKS)" in text
    code.write_text(text.replace('OUTPUT_TOPIC = "kafka_to_kafka_purchases"', f'OUTPUT_TOPIC = "{output}"'))
    monkeypatch.setenv("KAFKA_TO_KAFKA_BOOTSTRAP", cfg.kafka_bootstrap)
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(tmp_path))
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    KafkaTransactionalSink(cfg.kafka_bootstrap, output).create_topic(cfg.partitions)
    try:
        with pipeline_run(cfg):
            yield cfg, package, output
    finally:
        kc.close_all()


def witness(cfg: RelayConfig, ledger: Ledger, output: str) -> int:
    """Caught up, then every kept input position once in the output (read by confluent-kafka)."""
    wait_for("the pipeline to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    want = input_positions(cfg.kafka_bootstrap, cfg.topic, kept)
    exactly_once(read_committed(cfg.kafka_bootstrap, output), want)
    return len(want)


def test_a_shuffling_kafka_pipeline_writes_each_record_once_through_a_task_kill_and_an_abort(
    shuffling: tuple[RelayConfig, Path, str],
) -> None:
    cfg, package, output = shuffling
    faults = Path(os.environ[CRASH_ONCE_DIR_ENV])
    ledger = Ledger(cfg.ledger_url)
    v1, v2 = (f"{cfg.pipeline}-k{i}" for i in (1, 2))
    for version in (v1, v2):
        build_artifact(cfg, version, pipeline_code=package)

    # A backlog, and the first task to reach its Kafka commit dies inside the transaction.
    arm_once(str(faults), "kafka_sink.before_commit")
    send(cfg.kafka_bootstrap, cfg.topic, range(0, 2000))
    blue = deploy(cfg, version=v1, wait_s=300)["instance_id"]
    assert witness(cfg, ledger, output) > 0
    assert not (faults / "kafka_sink.before_commit").exists(), "no task reached the armed crash point"
    assert "not narrow" in _driver_log(cfg, ledger, blue), "the repartition was not seen as a shuffle"

    # An upgrade aborted after green's tasks wrote and before green's ledger commit. (Upgrades under
    # load on this example, each the same exact handoff: test_hot_standby.py's scale up and down;
    # kills of every part under load: the short chaos run on it, test_chaos.py.)
    op = open_upgrade(cfg, v2, "latest", 300.0, 240.0, False)
    op = steps.start_green(cfg, ledger, op["id"])
    green = op["data"]["green_id"]
    ready = FirstCommitWait(cfg, ledger, green, reached=FirstCommitWait.WARM)
    wait_in_process(ready, 300, "green's warm-up")
    steps.green_ready(cfg, ledger, op["id"], None)
    op = steps.hand_off(cfg, ledger, op["id"])
    assert op["state"] == UpgradeState.GREEN_STARTING.value, op
    wait_in_process(DrainedWait(ledger, blue), 120, "blue's drain to H")  # blue writes no more
    arm_once(str(faults), "pipeline.before_ledger_commit")
    send(cfg.kafka_bootstrap, cfg.topic, range(2000, 2600))
    wait_for("green to write and die", lambda: not (faults / "pipeline.before_ledger_commit").exists(), 180)
    assert all(lease.next_offset == lease.start_offset for lease in ledger.leases(green)), (
        "green committed in the ledger: the abort would not be the one this test is about"
    )
    op = steps.abort(cfg, ledger, op["id"], "test: green died after its tasks wrote")
    assert op["state"] == UpgradeState.ABORTED.value
    assert ledger.instance(green).state is InstanceState.FENCED
    witness(cfg, ledger, output)

    report = audit(cfg, ledger, deep=True, sink=True)  # relay audit --deep: it reads the sink too
    assert report.ok, render(report.to_json())
    assert report.sink is not None and report.sink.kind == "kafka" and report.sink.counts["ok"] > 0
    assert [x["graceful"] for x in stop(cfg, timeout_s=120)["stopped"]] == [True]


def _driver_log(cfg: RelayConfig, ledger: Ledger, instance_id: int) -> str:
    from relay.spark.launcher import driver_output

    return driver_output(cfg, ledger.instance(instance_id))
