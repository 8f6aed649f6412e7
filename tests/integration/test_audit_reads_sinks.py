"""``relay audit --deep`` reads the sink (issue #29, D5), on real parts: the broker, the Spark cluster,
PostgreSQL. A Kafka-to-Kafka pipeline and a JSON upsert pipeline (copies of the examples under
topics of their own) run to the end of their input and stop; the audit is OK on their untouched
sinks. Then the sinks are corrupted from outside, with clients Relay does not write with: a copy of an
output record by another producer (its ``relay.source`` header copied, another writer id), output
records deleted from the topic, an upsert row deleted, one overwritten, one set back to an older
position. The audit must exit 3 and name each of those offsets and keys.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from relay.artifacts import build_artifact
from relay.cli import main
from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.engine import create_ledger
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.sinks import kafka_clients as kc
from relay.sinks.kafka_transactional import KafkaTransactionalSink

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, pipeline_run
from tests.integration.json_users import IDS, produce_versions, sink_database

pytestmark = pytest.mark.integration

KINDS = ("purchase", "view", "purchase", "refund", "purchase")


def package(cfg: RelayConfig, example: str, name: str, replace: dict[str, str]) -> Path:
    """A copy of an example package named ``name``, its constants replaced (its own topics)."""
    folder = cfg.data_dir / "packages" / uuid.uuid4().hex[:8] / name
    shutil.copytree(PROJECT_ROOT / "examples" / example, folder)
    code = folder / "pipeline.py"
    text = code.read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    code.write_text(text)
    return folder


def own_ledger(stack: RelayConfig, name: str) -> str:
    url = f"sqlite:///{stack.data_dir / (name + '.db')}"
    create_ledger(url)
    return url


def produce_events(bootstrap: str, topic: str, ids: range) -> int:
    """JSON events keyed by user (3 in 5 are purchases, kept when the amount is positive), one junk."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for n in ids:
            e = {"id": n, "kind": KINDS[n % 5], "user": f"u{n % 13}", "amount": 0.0 if n % 7 == 0 else n / 4}
            producer.send(topic, key=e["user"].encode(), value=json.dumps(e).encode())
        producer.send(topic, key=b"junk", value=b"not json")
        producer.flush(60)
    finally:
        producer.close()
    return len(ids) + 1


