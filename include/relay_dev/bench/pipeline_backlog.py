"""The pipeline section's backlog and its hand-written baseline (relay_dev.bench.pipeline).

The backlog: JSON records ``{"id", "name", "score"}`` keyed by id, every id updated ~5 times. The
baseline: a kafka-python consumer that parses each record and upserts newest-wins by id into a table
of the example's shape (``execute_values`` in pages, one transaction per poll), as a team would
write it by hand (no fence, no ledger, no exactly-once). Also the sink databases and their check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from relay.config import PROJECT_ROOT

from relay_dev.postgres_local import database_with

EXAMPLE = PROJECT_ROOT / "examples" / "json_upsert"
TOPIC = "json_upsert"  # the example's topic
TABLE = "json_upsert_users"
PAGE_SIZE = 2000  # PostgresUpsertSink's default page
UPDATES_PER_ID = 5

BASELINE_UPSERT = (
    f"INSERT INTO {TABLE} AS t (id, name, score, _relay_topic, _relay_partition, _relay_offset) "
    "VALUES %s ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, score = EXCLUDED.score, "
    "_relay_topic = EXCLUDED._relay_topic, _relay_partition = EXCLUDED._relay_partition, "
    "_relay_offset = EXCLUDED._relay_offset WHERE t._relay_offset < EXCLUDED._relay_offset"
)


def id_count(messages: int) -> int:
    """Distinct ids of a backlog: every id is updated ~UPDATES_PER_ID times."""
    return max(1, messages // UPDATES_PER_ID)


def json_record(i: int, ids: int) -> tuple[bytes, bytes]:
    """The i-th record: (key, value); round ``i // ids`` of id ``i % ids``."""
    ident, rnd = i % ids, i // ids
    value = {"id": ident, "name": f"user{ident}-r{rnd}", "score": rnd + ident / 1_000_000}
    return str(ident).encode(), json.dumps(value).encode()


def newest_name_sql(messages: int, ids: int) -> str:
    """SQL counting the rows that hold their id's last round (must equal ``ids``)."""
    last, extra = divmod(messages, ids)
    return (
        f"SELECT count(*) FROM {TABLE} WHERE name = 'user' || id || '-r' || "
        f"CASE WHEN id < {extra} THEN {last} ELSE {last - 1} END"
    )


def newest_rows(records: Iterable[tuple[int, int, bytes | None]]) -> list[tuple[Any, ...]]:
    """(partition, offset, value) -> one upsert row per id (its highest offset), in id order.

    Values that are not JSON objects with an id are dropped (as the example's transform does); one
    ``ON CONFLICT`` command may not touch a row twice, and a single lock order avoids deadlocks.
    """
    best: dict[int, tuple[Any, ...]] = {}
    for partition, offset, value in records:
        try:
            doc = json.loads(value) if value is not None else None
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("id") is None:
            continue
        ident = int(doc["id"])
        held = best.get(ident)
        if held is None or held[5] < offset:
            best[ident] = (ident, doc.get("name"), doc.get("score"), TOPIC, partition, offset)
    return [best[k] for k in sorted(best)]


def sink_database(ledger_url: str, name: str) -> str:
    """A fresh database on the ledger's server holding the example's table; its libpq URL."""
    return database_with(ledger_url, EXAMPLE / "schema.sql", name)


def check_table(url: str, messages: int, ids: int) -> dict[str, int]:
    import psycopg2

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {TABLE}")
        rows = int(cur.fetchone()[0])
        cur.execute(newest_name_sql(messages, ids))
        newest = int(cur.fetchone()[0])
    conn.close()
    return {"rows": rows, "newest": newest, "ids": ids}


def produce_json(bootstrap: str, topic: str, messages: int) -> dict[str, Any]:
    from kafka import KafkaProducer

    ids = id_count(messages)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024)
    t0 = time.monotonic()
    try:
        for i in range(messages):
            key, value = json_record(i, ids)
            producer.send(topic, key=key, value=value)
        producer.flush(300)
    finally:
        producer.close()
    seconds = time.monotonic() - t0
    return {"sent": messages, "ids": ids, "seconds": seconds, "msg_s": messages / seconds}


def produce_records(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    """``records`` (key, value) as fast as librdkafka sends them; the seconds to the last ack.

    Keys go to kafka-python's partitions (murmur2, as Java's client): an id keeps its partition
    whichever of the two clients produced it, so newest-by-offset stays per partition.
    """
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    t0 = time.monotonic()
    for key, value in records:
        queued = False
        while not queued:  # librdkafka's queue is full: serve delivery reports until there is room
            try:
                producer.produce(topic, value=value, key=key)
                queued = True
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} records to {topic} not acknowledged after 300s")
    return time.monotonic() - t0


def _records(bootstrap: str, topic: str) -> Iterator[list[tuple[int, int, bytes | None]]]:
    """Every record of ``topic`` from the beginning to the end now, one list per poll."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            polled = consumer.poll(timeout_ms=1000, max_records=10_000)
            yield [(tp.partition, r.offset, r.value) for tp, recs in polled.items() for r in recs]
    finally:
        consumer.close()


def upsert_consumer(bootstrap: str, topic: str, url: str) -> dict[str, Any]:
    """Baseline: kafka-python + json.loads + newest-wins upsert, one transaction per poll."""
    import psycopg2
    from psycopg2.extras import execute_values

    conn = psycopg2.connect(url)
    rows = written = 0
    t0 = time.monotonic()
    try:
        for polled in _records(bootstrap, topic):
            rows += len(polled)
            values = newest_rows(polled)
            if values:
                with conn.cursor() as cur:
                    execute_values(cur, BASELINE_UPSERT, values, page_size=PAGE_SIZE)
                conn.commit()
                written += len(values)
        seconds = time.monotonic() - t0
    finally:
        conn.close()
    return {
        "rows": rows,
        "upserted": written,
        "seconds": seconds,
        "msg_s": rows / seconds if seconds else None,
    }
