"""The latency section's Kafka-to-Kafka half: produce -> visible to a ``read_committed`` consumer.

examples/kafka_to_kafka (its shuffle, the regroup by source partition, one Kafka transaction per
source partition and batch) copied as the user's package, at Relay's defaults, on its own topics;
caught up on a small warm-up; then the same paced producer as the table half (1,000 records/s,
each a new id, every one a purchase the transform keeps). The witness is confluent-kafka
(librdkafka, a client Relay does not write with) at ``isolation.level=read_committed``, polling the
output every ``POLL_S``: a record's latency is the moment the poll that returned it answered minus
its send time; records of an open or aborted transaction are invisible to it, as downstream.

Baseline: the same transform hand-written on confluent-kafka in its own process, the strongest loop
a user would write for exactly-once output: consume (its topic's partitions assigned, a 50 ms
poll), transform, produce the poll's records in ONE transaction and commit it. It stores no
consumer offsets in the transaction (the broker's group coordinator is not used here), which
makes it a lower bound: a real one does a little more per transaction.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from unittest import mock

from relay.errors import RelayError

from .autoscale_load import EXAMPLE, renamed
from .baselines import Processes
from .cluster import wait_caught_up
from .context import Context
from .example_copy import copy_example
from .latency import FIRST_ID, POLL_S, RATE, WARM_UP, PacedProducer, measure
from .pipeline import variant_config
from .pipeline_backlog import produce_records

BOOTSTRAP_ENV = "KAFKA_TO_KAFKA_BOOTSTRAP"  # the example's: where its sink writes
BASELINE_POLL_MS = 50


# ------------------------------------------------------------------------------------------ pure
def purchase_record(ident: int, _sent_at: float) -> tuple[bytes, bytes]:
    """A purchase the example keeps (positive amount), keyed by its user, like the example's input."""
    user = f"u{ident % 13}"
    event = {"id": ident, "kind": "purchase", "user": user, "amount": 1 + ident % 97 / 4}
    return user.encode(), json.dumps(event).encode()


def purchase_output(value: bytes | None) -> tuple[bytes, bytes] | None:
    """The example's transform, hand-written: a kept purchase -> (user, {"id", "user", "cents"})."""
    try:
        e = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(e, dict) or e.get("kind") != "purchase" or e.get("id") is None:
        return None
    amount = e.get("amount")
    if not isinstance(amount, int | float) or amount <= 0:
        return None
    # Spark's round: the double's shortest decimal form, half up (Python's round: half to even)
    cents = int(Decimal(repr(amount * 100)).quantize(Decimal(1), ROUND_HALF_UP))
    body = {"id": e["id"], "user": e.get("user"), "cents": cents}
    return str(e.get("user")).encode(), json.dumps(body, separators=(",", ":")).encode()


def output_id(value: bytes | None, first_id: int) -> int | None:
    """The measured id an output record carries (None: a warm-up record or not the example's)."""
    try:
        ident = json.loads(value or b"").get("id")
    except (ValueError, AttributeError):
        return None
    return ident if isinstance(ident, int) and ident >= first_id else None


# ------------------------------------------------------------------------ the read_committed witness
class CommittedReader(threading.Thread):
    """confluent-kafka ``read_committed`` on every partition of ``topic`` from its beginning;
    ``seen``: each measured id's first sighting."""

    def __init__(self, bootstrap: str, topic: str, first_id: int) -> None:
        super().__init__(name="bench-latency-committed", daemon=True)
        self.bootstrap, self.topic, self.first_id = bootstrap, topic, first_id
        self.seen: dict[int, float] = {}
        self.polls = 0
        self.errors: list[BaseException] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        try:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"bench-latency-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": int(POLL_S * 1000),  # an empty fetch returns within a poll
                }
            )
        except Exception as exc:  # noqa: BLE001 - reported by the section
            self.errors.append(exc)
            return
        try:
            parts = consumer.list_topics(self.topic, timeout=30).topics[self.topic].partitions
            consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(parts)])
            while not self.stop_event.is_set():
                msgs = consumer.consume(1000, timeout=POLL_S)
                at = time.time()  # after the answer: what it holds was visible by then
                for msg in msgs:
                    if msg.error() is None and (ident := output_id(msg.value(), self.first_id)) is not None:
                        self.seen.setdefault(ident, at)
                self.polls += 1
        except Exception as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            consumer.close()


