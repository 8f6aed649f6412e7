"""What the health tests share: a real SQLite ledger, a stand-in for Kafka's offsets, and helpers that
build instances, attempts and batches through the real ledger and commit protocol.

Each health test module declares its own three-line fixtures (``config``, ``ledger``, ``kafka``) on
top of these builders: a conftest would hand such generic names to every unit test module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import relay.kafka.offsets
import relay.operations.status
from relay.config import RelayConfig
from relay.health import HealthReport
from relay.ledger import schema as s
from relay.ledger.models import Attempt, Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory
from relay.spark.rest import AppState, SparkApp

from tests.counter_batches import counter_batch, row

T = "events"
P = "p"


def make_config(data_dir: Path) -> RelayConfig:
    """Pipeline ``p`` on topic ``events`` (2 partitions, 1-second trigger), ledger under ``data_dir``."""
    return RelayConfig(data_dir=data_dir, pipeline=P, topic=T, partitions=2, trigger_seconds=1.0)


def open_ledger(config: RelayConfig) -> Iterator[Ledger]:
    """A fresh SQLite ledger for the test, closed after it."""
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


class FakeKafka:
    """Stands in for KafkaOffsets so that relay.operations.status.offsets_view runs unchanged on
    chosen offsets."""

    earliest_offsets: dict[int, int] = {}
    latest_offsets: dict[int, int] = {}
    retention_ms: int | None = None
    record_ms: dict[int, int] = {}  # timestamp (epoch ms) of the record at each partition's cursor

    def __init__(self, bootstrap: str, timeout_s: float = 10) -> None:
        self.bootstrap = bootstrap

    def __enter__(self) -> FakeKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def earliest(self, topic: str) -> dict[int, int]:
        return dict(self.earliest_offsets)

    def latest(self, topic: str) -> dict[int, int]:
        return dict(self.latest_offsets)

    def record_timestamps(
        self, topic: str, offsets: dict[int, int], wait_s: float | None = None
    ) -> dict[int, int | None]:
        return {p: self.record_ms.get(p) for p in offsets}

    def topic_config(self, topic: str) -> dict[str, str]:
        return {} if self.retention_ms is None else {"retention.ms": str(self.retention_ms)}


def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> type[FakeKafka]:
    """Install a FakeKafka subclass (both partitions empty) where offsets_view and health look it up."""

    class K(FakeKafka):
        earliest_offsets = {0: 0, 1: 0}
        latest_offsets = {0: 0, 1: 0}

    monkeypatch.setattr(relay.operations.status, "KafkaOffsets", K)
    monkeypatch.setattr(relay.kafka.offsets, "KafkaOffsets", K)
    return K


def new_instance(
    ledger: Ledger,
    state: InstanceState | None = None,
    version: str = "v1",
    color: Color = Color.BLUE,
    leases: bool = True,
) -> Instance:
    """An instance named like the launcher names it, holding partitions 0 and 1 from offset 0."""
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, P, version, color, "/nonexistent", "")
        ledger.set_instance(inst.id, conn, app_name=f"relay-{P}-{inst.id}", submission_id=f"driver-{inst.id}")
        if leases and not ledger.pipeline_leases(P, conn):
            for part in (0, 1):
                ledger.open_lease(conn, inst, T, part, 0)
        if state is not None:
            ledger.set_instance(inst.id, conn, state=state)
        return ledger.instance(inst.id, conn)


def batch(
    ledger: Ledger,
    attempt,
    batch_id: int,
    start: dict[int, int],
    end: dict[int, int],
    poison: int = 0,
    started_at: float | None = None,
) -> None:
    """One real batch of the counter through the commit protocol (keys are counters; ``poison``
    negative keys)."""
    records = [row(T, p, o, value=b"v") for p in end for o in range(start[p], end[p])]
    for i in range(poison):
        records[i] = row(T, records[i]["partition"], records[i]["offset"], b"-1", b"bad")
    counter_batch(ledger, attempt, batch_id, {T: start}, {T: end}, records, started_at=started_at)


def app(inst_id: int | str, pipeline: str = P) -> SparkApp:
    return SparkApp(
        id=f"app-{inst_id}",
        name=f"relay-{pipeline}-{inst_id}",
        state=AppState.RUNNING,
        start_time_ms=0,
        cores=1,
    )


def running(ledger: Ledger, *instances: Instance, extra_apps: list[SparkApp] | None = None) -> Inventory:
    live = [ledger.instance(i.id) for i in instances]
    return Inventory(live=live, apps=[app(i.id) for i in live] + list(extra_apps or []))


def part(report: HealthReport, check: str, partition: int) -> dict:
    return next(d for d in report.check(check).data["partitions"] if d["partition"] == partition)


def backdate_start(ledger: Ledger, attempt: Attempt, seconds: float) -> Attempt:
    """Make ``attempt`` look started ``seconds`` earlier (a driver whose session took that long)."""
    with ledger.tx() as conn:
        conn.execute(
            s.attempts.update()
            .where(s.attempts.c.id == attempt.id)
            .values(started_at=attempt.started_at - seconds)
        )
    return ledger.attempt(attempt.id)