def run_to_the_end(cfg: RelayConfig, version: str) -> None:
    ledger = Ledger(cfg.ledger_url)
    deploy(cfg, version=version, wait_s=300)
    wait_for("the input to be applied", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    assert [s["graceful"] for s in stop(cfg, timeout_s=120)["stopped"]] == [True]
    ledger.close()


def audit_cli(cfg: RelayConfig, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> tuple:
    """``relay audit --deep --json`` as a user runs it: (exit code, result, seconds)."""
    for name, value in {
        "RELAY_DATA_DIR": str(cfg.data_dir),
        "RELAY_KAFKA_BOOTSTRAP": cfg.kafka_bootstrap,
        "RELAY_LEDGER_URL": cfg.ledger_url,
        "RELAY_PIPELINE": cfg.pipeline,
        "RELAY_TOPIC": cfg.topic,
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    t0 = time.perf_counter()
    code = main(["audit", "--deep", "--json"])
    seconds = time.perf_counter() - t0
    out = capsys.readouterr()
    result = json.loads(out.out)
    print(
        f"\naudit of {cfg.pipeline}: exit {code} in {seconds:.1f}s; sink {json.dumps(result['sink'])}",
        file=sys.__stderr__,
    )
    for secret in env.values():
        if "@" in secret:  # a URL with a password: never printed
            password = secret.split("://", 1)[1].rsplit("@", 1)[0].partition(":")[2]
            assert f":{password}@" not in out.out + out.err and ":***@" in out.out
    return code, result, seconds


def output_records(bootstrap: str, topic: str) -> list[Any]:
    """Every committed record of the output topic (an outside reader)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        found: list[Any] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for records in consumer.poll(timeout_ms=200).values():
                found += [r for r in records if r.offset < ends[TopicPartition(r.topic, r.partition)]]
        return found
    finally:
        consumer.close()


def test_audit_reads_a_kafka_output_and_names_duplicated_and_missing_input_offsets(
    stack: RelayConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic, out = f"audit_k2k_{tag}", f"audit_k2k_{tag}_out"
    cfg = stack.with_(pipeline="audit_k2k", topic=topic, ledger_url=own_ledger(stack, f"k2k{tag}"))
    code = package(
        cfg,
        "kafka_to_kafka",
        "audit_k2k",
        {
            'TOPIC = "kafka_to_kafka"': f'TOPIC = "{topic}"',
            '"kafka_to_kafka_purchases"': f'"{out}"',
            'NAME = "kafka_to_kafka"': 'NAME = "audit_k2k"',
        },
    )
    env = {"KAFKA_TO_KAFKA_BOOTSTRAP": cfg.kafka_bootstrap}
    monkeypatch.setenv("KAFKA_TO_KAFKA_BOOTSTRAP", cfg.kafka_bootstrap)
    build_artifact(cfg, f"v1-{tag}", pipeline_code=code)  # the stack's artifacts are shared
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, cfg.partitions)
    KafkaTransactionalSink(cfg.kafka_bootstrap, out).create_topic(cfg.partitions)
    total = produce_events(cfg.kafka_bootstrap, topic, range(3000))
    try:
        with pipeline_run(cfg):
            run_to_the_end(cfg, f"v1-{tag}")
    finally:
        kc.close_all()

    status, result, _ = audit_cli(cfg, env, monkeypatch, capsys)
    sink = result["sink"]
    assert (status, result["ok"], sink["kind"], sink["read"]) == (0, True, "kafka", True), sink
    kept = sum(1 for n in range(3000) if KINDS[n % 5] == "purchase" and n % 7 != 0)
    assert sink["counts"] == {"ok": total}, "every input record once: kept ones with output, others without"
    records = output_records(cfg.kafka_bootstrap, out)
    assert len(records) == kept and all(dict(r.headers)["relay.writer"].startswith(b"1:") for r in records)

    # Another producer writes a copy of a partition-1 record: its source header, another writer id.
    copied = next(r for r in records if r.partition == 1)
    headers = dict(copied.headers)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap)
    producer.send(
        out,
        key=copied.key,
        value=copied.value,
        partition=copied.partition,
        headers=[("relay.source", headers["relay.source"]), ("relay.writer", b"77:1:0")],
    )
    producer.send(out, key=b"x", value=b"written outside Relay", partition=2)  # no header: reported apart
    producer.flush()
    producer.close()
    # The first two output records of partition 0 are deleted: their input offsets lose their effect.
    first = sorted((r for r in records if r.partition == 0), key=lambda r: r.offset)[:3]
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.delete_records(out, {0: first[2].offset})

    status, result, _ = audit_cli(cfg, env, monkeypatch, capsys)
    sink = result["sink"]
    assert (status, result["ok"], sink["ok"]) == (3, False, False)
    assert (sink["counts"]["duplicated"], sink["counts"]["missing"], sink["counts"]["foreign"]) == (1, 2, 1)
    assert sink["examples"]["duplicated"][0]["source"] == headers["relay.source"].decode()
    assert sink["examples"]["duplicated"][0]["writers"] == sorted(
        [headers["relay.writer"].decode(), "77:1:0"]
    )
    deleted = sorted(dict(r.headers)["relay.source"].decode() for r in first[:2])
    assert sorted(sink["examples"]["missing"]) == deleted


def test_audit_reads_an_upsert_table_and_names_missing_wrong_and_stale_keys(
    stack: RelayConfig, sink_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic = f"audit_ju_{tag}"
    cfg = stack.with_(pipeline="audit_ju", topic=topic, ledger_url=own_ledger(stack, f"ju{tag}"))
    code = package(
        cfg,
        "json_upsert",
        "audit_ju",
        {'TOPIC = "json_upsert"': f'TOPIC = "{topic}"', 'name="json_upsert"': 'name="audit_ju"'},
    )
    env = {"JSON_UPSERT_SINK_URL": sink_url}
    monkeypatch.setenv("JSON_UPSERT_SINK_URL", sink_url)
    build_artifact(cfg, f"v1-{tag}", pipeline_code=code)  # the stack's artifacts are shared
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, cfg.partitions)
    produce_versions(cfg.kafka_bootstrap, topic, range(3))
    with pipeline_run(cfg):
        run_to_the_end(cfg, f"v1-{tag}")

    status, result, _ = audit_cli(cfg, env, monkeypatch, capsys)
    sink = result["sink"]
    assert (status, result["ok"], sink["kind"], sink["counts"]) == (0, True, "upsert", {"ok": IDS}), sink

    with psycopg2.connect(sink_url) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM json_upsert_users WHERE id = 5")
        cur.execute("UPDATE json_upsert_users SET name = 'tampered' WHERE id = 7")
        cur.execute("UPDATE json_upsert_users SET _relay_offset = _relay_offset - 1 WHERE id = 9")
        cur.execute("INSERT INTO json_upsert_users (id, name, score) VALUES (100000, 'outsider', 0)")

    status, result, _ = audit_cli(cfg, env, monkeypatch, capsys)
    sink = result["sink"]
    assert (status, result["ok"]) == (3, False)
    counts = sink["counts"]
    assert (counts["missing"], counts["wrong"], counts["stale"], counts["foreign"]) == (1, 1, 1, 1), counts
    assert [m["key"] for m in sink["examples"]["missing"]] == ["5"]
    assert [w["key"] for w in sink["examples"]["wrong"]] == ["7"]
    assert [s["key"] for s in sink["examples"]["stale"]] == ["9"]
    assert sink["examples"]["foreign"] == ["100000"]


def test_audit_reads_a_stateful_table_and_names_wrong_and_missing_windows_apart_from_open_ones(
    stack: RelayConfig, postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic = f"audit_wc_{tag}"
    cfg = stack.with_(pipeline="audit_wc", topic=topic, ledger_url=own_ledger(stack, f"wc{tag}"))
    code = package(
        cfg,
        "window_counts",
        "audit_wc",
        {'NAME = "window_counts"': 'NAME = "audit_wc"', 'TOPIC = "window_counts"': f'TOPIC = "{topic}"'},
    )
    url = sink_database(postgres_url, PROJECT_ROOT / "examples" / "window_counts" / "schema.sql")
    env = {"WINDOW_COUNTS_SINK_URL": url}
    monkeypatch.setenv("WINDOW_COUNTS_SINK_URL", url)
    build_artifact(cfg, f"v1-{tag}", pipeline_code=code)  # the stack's artifacts are shared
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(topic, cfg.partitions)
    # 400 records over the last 300 s of event time (10-s windows, 8 words): the windows of the last
    # warm_up_s (60 s) before the newest record are "open", the older ones closed.
    newest_ms = int(time.time() * 1000) // 10_000 * 10_000 - 1
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all", linger_ms=5)
    for i in range(400):
        ts = newest_ms - (399 - i) * 750
        producer.send(topic, key=f"w{i % 8}".encode(), value=b"1", timestamp_ms=ts)
    producer.flush()
    producer.close()
    with pipeline_run(cfg):
        run_to_the_end(cfg, f"v1-{tag}")

    status, result, _ = audit_cli(cfg, env, monkeypatch, capsys)
    sink = result["sink"]
    assert (status, result["ok"], sink["kind"]) == (0, True, "stateful"), sink
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT window_start, word FROM window_counts ORDER BY window_start, word")
        groups = cur.fetchall()
        assert sink["counts"] == {"ok": len(groups)} and len(groups) > 100
        old, recent = groups[:2], groups[-1]
        cur.execute("UPDATE window_counts SET n = n + 1 WHERE window_start = %s AND word = %s", old[0])
        cur.execute("DELETE FROM window_counts WHERE window_start = %s AND word = %s", old[1])
        cur.execute("UPDATE window_counts SET n = n + 5 WHERE window_start = %s AND word = %s", recent)

    status, result, _ = audit_cli(cfg, env, monkeypatch, capsys)
    sink = result["sink"]
    assert (status, result["ok"]) == (3, False)
    assert (sink["counts"]["wrong"], sink["counts"]["missing"], sink["counts"]["open"]) == (1, 1, 1), sink
    shown = [f"{w},{word}" for w, word in (*old, recent)]
    assert [w["group"] for w in sink["examples"]["wrong"]] == [shown[0]]
    assert [m["group"] for m in sink["examples"]["missing"]] == [shown[1]]
    assert sink["examples"]["open"] == [shown[2]]