# --------------------------------------------------------------------------- the hand-written loop
def transactional_loop(spec: dict[str, Any], ready: Any, go: Any, stop: Any, out: Any) -> None:
    """The baseline process (``Processes`` target): consume, transform, one transaction a poll."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = producer = None
    try:
        consumer = Consumer(
            {
                "bootstrap.servers": spec["bootstrap"],
                "group.id": f"bench-k2k-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": spec["poll_ms"],
            }
        )
        consumer.assign([TopicPartition(spec["topic"], p, 0) for p in spec["partitions"]])
        producer = Producer(
            {
                "bootstrap.servers": spec["bootstrap"],
                "transactional.id": f"bench-k2k-{uuid.uuid4().hex[:8]}",
                "linger.ms": 0,
            }
        )
        producer.init_transactions(30)
        ready.put(("ready", spec["partitions"]))
        if not go.wait(spec["timeout_s"]):
            raise TimeoutError("never released")
        rows = transactions = 0
        while not stop.is_set():
            msgs = [m for m in consumer.consume(10_000, timeout=spec["poll_ms"] / 1000) if m.error() is None]
            if not msgs:
                continue
            producer.begin_transaction()
            for msg in msgs:
                if (kept := purchase_output(msg.value())) is not None:
                    producer.produce(spec["url"], value=kept[1], key=kept[0])
            producer.commit_transaction(30)
            rows, transactions = rows + len(msgs), transactions + 1
        out.put(("done", {"rows": rows, "transactions": transactions, "end": time.monotonic()}))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        with contextlib.suppress(Exception):
            ready.put(("error", f"{type(exc).__name__}: {exc}"))
            out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.flush(10)


# ------------------------------------------------------------------------------------------ runs
def _topics(ctx: Context, *names: str) -> list[int]:
    from relay.kafka.offsets import KafkaOffsets

    with KafkaOffsets(ctx.config.kafka_bootstrap) as kafka:
        for name in names:
            kafka.ensure_topic(name, ctx.config.partitions)
        return sorted(kafka.latest(names[0]))


def relay_kafka(ctx: Context, ledger_url: str, seconds: float) -> dict[str, Any]:
    """The example deployed at Relay's defaults, caught up, then one measured window."""
    from relay.artifacts import build_artifact
    from relay.operations.deploy import deploy
    from relay.operations.stop import stop
    from relay.sinks import kafka_clients

    name = "k2k_latency"
    output = f"{name}_out"
    boot = ctx.config.kafka_bootstrap
    cfg = variant_config(ctx.config, name, name, ledger_url, None, ctx.options.trigger_seconds is not None)
    _topics(ctx, name, output)
    code = copy_example(EXAMPLE, ctx.work_dir / "latency" / name, renamed(name, output))
    build_artifact(cfg, f"{name}-v1", pipeline_code=code)
    produce_records(boot, name, [purchase_record(i, 0.0) for i in range(WARM_UP)])
    try:
        with mock.patch.dict(os.environ, {BOOTSTRAP_ENV: boot}):  # handed to the driver by deploy
            ctx.progress(
                f"latency: deploying {name} (examples/kafka_to_kafka, default limit) in cluster mode"
            )
            info = deploy(cfg, version=f"{name}-v1", wait_s=600, progress=ctx.progress)
        wait_caught_up(cfg, ctx.progress, 600.0, "latency kafka_to_kafka warm-up")
        producer = PacedProducer(boot, name, RATE, seconds, FIRST_ID, purchase_record)
        stats = measure(
            producer, CommittedReader(boot, output, FIRST_ID), seconds, ctx.progress, "kafka_to_kafka"
        )
    finally:
        with contextlib.suppress(RelayError):
            stop(cfg, timeout_s=120, progress=ctx.progress)
        kafka_clients.close_all()
    stats["instance_id"] = info.get("instance_id")
    return stats


def baseline_kafka(ctx: Context, seconds: float) -> dict[str, Any]:
    """The hand-written transactional loop on topics of its own, one measured window."""
    name = "k2k_latency_base"
    output = f"{name}_out"
    boot = ctx.config.kafka_bootstrap
    partitions = _topics(ctx, name, output)
    group = Processes(
        "confluent-kafka", boot, name, output, [partitions], True, BASELINE_POLL_MS, target=transactional_loop
    )
    try:
        group.start()
        producer = PacedProducer(boot, name, RATE, seconds, FIRST_ID, purchase_record)
        who = "confluent-kafka transactional loop"
        stats = measure(producer, CommittedReader(boot, output, FIRST_ID), seconds, ctx.progress, who)
        group.stop_event.set()
        stats["consumer"] = group.results()[0]
    finally:
        group.close()
    return stats
