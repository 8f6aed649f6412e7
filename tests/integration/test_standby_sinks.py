"""Hot standby failover with each sink users run besides Kafka (issue #18 on #15's sinks): the
examples json_upsert (PostgresUpsertSink), counter (LedgerMessagesSink) and foreach_batch_files
(ForEachBatch), each on a PostgreSQL ledger with ``standby = "hot"`` under a steady load. The active's
Python driver is SIGKILLed, anywhere or at the worst moment (its batch written, not committed: the
standby's first batch, planned to another end, must not leave that write beside its own; ``make
test`` runs that moment for the upsert and ForEachBatch); the standby must take over and commit,
the load runs on a little, then stops; once caught up, the sink's content is read from outside Relay
(SQL, or the files) and must hold every input record exactly once. The failover row and the old
instance FENCED are checked, and the audit the example's own test runs. One stack, one worker: a
driver kill needs no second host (tests/integration/test_hot_standby.py loses a whole host with the
Kafka sink).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from relay.artifacts import build_artifact
from relay.audit import audit, render
from relay.config import PROJECT_ROOT, RelayConfig
from relay.crashpoints import CRASH_ONCE_DIR_ENV, arm_once
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.standby import failovers
from relay.operations.stop import stop

from tests.conftest import wait_for
from tests.integration.helpers import Load, caught_up, example_package, pipeline_run, python_driver_pid
from tests.integration.json_users import IDS, expected, libpq, produce_versions, sink_database, table
from tests.integration.test_foreach_batch_pipeline import files, kept
from tests.integration.test_foreach_batch_pipeline import produce as produce_logs
from tests.integration.test_hot_standby import _ready_standby, _taken_over

pytestmark = pytest.mark.integration
EXAMPLES = PROJECT_ROOT / "examples"


@dataclass
class Case:
    """One example on the test's pipeline: its load and the outside check of its sink."""

    version: str
    load: Load
    check: Callable[[Ledger, int], None]


# ------------------------------------------------------------------------------ json_upsert
class UpsertLoad(Load):
    """Every id once per version (200 records and a junk one a round), at 400 records/s."""

    def __init__(self, cfg: RelayConfig, first_version: int) -> None:
        super().__init__(cfg)
        self.version = first_version

    def send_some(self) -> int:
        sent = produce_versions(
            self.cfg.kafka_bootstrap, self.cfg.topic, range(self.version, self.version + 1), 400.0
        )
        self.version += 1
        return sent


