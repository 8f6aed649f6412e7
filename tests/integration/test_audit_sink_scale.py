"""The sink audit's cost, and its version attribution, at 100k records on the real broker.

No pipeline runs here: the ledger is built by hand (v1 applied the first half of each partition, v2
the rest) and the output topic is written as the Kafka sink writes it (headers included), v2's
transform making other values than v1's. Every input offset must be judged by the version that
applied it; the test prints what each phase cost.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import pytest
from kafka import KafkaProducer
from relay.artifacts import build_artifact
from relay.audit.sink import audit_sink
from relay.audit.versions import forget
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.sinks.kafka_transactional import KafkaTransactionalSink

from tests.integration.test_audit_reads_sinks import KINDS, own_ledger, package
from tests.ledger_builder import LedgerBuilder

pytestmark = [pytest.mark.integration, pytest.mark.slow]
N = 100_000


def event(n: int) -> dict:
    return {"id": n, "kind": KINDS[n % 5], "user": f"u{n % 13}", "amount": 0.0 if n % 7 == 0 else n / 4}


def test_audit_of_100k_records_judges_each_offset_by_the_version_that_applied_it(
    stack: RelayConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic, out = f"audit_scale_{tag}", f"audit_scale_{tag}_out"
    cfg = stack.with_(pipeline="audit_scale", topic=topic, ledger_url=own_ledger(stack, f"scale{tag}"))
    monkeypatch.setenv("KAFKA_TO_KAFKA_BOOTSTRAP", cfg.kafka_bootstrap)
    path = list(sys.path)
    for version, factor in ((f"v1-{tag}", "100"), (f"v2-{tag}", "1000")):  # v2 counts tenths of cents
        code = package(
            cfg,
            "kafka_to_kafka",
            "audit_scale",
            {
                'TOPIC = "kafka_to_kafka"': f'TOPIC = "{topic}"',
                '"kafka_to_kafka_purchases"': f'"{out}"',
                'name="kafka_to_kafka"': 'name="audit_scale"',
                '* 100).cast("long")': f'* {factor}).cast("long")',
            },
        )
        build_artifact(cfg, version, pipeline_code=code)
        forget("audit_scale")
    sys.path[:] = path
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, cfg.partitions)
    KafkaTransactionalSink(cfg.kafka_bootstrap, out).create_topic(cfg.partitions)

    t0 = time.perf_counter()
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, linger_ms=20, batch_size=256 * 1024)
    sent = [
        producer.send(topic, key=event(n)["user"].encode(), value=json.dumps(event(n)).encode())
        for n in range(N)
    ]
    producer.flush()
    where = [f.get(timeout=60) for f in sent]
    ends = {p: 1 + max(m.offset for m in where if m.partition == p) for p in {m.partition for m in where}}
    ledger = Ledger(cfg.ledger_url)
    b = LedgerBuilder(ledger, cfg.pipeline, topic)
    one, two = b.instance(f"v1-{tag}"), b.instance(f"v2-{tag}")
    for p, end in ends.items():
        b.lease(one, p, 0, end // 2, end=end // 2)
        b.lease(two, p, end // 2, end)
    kept = 0
    for n, m in enumerate(where):
        e = event(n)
        if e["kind"] != "purchase" or e["amount"] <= 0:
            continue
        first_half = m.offset < ends[m.partition] // 2
        cents = round(e["amount"] * (100 if first_half else 1000))
        value = json.dumps({"id": n, "user": e["user"], "cents": cents}, separators=(",", ":"))
        headers = [
            ("relay.source", f"{topic}:{m.partition}:{m.offset}".encode()),
            ("relay.writer", b"1:1:0" if first_half else b"2:1:0"),
        ]
        producer.send(out, key=e["user"].encode(), value=value.encode(), headers=headers)
        kept += 1
    producer.flush()
    producer.close()
    print(f"\n{N:,} input and {kept:,} output records written in {time.perf_counter() - t0:.1f}s")

    said: list[str] = []
    t0 = time.perf_counter()
    found = audit_sink(cfg, ledger, said.append)
    seconds = time.perf_counter() - t0
    print(f"sink audit of {N:,} input records: {seconds:.1f}s; {found.timings}; progress: {said}")
    assert found.ok and dict(found.counts) == {"ok": N}, found.to_json()
    assert any(f"version v1-{tag}" in h for h in found.how) and any(
        f"version v2-{tag}" in h for h in found.how
    )
    ledger.close()
