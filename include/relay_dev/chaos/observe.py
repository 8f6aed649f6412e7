"""What the chaos run watches: committed batches, the load it produces, what the broker kept.

Why its own read connection: the ledger is locked on purpose during the run, and ``Ledger.tx()`` on
SQLite begins every transaction with ``BEGIN IMMEDIATE`` (a writer's lock). Plain reads (SQLite's
WAL readers, PostgreSQL's ACCESS SHARE) are never blocked, so commit times keep coming while the
driver is stuck.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relay.config import RelayConfig
from relay.ledger import schema as s
from relay.sinks import ledger_messages_tables as counter
from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from relay_dev.chaos.workloads import record

Progress = Callable[[str], None]


def read_engine(url: str) -> Engine:
    """An engine that only reads: no BEGIN IMMEDIATE, short busy timeout, never a lock of its own."""
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 5})
    return create_engine(url, pool_pre_ping=True, pool_size=1, max_overflow=1)


@dataclass(frozen=True)
class Commit:
    """One committed batch, as the ledger's ``batches`` table has it (wall-clock seconds)."""

    instance_id: int
    attempt_id: int
    batch_id: int
    started_at: float
    committed_at: float
    rows_read: int


class CommitWatcher:
    """Polls the ``batches`` table; keeps every commit and the pipeline's instance states."""

    def __init__(self, config: RelayConfig, interval_s: float = 0.5) -> None:
        self.config = config
        self.interval_s = interval_s
        self.engine = read_engine(config.ledger_url)
        self.commits: list[Commit] = []
        self.errors = 0
        self._last_id = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-commits", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        self.poll()  # the last commits, after the thread ended
        self.engine.dispose()

    @property
    def last_commit_at(self) -> float | None:
        return self.commits[-1].committed_at if self.commits else None

    def poll(self) -> None:
        b = s.batches
        q = (
            select(b.c.id, b.c.instance_id, b.c.attempt_id, b.c.batch_id, b.c.started_at)
            .add_columns(b.c.committed_at, b.c.rows_read)
            .where(b.c.pipeline == self.config.pipeline, b.c.id > self._last_id)
            .order_by(b.c.id)
        )
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(q).all()
        except SQLAlchemyError:
            self.errors += 1  # the table may not exist before the first deploy; locked reads retry
            return
        for r in rows:
            self._last_id = max(self._last_id, int(r[0]))
            self.commits.append(Commit(int(r[1]), int(r[2]), int(r[3]), float(r[4]), float(r[5]), int(r[6])))

    def instance_states(self) -> list[tuple[int, str, str | None]]:
        """(id, state, error) of every instance of the pipeline, oldest first; [] when unreadable."""
        i = s.instances
        q = select(i.c.id, i.c.state, i.c.error).where(i.c.pipeline == self.config.pipeline).order_by(i.c.id)
        try:
            with self.engine.connect() as conn:
                return [(int(r[0]), str(r[1]), r[2]) for r in conn.execute(q).all()]
        except SQLAlchemyError:
            return []

    def next_commit_after(self, t: float) -> float | None:
        """Seconds from ``t`` to the commit of the first batch that *started* after ``t``.

        Started after, not committed after: a batch already running when the fault hit proves nothing
        about recovery (it may commit a moment later, or be replayed).
        """
        later = [c.committed_at for c in self.commits if c.started_at >= t]
        return round(min(later) - t, 2) if later else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)