def upsert_case(cfg: RelayConfig, folder: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Case:
    sink_url = sink_database(postgres_url)
    monkeypatch.setenv("JSON_UPSERT_SINK_URL", sink_url)  # where deploy runs: copied to both drivers
    code = example_package(EXAMPLES / "json_upsert", folder, cfg, "json_upsert")
    build_artifact(cfg, f"{cfg.pipeline}-v1", pipeline_code=code)
    seeded = produce_versions(cfg.kafka_bootstrap, cfg.topic, range(0, 1))
    load = UpsertLoad(cfg, 1)

    def check(ledger: Ledger, sent: int) -> None:
        last = load.version - 1
        assert table(sink_url) == expected(last), "each id's newest value, read with SQL"
        with psycopg2.connect(sink_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*), count(DISTINCT id) FROM json_upsert_users")
            assert cur.fetchone() == (IDS, IDS)
        report = audit(cfg, ledger, deep=True, sink=True)  # relay audit --deep: it reads the table
        assert report.ok, render(report.to_json())
        assert report.sink is not None and report.sink.kind == "upsert" and report.sink.counts == {"ok": IDS}
        assert sum(p.applied_once for p in report.partitions) == seeded + sent
        assert report.totals["unread"] == 0 and report.totals["duplicates"] == 0, report.totals

    return Case(f"{cfg.pipeline}-v1", load, check)


# ---------------------------------------------------------------------------------- counter
def counter_case(cfg: RelayConfig, folder: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Case:
    build_artifact(cfg, f"{cfg.pipeline}-v1")  # no pipeline code: the counter, as this pipeline and topic
    seeded = Load(cfg).send_some()

    def check(ledger: Ledger, sent: int) -> None:
        produced = seeded + sent
        with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
            latest = kafka.latest(cfg.topic)
        assert sum(latest.values()) == produced
        with psycopg2.connect(libpq(postgres_url)) as conn, conn.cursor() as cur:  # the ledger's database
            cur.execute(
                'SELECT "partition", "offset", count(*) FROM messages WHERE pipeline = %s'
                ' GROUP BY "partition", "offset"',
                (cfg.pipeline,),
            )
            rows = {(p, o): n for p, o, n in cur.fetchall()}
            cur.execute("SELECT message_count FROM counter_totals WHERE pipeline = %s", (cfg.pipeline,))
            total = cur.fetchone()
        twice = sorted(k for k, n in rows.items() if n > 1)
        every = {(p, o) for p, end in latest.items() for o in range(end)}
        missing, extra = sorted(every - set(rows)), sorted(set(rows) - every)
        assert (twice, missing, extra) == ([], [], []), (
            f"twice {twice[:20]}, missing {missing[:20]}, extra {extra[:20]}"
        )
        assert total == (produced,), f"the counted total {total} for {produced} records sent"
        report = audit(cfg, ledger, deep=True)  # every Kafka record has exactly one messages row
        assert report.ok and report.mode == "deep", render(report.to_json())
        t = report.totals
        assert t["applied_once"] == produced and t["duplicates"] == 0 and t["unread"] == 0, t
        assert report.message_count == report.applied_rows == produced

    return Case(f"{cfg.pipeline}-v1", Load(cfg), check)


# -------------------------------------------------------------------------- foreach_batch_files
class LogLoad(Load):
    """Log lines with the next 50 ids (and a junk value) a round, at 100 records/s."""

    def __init__(self, cfg: RelayConfig, first_id: int) -> None:
        super().__init__(cfg)
        self.next_id = first_id

    def send_some(self) -> int:
        produce_logs(self.cfg.kafka_bootstrap, self.cfg.topic, range(self.next_id, self.next_id + 50), 100.0)
        self.next_id += 50
        return 51


def _holds(batch_dir: Path, record_id: int) -> bool:
    return any(
        json.loads(line)["id"] == record_id
        for p in batch_dir.glob("part-*")
        for line in p.read_text().splitlines()
    )


def foreach_batch_case(
    cfg: RelayConfig, folder: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> Case:
    out = cfg.data_dir / f"{cfg.pipeline}-out"  # executors write here: never /tmp
    monkeypatch.setenv("FOREACH_BATCH_FILES_DIR", str(out))  # copied to both drivers by deploy
    code = example_package(EXAMPLES / "foreach_batch_files", folder, cfg, "foreach_batch_files")
    build_artifact(cfg, f"{cfg.pipeline}-v1", pipeline_code=code)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    produce_logs(cfg.kafka_bootstrap, cfg.topic, range(0, 600))
    load = LogLoad(cfg, 600)

    def check(ledger: Ledger, sent: int) -> None:
        seen, unfinished = files(out, cfg.topic)
        want = kept(range(0, load.next_id))
        twice = sorted(i for i, c in seen.items() if c > 1)
        missing, extra = sorted(want - set(seen)), sorted(set(seen) - want)
        holding = sorted({d.name for i in twice[:1] for d in out.glob("ranges-*") if _holds(d, i)})
        assert (unfinished, twice, missing, extra) == ([], [], [], []), (
            f"unfinished {unfinished}; duplicates {twice[:20]} ({len(twice)}), missing {missing[:20]} "
            f"({len(missing)}), not kept {extra[:20]} ({len(extra)}); id {twice[:1]} is in {holding}"
        )
        report = audit(cfg, ledger)  # the ledger's committed ranges: Relay cannot read the files
        assert report.ok, render(report.to_json())
        assert report.totals["unread"] == 0

    return Case(f"{cfg.pipeline}-v1", load, check)


SETUPS = {"upsert": upsert_case, "counter": counter_case, "foreach_batch": foreach_batch_case}


@pytest.fixture()
def on_postgres(stack: RelayConfig, postgres_url: str) -> Iterator[RelayConfig]:
    """A pipeline and topic of its own on the PostgreSQL ledger, with a hot standby; output files
    it leaves under the stack's data dir removed."""
    name = f"sb{uuid.uuid4().hex[:8]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=postgres_url, standby="hot")
    yield cfg
    shutil.rmtree(cfg.data_dir / f"{name}-out", ignore_errors=True)


WORST = "pipeline.before_ledger_commit"  # the batch's writes done, its cursors not committed


@pytest.mark.parametrize(
    ("sink", "kill"),
    [
        pytest.param("upsert", "sigkill", marks=pytest.mark.slow),
        ("upsert", "before_commit"),  # make test: the worst moment, on the users' commonest sink
        pytest.param("counter", "sigkill", marks=pytest.mark.slow),
        pytest.param("counter", "before_commit", marks=pytest.mark.slow),
        pytest.param("foreach_batch", "sigkill", marks=pytest.mark.slow),
        ("foreach_batch", "before_commit"),  # make test: rule 5, what the example must clean up
    ],
)
def test_a_hot_standby_takes_over_a_killed_driver_and_the_sink_holds_each_record_once(
    sink: str,
    kill: str,
    on_postgres: RelayConfig,
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sigkill``: the active's Python driver SIGKILLed wherever it is; ``before_commit``: it exits hard
    after its batch was written to the sink, before the ledger commit (the standby takes over a
    range written past the cursor)."""
    cfg = on_postgres
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(faults))  # forwarded to the drivers; armed later
    case = SETUPS[sink](cfg, tmp_path, postgres_url, monkeypatch)
    ledger = Ledger(cfg.ledger_url)
    with pipeline_run(cfg):
        result = deploy(cfg, version=case.version, wait_s=300)
        first, standby = result["instance_id"], result["standby"]["instance"]
        assert result["standby"]["started"] and standby is not None, result["standby"]
        assert _ready_standby(ledger, cfg) == standby
        old_app = ledger.instance(first).app_name
        with case.load as load:
            done = len(ledger.recent_batches(cfg.pipeline, 10_000, first))
            wait_for(
                "the active to commit a batch under the load",
                lambda: len(ledger.recent_batches(cfg.pipeline, 10_000, first)) > done,
                timeout=120,
            )
            t0 = time.monotonic()
            if kill == "sigkill":
                _, pid = python_driver_pid(ledger, first)
                os.kill(pid, signal.SIGKILL)
            else:  # only the active runs batches now: it is the one to get there
                arm_once(str(faults), WORST)
                wait_for("the active to exit at " + WORST, lambda: not (faults / WORST).exists(), timeout=120)
            _taken_over(ledger, cfg, standby)
            took = time.monotonic() - t0
            after = len(ledger.recent_batches(cfg.pipeline, 10_000, standby))
            wait_for(
                "the new active to commit more batches under the load",
                lambda: len(ledger.recent_batches(cfg.pipeline, 10_000, standby)) >= after + 2,
                timeout=120,
            )
        wait_for("the last records to be applied", lambda: caught_up(cfg, ledger), timeout=240, interval=1)
        print(f"{sink}, {kill}: the standby's first commit {took:.1f}s after the kill")

        done = [(f["from_instance"], f["to_instance"]) for f in failovers(ledger, cfg.pipeline)]
        assert done == [(first, standby)]
        assert ledger.instance(first).state is InstanceState.FENCED
        wait_for(
            "the killed driver's relaunch (if any) to end: the fenced instance runs nothing",
            lambda: all(a.name != old_app for a in master_apps(cfg, cfg.pipeline)),
            timeout=120,
        )
        case.check(ledger, load.sent)
        stopped = stop(cfg, timeout_s=120)["stopped"]
        assert [(x["instance_id"], x["graceful"]) for x in stopped] == [(standby, True)], stopped
