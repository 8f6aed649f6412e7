"""A stateful pipeline (examples/window_counts) upgraded blue-green under load and rolled back, on real parts.

Windowed counts per key are upserted into PostgreSQL. Green starts ``warm_up_s`` back and reads in
shadow (writing nothing) until the handoff, so the windows open at H are whole in its state. The
table at the end must equal the counts computed from every record in Kafka -- what a run without an
upgrade gives -- and at least one window spanning H must hold green's count: without the warm-up
green would have counted only its records from H on and, as the newer writer, overwritten blue's.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from relay.artifacts import build_artifact
from relay.audit import audit, render
from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import Instance
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.rollback import rollback
from relay.operations.stop import stop
from relay.operations.upgrade import UpgradeState, upgrade
from relay.pipeline.stateful import STATE_TOPIC
from relay_dev.bench.context import driver_stdout

from tests.conftest import wait_for
from tests.integration.helpers import Load, caught_up, example_package, pipeline_run
from tests.integration.json_users import sink_database

pytestmark = pytest.mark.integration

EXAMPLE = PROJECT_ROOT / "examples" / "window_counts"
WORDS = [f"w{i}" for i in range(8)]
WINDOW_S = 30  # the test's window (the example's is 10 s); + the 10-s watermark stays within warm_up_s 60
Windows = dict[tuple[int, str], int]


class WordLoad(Load):
    """Keyed records (one of WORDS each) at ~50/s: the window counts' workload."""

    def send_some(self) -> int:
        return send_words(self.cfg, 50, rate=50.0)


def send_words(cfg: RelayConfig, count: int, rate: float | None = None) -> int:
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all", linger_ms=5)
    t0 = time.monotonic()
    try:
        for i in range(count):
            producer.send(cfg.topic, key=WORDS[i % len(WORDS)].encode(), value=b"1")
            if rate and i % 10 == 9:
                time.sleep(max(0.0, (i + 1) / rate - (time.monotonic() - t0)))
        producer.flush(60)
    finally:
        producer.close()
    return count


