"""The json_upsert example's workload: IDS users updated once per version, keyed by id, and its table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg2
from kafka import KafkaProducer
from relay.config import PROJECT_ROOT
from relay_dev.postgres_local import database_with

EXAMPLE = PROJECT_ROOT / "examples" / "json_upsert"
IDS = 200
Table = dict[int, tuple[str, float]]


def libpq(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def sink_database(postgres_url: str, schema: Path = EXAMPLE / "schema.sql") -> str:
    """A database of its own on the ledger's server, holding an example's table (libpq URL)."""
    return database_with(postgres_url, schema)


def table(url: str) -> Table:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, score FROM json_upsert_users")
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def positioned_rows(url: str) -> list[tuple[int, str, int, int]]:
    """(id, name, partition, offset): each row with the source position it was written from."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, _relay_partition, _relay_offset FROM json_upsert_users ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]


def user_name(i: int, version: int) -> str:
    return f"user{i}-v{version}"


def expected(last_version: int) -> Table:
    return {i: (user_name(i, last_version), last_version + i / 1000) for i in range(IDS)}


def produce_versions(bootstrap: str, topic: str, versions: range, rate: float | None = None) -> int:
    """Every id once per version, keyed by id (one id stays in one partition, in order), then one
    record that is not JSON (the transform drops it). Returns the records sent."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent, t0 = 0, time.monotonic()
    try:
        for v in versions:
            for i in range(IDS):
                value = {"id": i, "name": user_name(i, v), "score": v + i / 1000}
                producer.send(topic, key=str(i).encode(), value=json.dumps(value).encode())
                sent += 1
                if rate and sent % 50 == 0:
                    time.sleep(max(0.0, sent / rate - (time.monotonic() - t0)))
        producer.send(topic, key=b"junk", value=b"not json")
        producer.flush(60)
    finally:
        producer.close()
    return sent + 1