class ChaosProducer:
    """Counter messages at a steady rate, every N-th a poison record; survives broker restarts.

    Keeps the (partition, offset) the broker acknowledged for every record, so that the end of the
    run can tell records the broker lost (acked, then gone after a SIGKILL) from records Relay lost.
    """

    def __init__(
        self,
        config: RelayConfig,
        rate: float,
        poison_every: int,
        progress: Progress,
        workload: str = "counter",
    ) -> None:
        self.config = config
        self.workload = workload
        self.rate = rate
        self.poison_every = poison_every
        self.progress = progress
        self.sent = 0
        self.poison = 0
        self.failed = 0
        self.recreated = 0
        self.acked: dict[tuple[int, int], bytes] = {}
        self.first_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=60)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "poison": self.poison,
            "acked": len(self.acked),
            "failed": self.failed,
            # neither acknowledged nor failed when the producer closed (in flight across a broker kill)
            "unconfirmed": max(0, self.sent - len(self.acked) - self.failed),
            "producer_restarts": self.recreated,
            "first_error": self.first_error,
        }

    def _new_producer(self) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(
            bootstrap_servers=self.config.kafka_bootstrap,
            acks="all",
            linger_ms=5,
            max_block_ms=5000,
            request_timeout_ms=10000,
            delivery_timeout_ms=30000,
        )

    def _failed(self, exc: BaseException) -> None:
        self.failed += 1
        self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"[:300]

    def _run(self) -> None:
        from relay.kafka.offsets import KafkaOffsets

        with KafkaOffsets(self.config.kafka_bootstrap) as kafka:
            kafka.ensure_topic(self.config.topic, self.config.partitions)
        producer = None
        t0 = time.monotonic()
        n = 0
        while not self._stop.is_set():
            try:
                if producer is None:
                    producer = self._new_producer()
                poison = self.poison_every > 0 and n % self.poison_every == self.poison_every - 1
                key, value = record(self.workload, n, poison)
                future = producer.send(self.config.topic, key=key, value=value)
                future.add_callback(lambda md, v=value: self.acked.__setitem__((md.partition, md.offset), v))
                future.add_errback(self._failed)
                n += 1
                self.sent += 1
                self.poison += int(poison)
            except Exception as exc:  # noqa: BLE001 - a dead broker: back off, then a fresh producer
                self._failed(exc)
                if producer is not None:
                    try:
                        producer.close(timeout=1)
                    except Exception:  # noqa: BLE001 - closing a broken client must not end the load
                        pass
                    producer = None
                    self.recreated += 1
                self._stop.wait(0.5)
                continue
            ahead = t0 + n / self.rate - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)
        if producer is not None:
            try:
                producer.flush(timeout=30)
                producer.close(timeout=5)
            except Exception as exc:  # noqa: BLE001 - report, the run goes on to its audit
                self._failed(exc)


def read_topic(config: RelayConfig, timeout_s: float = 120) -> dict[tuple[int, int], bytes]:
    """Every record the broker holds now, (partition, offset) -> value (read_committed)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=config.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    out: dict[tuple[int, int], bytes] = {}
    try:
        tps = [
            TopicPartition(config.topic, p) for p in sorted(consumer.partitions_for_topic(config.topic) or ())
        ]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, recs in consumer.poll(timeout_ms=1000, max_records=10_000).items():
                for r in recs:
                    out[(tp.partition, r.offset)] = r.value
    finally:
        consumer.close()
    return out


def broker_check(config: RelayConfig, acked: dict[tuple[int, int], bytes]) -> dict[str, Any]:
    """Did the broker keep what it acknowledged, and does Kafka still hold what Relay applied?

    noida-db snapshots its log about once a second, so a SIGKILL loses the last second of
    acknowledged records and the offsets are handed out again. Relay cannot apply a record twice or
    skip one by offset there, but it may have applied a record that is no longer in Kafka, and the
    record now at that offset is never read (its cursor is already past it).
    """
    topic_now = read_topic(config)
    lost = {k for k, v in acked.items() if topic_now.get(k) != v}
    engine = read_engine(config.ledger_url)
    m, d = counter.messages, s.dead_letters
    applied: dict[tuple[int, int], bytes] = {}
    try:
        with engine.connect() as conn:
            if counter.tables_exist(conn):  # the counter's rows (another pipeline's sink has none)
                q = select(m.c.partition, m.c.offset, m.c.value).where(m.c.pipeline == config.pipeline)
                for p, o, v in conn.execute(q).all():
                    applied[(int(p), int(o))] = (v or "").encode()
            for p, o, v in conn.execute(
                select(d.c.partition, d.c.offset, d.c.value).where(d.c.pipeline == config.pipeline)
            ).all():
                applied[(int(p), int(o))] = bytes(v or b"")
    finally:
        engine.dispose()
    replaced = sorted(k for k, v in applied.items() if k in topic_now and topic_now[k] != v)
    return {
        "records_in_topic": len(topic_now),
        "acked_by_broker": len(acked),
        "acked_then_lost_by_broker": len(lost),
        "applied_but_replaced_in_kafka": len(replaced),
        "replaced_examples": [list(k) for k in replaced[:10]],
        "lost_examples": [list(k) for k in sorted(lost)[:10]],
    }
