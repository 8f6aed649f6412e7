"""``relay produce`` against a real noida-db broker that restarts, cleanly or after SIGKILL, mid-run.

Only the embedded stack's broker runs here. Every test reads the topic back with its own consumer
and counts each counter: exactly once, none missing. A broker killed with SIGKILL loses records it
had acknowledged (it keeps its log in a file written from time to time); before the read-back and
resend, the producer aborted there with ``OutOfOrderSequenceNumberError``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from relay.config import RelayConfig, load_config
from relay.errors import KafkaError
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import POISON_KEY, highest_counter, produce
from relay_dev.stack import LocalStack, Part, pid_alive, session_pids

from tests.conftest import wait_for
from tests.integration.conftest import private_data_dir, stack_env

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)


class BrokerOnly(LocalStack):
    """The embedded stack reduced to its Kafka broker."""

    def parts(self, with_postgres: bool | None = None) -> list[Part]:
        return [Part.KAFKA]


@pytest.fixture(scope="module")
def broker() -> Iterator[tuple[RelayConfig, BrokerOnly]]:
    data_dir = private_data_dir("producer-")
    config = load_config(stack_env(data_dir))
    local = BrokerOnly(config, progress=log.info)
    try:
        local.up()
        yield config, local
    finally:
        local.down()
    shutil.rmtree(data_dir, ignore_errors=True)


def topic_records(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` now, read with a consumer of its own (read_committed)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed"
    )
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 120
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "topic not read within 120 s"
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
    finally:
        consumer.close()
    return out


def counters(bootstrap: str, topic: str) -> Counter[int]:
    return Counter(int(r.key) for r in topic_records(bootstrap, topic) if r.key != POISON_KEY)


def kill_broker(local: BrokerOnly) -> None:
    """SIGKILL the broker (by the PID the stack recorded) and everything in its session."""
    pid = local.status()["parts"][0]["pid"]
    assert pid, "the broker runs"
    for target in [pid, *session_pids(pid)]:
        os.kill(target, signal.SIGKILL)
    wait_for("the killed broker to be gone", lambda: not pid_alive(pid) and not session_pids(pid), timeout=30)


def in_background(**kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = produce(**kwargs)
        except Exception as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="produce", daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.slow  # make test-long (the suite stays near 30 min)
@pytest.mark.parametrize("how", ["clean", "sigkill"])
def test_every_counter_arrives_once_across_a_broker_restart(
    broker: tuple[RelayConfig, BrokerOnly], how: str
) -> None:
    cfg, local = broker
    topic, count = f"p{uuid.uuid4().hex[:8]}", 40_000
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, 3)
        thread, outcome = in_background(
            bootstrap=cfg.kafka_bootstrap, topic=topic, count=count, rate=8000.0, poison=3
        )
        wait_for("a quarter of the run in the topic", lambda: sum(kafka.latest(topic).values()) >= count // 4)
    if how == "sigkill":
        kill_broker(local)
    else:
        local.down()
    assert thread.is_alive(), "the broker went down while the producer was still sending"
    local.up()
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    log.info("%s restart: %s", how, result)
    assert (result["sent"], result["first"], result["last"], result["poison"]) == (count, 0, count - 1, 3)

    seen = counters(cfg.kafka_bootstrap, topic)
    assert sorted(seen) == list(range(count)), f"missing: {sorted(set(range(count)) - set(seen))[:10]}"
    assert [n for n, times in seen.items() if times > 1] == []
    poison = sorted(r.value for r in topic_records(cfg.kafka_bootstrap, topic) if r.key == POISON_KEY)
    assert poison == [b"poison-0", b"poison-1", b"poison-2"]


def test_a_fifty_digit_key_does_not_move_the_next_counters(broker: tuple[RelayConfig, BrokerOnly]) -> None:
    cfg, _ = broker
    topic = f"k{uuid.uuid4().hex[:8]}"
    first = produce(cfg.kafka_bootstrap, topic, 30, None)
    stranger = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap)
    huge = b"9" * 50
    for p in range(3):  # the stranger's records are the newest in every partition
        for key in (huge, b"12345678901234567", b" 99 ", b"+77"):
            stranger.send(topic, key=key, value=key, partition=p)
    stranger.flush()
    stranger.close()

    assert highest_counter(cfg.kafka_bootstrap, topic) == 29
    second = produce(cfg.kafka_bootstrap, topic, 10, None)
    assert (first["first"], first["last"], second["first"], second["last"]) == (0, 29, 30, 39)
    assert max(counters(cfg.kafka_bootstrap, topic).elements()) == int(huge)  # it is there, and ignored


def test_counters_continue_after_records_of_an_older_producer(broker: tuple[RelayConfig, BrokerOnly]) -> None:
    """Records without the producer's header (written before it existed) still count, in canonical form."""
    cfg, _ = broker
    topic = f"l{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, 3)
    older = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap)
    for n in range(100):
        older.send(topic, key=str(n).encode(), value=str(n).encode())
    older.send(topic, key=b"9" * 50, value=b"9" * 50)  # beyond 2^63-1: never a counter
    older.flush()
    older.close()
    assert highest_counter(cfg.kafka_bootstrap, topic) == 99
    assert produce(cfg.kafka_bootstrap, topic, 5, None)["first"] == 100


@pytest.mark.slow  # make test-long
def test_a_broker_that_never_returns_fails_the_run_within_the_delivery_timeout(
    broker: tuple[RelayConfig, BrokerOnly],
) -> None:
    cfg, local = broker
    topic, count = f"d{uuid.uuid4().hex[:8]}", 100_000
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, 3)
        thread, outcome = in_background(
            bootstrap=cfg.kafka_bootstrap, topic=topic, count=count, rate=5000.0, delivery_timeout_s=5.0
        )
        wait_for("the first records in the topic", lambda: sum(kafka.latest(topic).values()) > 0)
    local.down()
    stopped = time.monotonic()
    try:
        thread.join(timeout=180)
        assert not thread.is_alive(), "the producer kept waiting for a broker that is gone"
        elapsed = time.monotonic() - stopped
    finally:
        local.up()  # the module's other tests need it back
    error = outcome.get("error")
    assert isinstance(error, KafkaError), outcome
    assert cfg.kafka_bootstrap in str(error) and "\n" not in str(error)
    log.info("gave up %.1f s after the broker stopped: %s", elapsed, error)
    assert elapsed < 120
