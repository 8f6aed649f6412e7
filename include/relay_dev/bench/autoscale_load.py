"""The autoscale section's workload: the shuffling Kafka-to-Kafka example with a heavier parse, and
its events at a steady rate (see :mod:`.autoscale` for why each)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT, RelayConfig

from .example_copy import copy_example

EXAMPLE = PROJECT_ROOT / "examples" / "kafka_to_kafka"
ROUNDS = 1000  # sha256 rounds an event costs on an executor (~0.3 ms here): see .autoscale's docstring

PARSE = '    events = df.repartition(PARSE_TASKS).select("topic", "partition", "offset", v)\n'
WORK = f"""    from pyspark.sql.functions import udf

    @udf("int")
    def _work(value):  # the bench's heavier parse: {ROUNDS} sha256 rounds an event, always >= 0
        import hashlib

        h = bytes(value or b"")
        for _ in range({ROUNDS}):
            h = hashlib.sha256(h).digest()
        return h[0]

"""


def package(root: Path, name: str, output: str) -> Path:
    """The example copied as the user's package, reading topic ``name`` and writing ``output``."""
    heavier = WORK + PARSE.replace(
        "df.repartition(PARSE_TASKS)", "df.repartition(PARSE_TASKS).where(_work(F.col('value')) >= 0)"
    )
    return copy_example(EXAMPLE, root / f"kafka_to_kafka_{name}", [(PARSE, heavier), *renamed(name, output)])


def renamed(name: str, output: str) -> list[tuple[str, str]]:
    """The example's lines that make it pipeline ``name`` on topic ``name`` writing ``output``."""
    return [
        ('NAME = "kafka_to_kafka"', f'NAME = "{name}"'),
        ('TOPIC = "kafka_to_kafka"', f'TOPIC = "{name}"'),
        ('OUTPUT_TOPIC = "kafka_to_kafka_purchases"', f'OUTPUT_TOPIC = "{output}"'),
    ]


class Events:
    """The example's JSON events (ids continue across calls), spread evenly over the partitions by
    id so every read task has the same share. confluent-kafka: a producer that costs the machine
    little beside the pipeline it loads (kafka-python's ~30k msg/s would take most of a core)."""

    def __init__(self, cfg: RelayConfig) -> None:
        from confluent_kafka import Producer

        self.cfg, self.next = cfg, 0
        self.producer = Producer({"bootstrap.servers": cfg.kafka_bootstrap, "linger.ms": 5, "acks": "all"})
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def burst(self, count: int) -> None:
        self._send(count, None)

    def start_step(self, rate: float, seconds: float) -> None:
        """``rate`` events a second for ``seconds`` on a thread."""
        self._thread = threading.Thread(target=self._send, args=(int(rate * seconds), rate), daemon=True)
        self._thread.start()

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _send(self, count: int, rate: float | None) -> None:
        from relay_dev.chaos.workloads import record

        t0 = time.monotonic()
        for i in range(1, count + 1):
            if self._stop.is_set():
                break
            key, value = record("kafka", self.next, poison=False)
            part = self.next % self.cfg.partitions
            while True:
                try:
                    self.producer.produce(self.cfg.topic, value, key, part, on_delivery=self._delivered)
                    break
                except BufferError:  # the local queue is full: let it drain
                    self.producer.poll(0.05)
            self.next += 1
            if i % 100 == 0:
                self.producer.poll(0)
                if rate and (ahead := t0 + i / rate - time.monotonic()) > 0:
                    self._stop.wait(ahead)
        if self.producer.flush(60):
            self.errors.append("records still queued after a 60 s flush")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=90)
            self._thread = None
