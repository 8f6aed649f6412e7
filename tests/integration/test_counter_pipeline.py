"""examples/counter, Relay's default pipeline (built without pipeline code, under the test's own
pipeline name and topic), on real parts: noida-db, the Spark cluster, the ledger (SQLite; PostgreSQL
in ``make test-long``), with a Spark task and the driver killed at the worst moments.

The executors write one ``messages`` row per record (its sink's table, in the ledger's database;
dead letters for poison keys) through LedgerMessagesSink; the driver only moves cursors. Two
faults, each armed once (``relay.crashpoints``: the first process to get there exits hard):

- a Spark task dies inside its sink transaction, rows and ranges sent, no COMMIT (Spark retries it);
- the driver dies after its tasks committed a batch in the sink, before the ledger commit (the
  master relaunches it and the batch is replayed: the recorded ranges make the replay a no-op).

Then a blue-green upgrade under load: green's warm-up batch hands the topic's tail (records blue
applied) to the real sink, which must skip every one of them (the table keeps no unique key, so a
write would show as a second row for an offset).

Then the deep audit (every Kafka record has exactly one ``messages`` row or dead letter, counted per
offset) must be clean and the counter's count equal to the records produced.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.artifacts import build_artifact
from relay.audit import audit, render
from relay.config import RelayConfig
from relay.crashpoints import CRASH_ONCE_DIR_ENV, arm_once
from relay.kafka.producer import produce
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.operations.upgrade import UpgradeState, upgrade
from relay.sinks import ledger_messages_tables as counter_tables
from relay.sinks.ledger_messages import CRASH_BEFORE_COMMIT
from relay_dev.bench.context import driver_stdout
from sqlalchemy import func, select

from tests.conftest import wait_for
from tests.integration.helpers import Load, caught_up, pipeline_run, wait_relaunched

pytestmark = pytest.mark.integration

DRIVER_CRASH = "pipeline.before_ledger_commit"  # spark_jobs/pipeline_driver.CRASH_BEFORE_LEDGER_COMMIT


@pytest.fixture()
def counter(pipeline_config: RelayConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[RelayConfig]:
    cfg = pipeline_config
    assert cfg.pipeline_code is None  # Relay's default pipeline: the counter
    folder = cfg.data_dir / f"{cfg.pipeline}-project"
    (folder / "faults").mkdir(parents=True)
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(folder / "faults"))  # forwarded to drivers and executors
    with pipeline_run(cfg):
        yield cfg


def written_past_commit(ledger: Ledger, cfg: RelayConfig, epoch: int) -> list[int]:
    """Partitions where the attempt of ``epoch`` recorded sink ranges past its last ledger commit."""
    r, b = counter_tables.message_ranges, s.batches
    with ledger.tx() as conn:
        sunk = dict(
            conn.execute(
                select(r.c.partition, func.max(r.c.end_offset))
                .where(r.c.pipeline == cfg.pipeline, r.c.epoch == epoch)
                .group_by(r.c.partition)
            ).all()
        )
        committed: dict[int, int] = {}
        for (ranges,) in conn.execute(
            select(b.c.ranges).where(b.c.pipeline == cfg.pipeline, b.c.epoch == epoch)
        ):
            for x in ranges:
                committed[x["partition"]] = max(committed.get(x["partition"], 0), x["to"])
    return sorted(p for p, end in sunk.items() if end > committed.get(p, 0))


@pytest.mark.slow  # make test-long: test_core and make chaos kill the counter; its replays are unit-tested
def test_counter_applies_every_record_once_through_a_task_and_a_driver_crash(
    counter: RelayConfig,
) -> None:
    cfg = counter
    faults = Path(os.environ[CRASH_ONCE_DIR_ENV])
    ledger = Ledger(cfg.ledger_url)
    v1, v2 = f"{cfg.pipeline}-c1", f"{cfg.pipeline}-c2"  # artifacts are per stack: one name per variant
    art = build_artifact(cfg, v1)  # no pipeline code: the counter, as this test's pipeline and topic
    assert art.job_file.name == "pipeline_driver.py" and art.pipeline["module"] == "counter.pipeline"
    assert art.pipeline["sink_declares"]["type"] == "LedgerMessagesSink"
    assert (art.pipeline["name"], art.pipeline["topics"]) == (cfg.pipeline, [cfg.topic])

    # A Spark task dies inside its sink transaction: Spark retries it, the driver never notices.
    arm_once(str(faults), CRASH_BEFORE_COMMIT)
    sent = produce(cfg.kafka_bootstrap, cfg.topic, 600, None, poison=3, partitions=cfg.partitions)
    assert sent["sent"] == 600 and sent["poison"] == 3
    inst_id = deploy(cfg, version=v1, wait_s=300)["instance_id"]
    wait_for("the backlog to be applied", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    assert not (faults / CRASH_BEFORE_COMMIT).exists(), "no task reached the armed crash point"
    assert len(ledger.attempts(inst_id)) == 1, "a task's crash is Spark's business, not a relaunch"

    # The driver dies after its tasks committed a batch in the sink, before the ledger commit.
    arm_once(str(faults), DRIVER_CRASH)
    first = ledger.attempts(inst_id)[0]
    sent2 = produce(cfg.kafka_bootstrap, cfg.topic, 400, None, partitions=cfg.partitions)
    wait_for("the armed driver crash", lambda: not (faults / DRIVER_CRASH).exists(), timeout=120)
    wait_relaunched(ledger, inst_id, first.id, timeout=240)
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    assert written_past_commit(ledger, cfg, first.epoch), "the driver died before its tasks wrote"

    # Blue-green under load: green rehearses a batch over the tail blue applied, writing none of it.
    build_artifact(cfg, v2)
    with Load(cfg) as load:
        result = upgrade(cfg, v2, grace_s=240, drain_timeout_s=240)
    assert result["state"] == UpgradeState.DONE.value, result
    wait_for("green to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    green = ledger.instance(result["green_id"])
    rehearsal = re.search(
        r"warm-up batch: the sink got (\d+) row\(s\), wrote (\d+), skipped (\d+)",
        driver_stdout(cfg, green.submission_id or ""),
    )
    assert rehearsal, "green ran no warm-up batch"
    got, wrote, skipped = map(int, rehearsal.groups())
    assert got > 0 and wrote == 0 and skipped == got, rehearsal.group(0)

    produced = sent["sent"] + sent2["sent"] + load.sent
    report = audit(cfg, ledger, deep=True)
    assert report.ok and report.mode == "deep", render(report.to_json())
    t = report.totals
    assert t["applied_once"] == produced + 3 and t["duplicates"] == 0 and t["dead_letters"] == 3, t
    assert t["unread"] == 0 and t["declared_lost"] == 0, t
    assert report.message_count == report.applied_rows == produced  # the seeds' count check
    assert audit(cfg, ledger).ok  # the committed batch ranges agree
    with ledger.tx() as conn:
        m = counter_tables.messages
        per_offset = (
            select(m.c.partition, m.c.offset)
            .where(m.c.pipeline == cfg.pipeline)
            .group_by(m.c.partition, m.c.offset)
            .having(func.count() > 1)
        )
        assert conn.execute(per_offset).all() == []
    assert [x["graceful"] for x in stop(cfg, timeout_s=120)["stopped"]] == [True]
