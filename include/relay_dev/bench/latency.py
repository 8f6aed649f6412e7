"""Section ``latency``: how long a new record takes from its producer to a reader of the sink (a
table here; Kafka output read_committed in :mod:`.latency_kafka`).

The example (examples/json_upsert at Relay's default read limit) deployed on its own topic and caught
up on a warm-up backlog of ``WARM_UP`` records (a running pipeline's code is warm: with 100, the
Kafka half's first large batch cost twice a steady one a row and its backlog filled half the
window); then a producer sends 1,000 records/s for 60 s (``--quick``: 20 s), paced to a schedule
(record i at start + i/rate, no drift), each a new id, its send time kept. A poller reads the sink
table every 20 ms (``SELECT id ... WHERE id >= the lowest id not seen yet``: rows of different partitions
commit in different transactions, so a plain ``id > last_seen`` could skip one); a row's latency is
the time the query that first returned it answered minus its produce time (an upper bound).
Reported: p50, p95, p99, max and the count seen, which must equal the count produced.

Baseline: the same window on b2 (baselines.py: kafka-python, COPY + one INSERT .. SELECT .. ON
CONFLICT per poll) running as a continuous consumer in its own process, poll timeout 50 ms.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from relay.errors import OperationError, RelayError
from relay.polling import poll

from .baselines import Processes
from .cluster import wait_caught_up
from .context import Context
from .pipeline import deployed
from .pipeline_backlog import TABLE, json_record, produce_records, sink_database
from .results import figure
from .stats import fmt_number, percentile

RATE = 1000.0  # records/s
SECONDS, QUICK_SECONDS = 60.0, 20.0
POLL_S = 0.02  # the table reader's period
B2_POLL_MS = 50  # the continuous baseline's poll timeout
FIRST_ID = 1_000_000_000  # every measured record is a new id, above the warm-up's
WARM_UP = 10_000  # records caught up on before the window (see the docstring)
DRAIN_S = 60.0  # after the producer's last record, how long to wait for the last rows


# ------------------------------------------------------------------------------------------ pure
def due_at(t0: float, i: int, rate: float) -> float:
    """When record ``i`` is due: a fixed schedule from ``t0`` (a late send does not shift the rest)."""
    return t0 + i / rate


def latency_stats(produced: int, seen: Iterable[tuple[float, float]]) -> dict[str, Any]:
    """(produced at, first seen at) pairs -> latency percentiles in ms and the counts."""
    lat = sorted((s - p) * 1000 for p, s in seen)
    return {
        "produced": produced,
        "seen": len(lat),
        "missing": produced - len(lat),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else None,
        "min_ms": lat[0] if lat else None,
    }


# ------------------------------------------------------------------------------ producer, poller
def upsert_record(ident: int, sent_at: float) -> tuple[bytes, bytes]:
    """json_upsert's record: a new id whose ``score`` is its send time (read back from the table)."""
    return str(ident).encode(), json.dumps({"id": ident, "name": f"lat{ident}", "score": sent_at}).encode()


