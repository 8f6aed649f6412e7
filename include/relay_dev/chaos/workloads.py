"""What a chaos run produces for its pipeline, and how it counts the result from outside.

The pipeline's sink decides the workload (issue #29: chaos on the sinks users run, not only the
counter):

* ``counter`` (``LedgerMessagesSink``, examples/counter): ``key = value = n``, every N-th a poison
  record (a dead letter); counted by the deep audit (one ``messages`` row per applied offset).
* ``kafka`` (``KafkaTransactionalSink``, examples/kafka_to_kafka): JSON events ``{"id": n, "kind",
  "user", "amount"}``, every N-th not JSON (the transform drops it); the output topic read with
  confluent-kafka (``read_committed``, librdkafka: not the client the sink writes with), every kept
  event's id exactly once.
* ``upsert`` (``PostgresUpsertSink``, examples/json_upsert): JSON users ``{"id": n % 500, "name":
  "n<n>", "score": n}`` keyed by id, every N-th without an id; the table read with SQL: each id's row
  is its newest record in Kafka.

A broker SIGKILL loses its last second of acknowledged records and hands their offsets out again
(``observe.broker_check``): ids the broker lost are reported apart, never as Relay's loss.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka.producer import POISON_KEY

from relay_dev import witness

KINDS = ("purchase", "view", "purchase", "refund", "purchase")  # 3 in 5 events are purchases
USERS = 500  # distinct ids of the upsert workload
EXAMPLES = {
    "counter": PROJECT_ROOT / "examples" / "counter",
    "kafka": PROJECT_ROOT / "examples" / "kafka_to_kafka",
    "upsert": PROJECT_ROOT / "examples" / "json_upsert",
}


def workload_of(sink_type: str | None) -> str:
    """The workload of a pipeline whose sink is a ``sink_type`` (its class name, as ``sink_declares``
    reads it without building the sink)."""
    return {"KafkaTransactionalSink": "kafka", "PostgresUpsertSink": "upsert"}.get(sink_type or "", "counter")


def record(workload: str, n: int, poison: bool) -> tuple[bytes, bytes]:
    """(key, value) of the n-th record of ``workload``; a poison one the pipeline cannot apply."""
    if workload == "kafka":
        user = f"u{n % 13}"
        if poison:
            return user.encode(), f"not json {n}".encode()
        event = {"id": n, "kind": KINDS[n % 5], "user": user, "amount": 0.0 if n % 7 == 0 else n / 4}
        return user.encode(), json.dumps(event).encode()
    if workload == "upsert":
        key = str(n % USERS).encode()
        if poison:
            return key, json.dumps({"name": f"n{n}"}).encode()  # no id: the transform drops it
        return key, json.dumps({"id": n % USERS, "name": f"n{n}", "score": float(n)}).encode()
    if poison:
        return POISON_KEY, f"poison-{n}".encode()
    key = str(n).encode()
    return key, key


def kept_event(value: bytes | None) -> int | None:
    """The id of an event the kafka_to_kafka transform keeps (a purchase with a positive amount)."""
    try:
        e = json.loads(value or b"")
    except ValueError:
        return None
    if isinstance(e, dict) and e.get("kind") == "purchase" and (e.get("amount") or 0) > 0:
        return e.get("id")
    return None


@dataclass
class OutsideCount:
    """What the outside witness found: the run's verdict takes duplicates and missing from here."""

    workload: str
    client: str
    checked: int = 0
    duplicates: int = 0
    missing: int = 0
    wrong: int = 0
    lost_by_broker: int = 0
    examples: dict[str, list[Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _examples(**found: Iterable[Any]) -> dict[str, list[Any]]:
    return {k: sorted(v, key=str)[:10] for k, v in found.items() if v}


def count_kafka(config: RelayConfig, output: str, acked: dict[tuple[int, int], bytes]) -> OutsideCount:
    """Every kept event in the input topic exactly once in the output (ids), read by confluent-kafka."""
    inputs = read_committed(config.kafka_bootstrap, config.topic)
    want = {i for _, v in inputs for i in [kept_event(v)] if i is not None}
    seen = Counter(json.loads(v)["id"] for _, v in read_committed(config.kafka_bootstrap, output))
    lost = {i for (p, o), v in acked.items() for i in [kept_event(v)] if i is not None} - want
    twice = {i for i, c in seen.items() if c > 1}
    missing = want - set(seen)
    extra = set(seen) - want - lost
    return OutsideCount(
        "kafka",
        f"confluent-kafka read_committed of {output!r}",
        checked=len(want),
        duplicates=len(twice),
        missing=len(missing),
        wrong=len(extra),
        lost_by_broker=len(lost & set(seen)),
        examples=_examples(duplicates=twice, missing=missing, unexpected=extra),
    )


def count_upsert(
    config: RelayConfig, sink_url: str, table: str, acked: dict[tuple[int, int], bytes]
) -> OutsideCount:
    """Each id's row is its newest record in Kafka (by offset: one id stays in one partition)."""
    import psycopg2

    newest: dict[int, tuple[int, str]] = {}
    held = read_committed_positions(config.kafka_bootstrap, config.topic)
    for (_, offset), value in held.items():
        e = json.loads(value)
        if "id" in e and (e["id"] not in newest or offset > newest[e["id"]][0]):
            newest[e["id"]] = (offset, e["name"])
    gone = {json.loads(v).get("name") for k, v in acked.items() if held.get(k) != v}  # the broker's loss
    with psycopg2.connect(sink_url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name FROM {table}")  # noqa: S608 - the example's own table name
        rows = dict(cur.fetchall())
    missing = set(newest) - set(rows)
    differ = {i for i, name in rows.items() if i in newest and newest[i][1] != name}
    lost = {i for i in differ if rows[i] in gone}
    extra = set(rows) - set(newest)
    return OutsideCount(
        "upsert",
        f"SQL on {table}",
        checked=len(newest),
        missing=len(missing),
        wrong=len((differ - lost) | extra),
        lost_by_broker=len(lost),
        examples=_examples(missing=missing, wrong=differ - lost, unexpected=extra),
    )


def read_committed(bootstrap: str, topic: str, timeout_s: float = 300.0) -> list[tuple[int, bytes]]:
    """(partition, value) of every record a read_committed confluent-kafka consumer sees."""
    return [(r.partition, r.value or b"") for r in witness.read_committed(bootstrap, topic, timeout_s)]


def read_committed_positions(
    bootstrap: str, topic: str, timeout_s: float = 300.0
) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of every record a read_committed confluent-kafka consumer sees."""
    return {
        (r.partition, r.offset): r.value or b"" for r in witness.read_committed(bootstrap, topic, timeout_s)
    }


def example_of(workload: str) -> Path:
    return EXAMPLES[workload]