def kafka_windows(cfg: RelayConfig) -> tuple[Windows, list[tuple[int, int, int, str]]]:
    """The counts a run without an upgrade gives: every record, by key and WINDOW_S window of its
    timestamp; and the records as (partition, offset, window_start, word)."""
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        ends = kafka.latest(cfg.topic)
    consumer = KafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap, enable_auto_commit=False)
    tps = [TopicPartition(cfg.topic, p) for p in sorted(ends)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    records: list[tuple[int, int, int, str]] = []
    try:
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            for tp, batch in consumer.poll(timeout_ms=1000).items():
                for r in batch:
                    if r.offset < ends[tp.partition] and r.key is not None:
                        records.append(
                            (
                                r.partition,
                                r.offset,
                                r.timestamp // 1000 // WINDOW_S * WINDOW_S,
                                r.key.decode(),
                            )
                        )
    finally:
        consumer.close()
    return dict(Counter((w, word) for _, _, w, word in records)), records


def table(url: str) -> dict[tuple[int, str], tuple[int, str, int]]:
    """(window_start, word) -> (n, the writer's _relay_topic, its generation)."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT window_start, word, n, _relay_topic, _relay_partition FROM window_counts")
        return {(w, word): (n, topic, gen) for w, word, n, topic, gen in cur.fetchall()}


@pytest.fixture()
def window_counts(
    pipeline_config: RelayConfig, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RelayConfig, Path, str]]:
    """The example as the user's package under this test's pipeline and topic, and its table in a
    database of its own."""
    cfg = pipeline_config
    package = example_package(EXAMPLE, cfg.data_dir / f"{cfg.pipeline}-project", cfg, "window_counts")
    code = package / "pipeline.py"  # wider windows: one of them surely spans each handoff
    assert 'WINDOW = "10 seconds"' in code.read_text() and "WARM_UP_S = 60.0" in code.read_text()
    code.write_text(code.read_text().replace('WINDOW = "10 seconds"', f'WINDOW = "{WINDOW_S} seconds"'))
    url = sink_database(postgres_url, EXAMPLE / "schema.sql")
    monkeypatch.setenv("WINDOW_COUNTS_SINK_URL", url)
    with pipeline_run(cfg):
        yield cfg, package, url


@pytest.mark.slow  # make test-long: make test upgrades a stateful pipeline in test_user_path_stateful
def test_stateful_upgrade_under_load_matches_a_run_without_one(
    window_counts: tuple[RelayConfig, Path, str],
) -> None:
    cfg, package, url = window_counts  # pipeline_run prints the drivers' output if this fails
    ledger = Ledger(cfg.ledger_url)
    v1, v2 = f"{cfg.pipeline}-s1", f"{cfg.pipeline}-s2"
    art = build_artifact(cfg, v1, pipeline_code=package)
    assert art.metadata()["stateful"] is True and art.pipeline["warm_up_s"] == 60.0
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    send_words(cfg, 400)
    blue_id = deploy(cfg, version=v1, wait_s=300)["instance_id"]
    wait_for("the backlog to be counted", lambda: caught_up(cfg, ledger), timeout=240, interval=1)

    build_artifact(cfg, v2, pipeline_code=package)
    with WordLoad(cfg):
        result = upgrade(cfg, v2, grace_s=300, drain_timeout_s=240)
        assert result["state"] == UpgradeState.DONE.value, result
        send_words(cfg, 100)  # windows open at H keep getting records after it
    green = _check_handoff(cfg, ledger, url, result, {blue_id})

    # Back to v1 the same way: a third writer, newer than both.
    with WordLoad(cfg):
        back = rollback(cfg, grace_s=300, drain_timeout_s=240)
        assert back["state"] == UpgradeState.DONE.value, back
        send_words(cfg, 100)
    rolled = _check_handoff(cfg, ledger, url, back, {blue_id, green.id})
    assert rolled.version == v1

    report = audit(cfg, ledger, deep=True)
    assert report.ok and report.totals["duplicates"] == 0, render(report.to_json())
    assert [a.name for a in master_apps(cfg, cfg.pipeline)] == [rolled.app_name]
    assert [x["graceful"] for x in stop(cfg, timeout_s=120)["stopped"]] == [True]


def _check_handoff(cfg: RelayConfig, ledger: Ledger, url: str, result: dict, older: set[int]) -> Instance:
    """After a handoff from instances ``older`` to ``result``'s green: the table equals the counts
    of every record in Kafka, and a window spanning H holds green's count (green's generation)."""
    wait_for("green to catch up", lambda: caught_up(cfg, ledger), timeout=240, interval=1)
    green = ledger.instance(result["green_id"])
    expected, records = kafka_windows(cfg)
    got = table(url)
    assert {k: v[0] for k, v in got.items()} == expected, "the counts differ from a run without an upgrade"
    log = driver_stdout(cfg, green.submission_id or "")
    shadow = re.findall(r"shadow batch \d+ \(warm-up, nothing written\): (\d+) updated row", log)
    assert shadow and "caught up: READY" in log, "green built no state before the handoff"
    assert result.get("green_planned") is not None, result
    assert {v[1] for v in got.values()} == {STATE_TOPIC}
    gens = {i: max(lease.id for lease in ledger.leases(i)) for i in older | {green.id}}
    assert max(gens.values()) == gens[green.id], f"green's generation is not the newest: {gens}"
    h = {int(p): o for p, o in result["handoff"].items()}
    before = {(w, word) for p, off, w, word in records if off < h[p]}
    after = {(w, word) for p, off, w, word in records if off >= h[p]}
    spanning = before & after
    assert spanning, (
        "no window got records on both sides of H: the test proves nothing; "
        f"H {h}, windows before {sorted(before)[-3:]}, after {sorted(after)[:3]}, "
        f"records at or past H {len([r for r in records if r[1] >= h[r[0]]])} of {len(records)}"
    )
    assert [k for k in spanning if got[k][2] == gens[green.id]], (
        f"no window spanning H holds green's count {gens}"
    )
    assert {v[2] for v in got.values()} <= set(gens.values())
    return green