class PacedProducer(threading.Thread):
    """``rate`` new-id records/s for ``seconds`` with kafka-python; ``sent_at`` keeps each id's send
    time, ``encode`` makes the (key, value) of an id sent at a time."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: float,
        seconds: float,
        first_id: int,
        encode: Callable[[int, float], tuple[bytes, bytes]] = upsert_record,
    ) -> None:
        super().__init__(name="bench-latency-producer", daemon=True)
        self.bootstrap, self.topic, self.rate, self.first_id = bootstrap, topic, rate, first_id
        self.encode = encode
        self.count = int(rate * seconds)
        self.sent = 0
        self.sent_at: dict[int, float] = {}
        self.max_behind_s = 0.0  # how far the sends fell behind their schedule
        self.errors: list[BaseException] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        from kafka import KafkaProducer

        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=0)
        except Exception as exc:  # noqa: BLE001 - reported by the section
            self.errors.append(exc)
            return
        try:
            t0 = time.monotonic()
            for i in range(self.count):
                wait = due_at(t0, i, self.rate) - time.monotonic()
                if wait > 0 and self.stop_event.wait(wait):
                    break
                self.max_behind_s = max(self.max_behind_s, -wait)
                ident, at = self.first_id + i, time.time()
                key, value = self.encode(ident, at)
                producer.send(self.topic, key=key, value=value).add_errback(self.errors.append)
                self.sent_at[ident] = at
                self.sent += 1
            producer.flush(60)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            producer.close()


class TablePoller(threading.Thread):
    """Every ``POLL_S``: the ids >= the lowest not seen yet; ``seen``: each id's first sighting."""

    def __init__(self, url: str, first_id: int) -> None:
        super().__init__(name="bench-latency-poller", daemon=True)
        self.url, self.low = url, first_id
        self.seen: dict[int, float] = {}  # id -> first seen at
        self.polls = 0
        self.errors: list[BaseException] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        import psycopg2

        try:
            conn = psycopg2.connect(self.url)
            conn.autocommit = True
        except Exception as exc:  # noqa: BLE001
            self.errors.append(exc)
            return
        try:
            t0, k = time.monotonic(), 0
            with conn.cursor() as cur:
                while not self.stop_event.is_set():
                    cur.execute(f"SELECT id FROM {TABLE} WHERE id >= %s", (self.low,))
                    rows = cur.fetchall()
                    # after the answer: a row it holds was visible by then (the time before the query
                    # can precede a produce when this thread stalls between the two: negative latency)
                    at = time.time()
                    for (ident,) in rows:
                        self.seen.setdefault(ident, at)
                    while self.low in self.seen:
                        self.low += 1
                    self.polls += 1
                    k = max(k + 1, int((time.monotonic() - t0) / POLL_S) + 1)  # a late poll skips its slot
                    self.stop_event.wait(max(0.0, due_at(t0, k, 1 / POLL_S) - time.monotonic()))
        except Exception as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            conn.close()


def measure(producer: PacedProducer, reader: Any, seconds: float, progress: Any, who: str) -> dict[str, Any]:
    """One window: ``reader`` (a thread with ``seen``: id -> first seen at, ``polls``, ``errors``,
    ``stop_event``) started, then the paced ``producer``, then the last records."""
    reader.start()
    try:
        progress(f"latency: {who}: {producer.count:,} new ids at {producer.rate:,.0f}/s for {seconds:.0f}s")
        producer.start()
        producer.join(seconds + 120)
        if producer.is_alive():
            producer.stop_event.set()
            producer.join(30)
        drained = lambda: None if len(reader.seen) < producer.sent and reader.is_alive() else True  # noqa: E731
        poll(drained, DRAIN_S, 0.1)  # the last records, or what arrived by then (counted as unseen)
    finally:
        reader.stop_event.set()
        reader.join(30)
    if producer.errors or reader.errors:
        raise OperationError(f"latency: {who}: producer {producer.errors[:1]}, reader {reader.errors[:1]}")
    sent = producer.sent_at
    stats = latency_stats(producer.sent, [(sent[i], at) for i, at in reader.seen.items() if i in sent])
    stats.update(polls=reader.polls, producer_max_behind_s=producer.max_behind_s, seconds=seconds)
    progress(
        f"latency: {who}: seen {stats['seen']:,}/{stats['produced']:,}, "
        f"p50 {fmt_number(stats['p50_ms'])} ms, p99 {fmt_number(stats['p99_ms'])} ms, "
        f"max {fmt_number(stats['max_ms'])} ms"
    )
    return stats


def measure_table(
    bootstrap: str, topic: str, url: str, seconds: float, progress: Any, who: str
) -> dict[str, Any]:
    """One window on the upsert table at ``url``, new ids produced to ``topic``."""
    producer = PacedProducer(bootstrap, topic, RATE, seconds, FIRST_ID)
    return measure(producer, TablePoller(url, FIRST_ID), seconds, progress, who)


