"""The deep audit against a real broker: transaction holes are not missing, retention needs a gap.

Only the embedded stack's Kafka broker runs here (the audit needs no Spark); ledgers are built by
hand on SQLite and PostgreSQL, so each test states what the pipeline applied.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from kafka import KafkaProducer
from relay.audit import audit
from relay.cli import main
from relay.config import RelayConfig, load_config
from relay.errors import KafkaError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.snapshot import read_snapshot
from relay.ledger.store import Ledger
from relay.sinks import ledger_messages_tables as counter_tables
from relay_dev.stack import LocalStack, Part
from sqlalchemy import func, select

from tests.conftest import wait_for
from tests.counter_batches import counted
from tests.integration.conftest import private_data_dir, stack_env
from tests.ledger_builder import LedgerBuilder

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)


class BrokerOnly(LocalStack):
    """The embedded stack reduced to its Kafka broker."""

    def parts(self, with_postgres: bool | None = None) -> list[Part]:
        return [Part.KAFKA]


@pytest.fixture(scope="module")
def broker() -> Iterator[RelayConfig]:
    data_dir = private_data_dir("broker-")
    config = load_config(stack_env(data_dir))
    local = BrokerOnly(config, progress=log.info)
    try:
        local.up()
        yield config
    finally:
        local.down()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture()
def cfg(broker: RelayConfig, backend: str, request: pytest.FixtureRequest) -> RelayConfig:
    """A pipeline and a one-partition topic of its own, the ledger on the chosen backend."""
    name = f"a{uuid.uuid4().hex[:8]}"
    url = (
        request.getfixturevalue("postgres_url")
        if backend == "postgres"
        else f"sqlite:///{broker.data_dir / (name + '.db')}"
    )
    config = broker.with_(pipeline=name, topic=name, ledger_url=url, partitions=1)
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        kafka.ensure_topic(config.topic, 1)
    return config


def send(cfg: RelayConfig, count: int, start: int = 0, producer: KafkaProducer | None = None) -> list[int]:
    """Send ``count`` records to partition 0; return their offsets as the broker acknowledged them."""
    own = producer is None
    producer = producer or KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap)
    futures = [
        producer.send(cfg.topic, key=str(i).encode(), value=str(i).encode(), partition=0)
        for i in range(start, start + count)
    ]
    producer.flush()
    offsets = [f.get(timeout=30).offset for f in futures]
    if own:
        producer.close()
    return offsets


def test_deep_audit_counts_transaction_markers_and_aborted_records_as_holes(cfg: RelayConfig) -> None:
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, transactional_id=f"audit-{cfg.topic}")
    producer.init_transactions()
    committed: list[int] = []
    for txn, count in enumerate((5, 3, 5)):
        producer.begin_transaction()
        offsets = send(cfg, count, 10 * txn, producer)
        if txn == 1:
            producer.abort_transaction()  # these records exist in the log but are never committed
        else:
            producer.commit_transaction()
            committed += offsets
    producer.close()
    latest = committed[-1] + 2  # the last commit marker follows the last record
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        wait_for("the last commit marker", lambda: kafka.latest(cfg.topic)[0] == latest, timeout=30)
    holes = latest - len(committed)  # three transaction markers and three aborted records
    assert holes == 6

    ledger = Ledger(cfg.ledger_url, create=True)
    b = LedgerBuilder(ledger, cfg.pipeline, cfg.topic)
    inst = b.instance()
    b.lease(inst, 0, 0, latest)  # read_committed read to the end: every committed record applied...
    lost = committed[6]
    b.rows(inst, 0, [o for o in committed if o != lost])  # ...but one

    shallow = audit(cfg, ledger)
    assert (
        not shallow.ok and shallow.partitions[0].missing == holes + 1 and shallow.partitions[0].holes is None
    )
    deep = audit(cfg, ledger, deep=True)
    p0 = deep.partitions[0]
    assert not deep.ok, deep.to_json()
    assert (p0.holes, p0.missing, p0.examples["missing"]) == (holes, 1, [[lost, lost + 1]])

    b.rows(inst, 0, [lost])
    deep = audit(cfg, ledger, deep=True)
    assert deep.ok, deep.to_json()
    assert (deep.partitions[0].holes, deep.partitions[0].applied_once) == (holes, len(committed))
    ledger.close()


def test_deep_audit_after_retention_accepts_a_declared_gap_only(cfg: RelayConfig) -> None:
    assert send(cfg, 30) == list(range(30))
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.delete_records(cfg.topic, {0: 20})
        assert kafka.earliest(cfg.topic) == {0: 20}
    ledger = Ledger(cfg.ledger_url, create=True)

    # The recovery's way: the old lease closed at its cursor, [10, 20) recorded lost, a new lease.
    recovered = LedgerBuilder(ledger, cfg.pipeline, cfg.topic)
    old, new = recovered.instance(), recovered.instance()
    recovered.lease(old, 0, 0, 10, end=10)
    recovered.gap(0, 10, 20)
    recovered.lease(new, 0, 20, 30)
    recovered.rows(old, 0, range(10))
    recovered.rows(new, 0, range(20, 30))
    report = audit(cfg, ledger, deep=True)
    assert report.ok, report.to_json()
    assert (report.partitions[0].declared_lost, report.partitions[0].earliest) == (10, 20)

    # The same rows with the cursor jumped over [10, 20) and nothing declared: missing.
    silent = LedgerBuilder(ledger, cfg.pipeline + "b", cfg.topic)
    inst = silent.instance()
    silent.lease(inst, 0, 0, 30)
    silent.rows(inst, 0, [*range(10), *range(20, 30)])
    report = audit(cfg.with_(pipeline=silent.pipeline), ledger, deep=True)
    p0 = report.partitions[0]
    assert not report.ok
    assert (p0.missing, p0.holes, p0.examples["missing"]) == (10, 0, [[10, 20]])
    ledger.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_deep_audit_refuses_to_judge_behind_an_open_transaction(cfg: RelayConfig) -> None:
    """read_committed stops at the last stable offset: the audit says why instead of hanging."""
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, transactional_id=f"open-{cfg.topic}")
    producer.init_transactions()
    producer.begin_transaction()
    pending = send(cfg, 3, 0, producer)
    ledger = Ledger(cfg.ledger_url, create=True)
    b = LedgerBuilder(ledger, cfg.pipeline, cfg.topic)
    inst = b.instance()
    b.lease(inst, 0, 0, pending[-1] + 1)  # a read_uncommitted reader went past the open transaction
    with pytest.raises(KafkaError, match=rf"made no progress at offset 0 \(needed up to {pending[-1] + 1}\)"):
        audit(cfg, ledger, deep=True, stall_s=2)
    producer.abort_transaction()
    producer.close()
    report = audit(cfg, ledger, deep=True)
    assert report.ok and report.partitions[0].holes == 3, report.to_json()  # the aborted records
    ledger.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_cli_audit_exits_0_on_a_stopped_pipeline_and_3_on_a_missing_record(
    cfg: RelayConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    send(cfg, 20)
    ledger = Ledger(cfg.ledger_url, create=True)
    b = LedgerBuilder(ledger, cfg.pipeline, cfg.topic)
    inst = b.instance()
    b.lease(inst, 0, 0, 12)  # stopped after 12 records: 8 unread
    b.rows(inst, 0, range(12))
    for name, value in {
        "RELAY_DATA_DIR": str(cfg.data_dir),
        "RELAY_KAFKA_BOOTSTRAP": cfg.kafka_bootstrap,
        "RELAY_LEDGER_URL": cfg.ledger_url,
        "RELAY_PIPELINE": cfg.pipeline,
        "RELAY_TOPIC": cfg.topic,
    }.items():
        monkeypatch.setenv(name, value)

    assert main(["audit"]) == 0
    text = capsys.readouterr().out
    assert "8 offset(s) at or after the cursors are not read yet" in text and "OK" in text.splitlines()[-1]
    assert main(["audit", "--deep", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["ok"], result["mode"], result["totals"]["unread"], result["totals"]["holes"]) == (
        True,
        "deep",
        8,
        0,
    )

    b.delete_rows(0, [5])
    assert main(["audit"]) == 3
    text = capsys.readouterr().out
    assert "partition 0 missing: [5, 6)" in text and "NOT OK" in text.splitlines()[-1]
    ledger.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_deep_audit_of_100k_records_streams_through_the_broker(cfg: RelayConfig) -> None:
    """Scale check against a real broker (prints the time; the bound is the broker read)."""
    n = 100_000
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, linger_ms=20, batch_size=256 * 1024)
    for _ in range(n):
        producer.send(cfg.topic, value=b"x", partition=0)
    producer.flush()
    producer.close()
    ledger = Ledger(cfg.ledger_url, create=True)
    b = LedgerBuilder(ledger, cfg.pipeline, cfg.topic)
    inst = b.instance()
    b.lease(inst, 0, 0, n)
    b.rows(inst, 0, (o for o in range(n) if o != 54321))
    said: list[str] = []
    t0 = time.perf_counter()
    report = audit(cfg, ledger, deep=True, progress=said.append)
    seconds = time.perf_counter() - t0
    p0 = report.partitions[0]
    assert (p0.applied_once, p0.missing, p0.holes, p0.examples["missing"]) == (n - 1, 1, 0, [[54321, 54322]])
    assert said[0] == f"deep audit {cfg.topic}[0]: reading {n:,} offsets [0, {n})"
    print(f"\ndeep audit of {n:,} records: {seconds:.1f}s; progress lines: {said}")
    ledger.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_audit_snapshot_on_postgres_is_read_only_and_does_not_see_a_concurrent_commit(
    cfg: RelayConfig,
) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    b = LedgerBuilder(ledger, cfg.pipeline, cfg.topic)
    inst = b.instance()
    b.rows(inst, 0, range(3))
    m = counter_tables.messages
    count = select(func.count()).select_from(m).where(m.c.pipeline == cfg.pipeline)
    with read_snapshot(ledger) as conn:
        assert conn.exec_driver_sql("SHOW transaction_read_only").scalar() == "on"
        before = conn.execute(count).scalar_one()
        b.rows(inst, 0, [3])
        during = conn.execute(count).scalar_one()
    assert (before, during, counted(ledger, cfg.pipeline)) == (3, 3, 4)
    ledger.close()
