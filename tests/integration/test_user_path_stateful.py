"""A stateful pipeline (examples/window_counts) upgraded, stopped and redeployed, then recovered, under
load, on a PostgreSQL ledger; the table checked with SQL against every record in Kafka after each.

Issue #29: a new instance (a deploy after a stop, a recovery's fresh instance) started with empty
state but a newer writer generation, so its partial counts overwrote complete ones (10 of 95 rows
undercounted after a redeploy, 15 after a recovery). Now it warms its state up from ``warm_up_s``
before its cursor, writing nothing, and the table must equal a run without any restart. A window
that got records on both sides of the new instance's start, held by the new instance, proves the
test saw the case that used to break.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.artifacts import build_artifact
from relay.audit import audit, render
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.recover import recover
from relay.operations.stop import stop
from relay.operations.upgrade import UpgradeState, upgrade
from relay_dev.bench.context import driver_stdout

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, example_package, pipeline_run
from tests.integration.json_users import sink_database
from tests.integration.test_stateful_upgrade import (
    EXAMPLE,
    WINDOW_S,
    WordLoad,
    _check_handoff,
    kafka_windows,
    send_words,
    table,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def windows(
    stack: RelayConfig, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RelayConfig, Path, str]]:
    name = f"w{uuid.uuid4().hex[:8]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=postgres_url, max_offsets_per_trigger=5000)
    package = example_package(EXAMPLE, cfg.data_dir / f"{name}-project", cfg, "window_counts")
    code = package / "pipeline.py"  # wider windows: one of them surely spans each restart
    code.write_text(code.read_text().replace('WINDOW = "10 seconds"', f'WINDOW = "{WINDOW_S} seconds"'))
    url = sink_database(postgres_url, EXAMPLE / "schema.sql")
    monkeypatch.setenv("WINDOW_COUNTS_SINK_URL", url)
    with pipeline_run(cfg):
        yield cfg, package, url


def test_a_redeployed_or_recovered_stateful_pipeline_counts_every_window_whole(
    windows: tuple[RelayConfig, Path, str],
) -> None:
    cfg, package, url = windows
    ledger = Ledger(cfg.ledger_url)
    v1, version = f"{cfg.pipeline}-s1", f"{cfg.pipeline}-s2"
    build_artifact(cfg, v1, pipeline_code=package)
    build_artifact(cfg, version, pipeline_code=package)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    send_words(cfg, 400)
    blue = deploy(cfg, version=v1, wait_s=300)["instance_id"]
    wait_for("the backlog to be counted", lambda: caught_up(cfg, ledger), timeout=240, interval=1)

    # An upgrade under load: green warms up in shadow before the handoff (relay.pipeline.stateful).
    with WordLoad(cfg):
        result = upgrade(cfg, version, grace_s=300, drain_timeout_s=240)
        assert result["state"] == UpgradeState.DONE.value, result
        send_words(cfg, 100)  # windows open at H keep getting records after it
    first = _check_handoff(cfg, ledger, url, result, {blue}).id

    # Stopped and deployed again while records keep coming: a new instance, a new checkpoint.
    with WordLoad(cfg):
        _applied_more(ledger, cfg.pipeline, 150)  # windows get records on both sides of the restart
        assert [x["graceful"] for x in stop(cfg, timeout_s=120)["stopped"]] == [True]
        send_words(cfg, 100)  # arrives while nothing runs
        second = deploy(cfg, version=version, wait_s=300)["instance_id"]
        send_words(cfg, 100, rate=50.0)
    _check_new_writer(cfg, ledger, url, second, {blue, first})

    # A recovery (nothing deleted: strategy earliest resumes at the cursors) on an archived checkpoint.
    with WordLoad(cfg):
        _applied_more(ledger, cfg.pipeline, 150)
        result = recover(cfg, strategy="earliest", dry_run=False, reason="test: a fresh instance", wait_s=300)
        send_words(cfg, 100, rate=50.0)
    assert result["state"] == "EXECUTED", result
    _check_new_writer(cfg, ledger, url, result["instance_id"], {blue, first, second})

    report = audit(cfg, ledger, deep=True, sink=True)  # relay audit --deep: it reads the sink too
    assert report.ok, render(report.to_json())
    assert report.sink is not None and report.sink.kind == "stateful" and report.sink.counts["ok"] > 0
    assert [x["graceful"] for x in stop(cfg, timeout_s=120)["stopped"]] == [True]


def _applied_more(ledger: Ledger, pipeline: str, records: int) -> None:
    """Wait until the running instance applied ``records`` more (the load reached the table)."""

    def applied() -> int:
        return sum(lease.next_offset - lease.start_offset for lease in ledger.pipeline_leases(pipeline))

    target = applied() + records
    wait_for(f"{records} more records applied", lambda: applied() >= target, timeout=120, interval=0.5)


def _check_new_writer(cfg: RelayConfig, ledger: Ledger, url: str, new: int, older: set[int]) -> None:
    """The table equals the counts of every record in Kafka; a window spanning the new instance's
    start holds its count, and it built its state before writing."""
    wait_for("the new instance to catch up", lambda: caught_up(cfg, ledger), timeout=240, interval=1)
    expected, records = kafka_windows(cfg)
    got = table(url)
    wrong = {k: (got.get(k, (None,))[0], n) for k, n in expected.items() if got.get(k, (None,))[0] != n}
    assert not wrong and set(got) == set(expected), f"(stored, in Kafka) of the windows that differ: {wrong}"
    inst = ledger.instance(new)
    log = driver_stdout(cfg, inst.submission_id or "")
    assert "state warms up from" in log, "the new instance did not warm its state up"
    gens = {i: max(lease.id for lease in ledger.leases(i)) for i in older | {new}}
    assert max(gens.values()) == gens[new], gens
    start = {lease.partition: lease.start_offset for lease in ledger.leases(new)}
    before = {(w, word) for p, off, w, word in records if off < start[p]}
    after = {(w, word) for p, off, w, word in records if off >= start[p]}
    spanning = [k for k in before & after if got[k][2] == gens[new]]
    assert spanning, f"no window spanning the start {start} holds the new instance's count: proves nothing"