# ---------------------------------------------------------------------------------- the section
def latency_figures(
    relay: dict[str, Any], b2: dict[str, Any], k2k: dict[str, Any], k2k_base: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each half's percentiles against its hand-written baseline, and the counts seen."""
    txn_loop = "confluent-kafka txn loop"
    halves = (
        ("json_upsert, default limit", "row visible", relay, "b2 continuous", b2),
        ("kafka_to_kafka, default limit", "read_committed sees it", k2k, txn_loop, k2k_base),
    )
    figures = []
    for who, seen, stats, base, base_stats in halves:
        figures += [
            figure(f"{who}: produce -> {seen}, {q}", stats[f"{q}_ms"], "ms", base, base_stats[f"{q}_ms"])
            for q in ("p50", "p95", "p99", "max")
        ]
    counted = (("json_upsert", relay), ("b2 continuous", b2), ("kafka_to_kafka", k2k), (txn_loop, k2k_base))
    for who, stats in counted:
        figures.append(
            figure(f"{who}: new records seen", stats["seen"], "rows", "produced", stats["produced"], "higher")
        )
    return figures


def section_latency(ctx: Context) -> dict[str, Any]:
    from relay.kafka.offsets import KafkaOffsets
    from relay.ledger.engine import create_ledger

    from relay_dev.postgres_local import LocalPostgres

    from .latency_kafka import baseline_kafka, relay_kafka  # it builds on this module

    cfg = ctx.config
    boot, seconds = cfg.kafka_bootstrap, QUICK_SECONDS if ctx.options.quick else SECONDS
    topics = {"relay": "json_upsert_latency", "b2": "json_upsert_latency_b2"}
    pg = LocalPostgres(cfg.data_dir, cfg.ports.postgres, cfg.host)
    try:
        ctx.progress(f"latency: starting PostgreSQL (ledger + sink databases) on {pg.address}")
        ledger_url = pg.start()
        create_ledger(ledger_url)
        with KafkaOffsets(boot) as kafka:
            for topic in topics.values():
                kafka.ensure_topic(topic, cfg.partitions)
            partitions = sorted(kafka.latest(topics["b2"]))
        urls = {k: sink_database(ledger_url, f"sink_lat_{k}_{uuid.uuid4().hex[:6]}") for k in topics}
        produce_records(boot, topics["relay"], [json_record(i, WARM_UP) for i in range(WARM_UP)])
        with deployed(ctx, ledger_url, "ju_latency", topics["relay"], None, urls["relay"], "latency") as (
            rcfg,
            info,
            _t0,
        ):
            wait_caught_up(rcfg, ctx.progress, 600.0, "latency warm-up")
            relay = measure_table(boot, topics["relay"], urls["relay"], seconds, ctx.progress, "json_upsert")
        group = Processes("kafka-python", boot, topics["b2"], urls["b2"], [partitions], True, B2_POLL_MS)
        try:
            group.start()
            b2 = measure_table(boot, topics["b2"], urls["b2"], seconds, ctx.progress, "b2 continuous")
            group.stop_event.set()
            b2["consumer"] = group.results()[0]
        finally:
            group.close()
        k2k = relay_kafka(ctx, ledger_url, seconds)
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    k2k_base = baseline_kafka(ctx, seconds)
    halves = (("json_upsert", relay), ("b2 continuous", b2), ("kafka_to_kafka", k2k), ("txn loop", k2k_base))
    for who, stats in halves:
        if stats["seen"] != stats["produced"]:
            raise OperationError(f"latency: {who} showed {stats['seen']} of {stats['produced']} new records")
    return {
        "figures": latency_figures(relay, b2, k2k, k2k_base),
        "details": {
            "rate": RATE,
            "seconds": seconds,
            "poll_s": POLL_S,
            "b2_poll_ms": B2_POLL_MS,
            "relay": relay,
            "relay_instance_id": info.get("instance_id"),
            "b2": b2,
            "kafka_to_kafka": k2k,
            "kafka_baseline": k2k_base,
            "notes": [
                "latency = answer of the table query that first returned the row - its produce time",
                "kafka: the answer of the confluent-kafka read_committed poll that first returned it",
                "producer paced to a schedule (record i at start + i/rate); producer_max_behind_s: its lag",
                "Relay at the example's default read limit and trigger (nothing forced)",
            ],
        },
    }
