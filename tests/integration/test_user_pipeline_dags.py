"""Issue 11's acceptance: a user's pipeline, written only against the public contract in a folder of
its own, is built, deployed, upgraded blue-green to changed code and recovered by the DAGs.

The user's package is a copy of ``examples/json_upsert`` (JSON users upserted by id into PostgreSQL
by the executors) in the test's own folder, declared in a pipelines file beside it; every step is a
DAG run (``dag.test()``) selecting it with the ``pipeline`` param, under a steady load:

- ``relay_deploy`` v1: the DAG builds the artifact from the user's folder and starts it; a Spark task
  dies inside its sink transaction (rows sent, no COMMIT) and Spark retries it; later the driver dies
  after its tasks wrote and before the ledger commit, and the relaunched driver replays the batch;
- the user edits the code (v2 upper-cases names) and ``relay_upgrade`` v2 hands off under load: every
  row written from an offset before H holds v1's lower-case name, from H on v2's upper-case one;
- ``relay_stop``, retention deletes records the pipeline had not read, ``relay_recover`` (approved
  by the trigger) declares them lost and starts a new instance.

At each end the table holds exactly the newest value of every id and the deep audit is clean. Each
of the three runs also writes its OpenLineage events through the provider's file transport: every
event validates against the OpenLineage schema (and each facet against its own), and the task ending
the operation names the topic and the table as the naming spec says, with the version and code hash;
the asset event is the table's AIP-60 URI (issue #19).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from relay.artifacts import artifact
from relay.audit import audit
from relay.config import RelayConfig, load_config
from relay.config.env import config_env
from relay.crashpoints import CRASH_ONCE_DIR_ENV, arm_once
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.operations.inventory import master_apps
from relay.sinks.postgres_upsert import PostgresUpsertSink
from relay_dev.airflow_local import airflow_bin, airflow_env, ensure_airflow_db

from tests.conftest import wait_for
from tests.integration.helpers import Load, caught_up, dag_test, pipeline_run
from tests.integration.json_users import (
    EXAMPLE,
    IDS,
    expected,
    positioned_rows,
    produce_versions,
    table,
    user_name,
)
from tests.lineage_events import expect_operation, file_transport, valid_events

pytestmark = pytest.mark.integration

SINK_ENV = "JSON_UPSERT_SINK_URL"
WAITS = {"grace_seconds": 600, "catchup_seconds": 600, "drain_timeout_seconds": 600}  # 2 shared cores


def _users_package(folder: Path, name: str) -> Path:
    """The example copied as the user's own package, renamed to this test's pipeline and topic."""
    package = folder / name
    shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns("__pycache__"))
    code = package / "pipeline.py"
    text = code.read_text()
    renames = (('TOPIC = "json_upsert"', f'TOPIC = "{name}"'), ('name="json_upsert"', f'name="{name}"'))
    for old, new in renames:
        assert old in text, f"the example no longer has {old!r}"
        text = text.replace(old, new)
    code.write_text(text)
    return package


def _upper_case_names(package: Path) -> None:
    """The user's change for v2: names upper-cased by the transform (a visible v2 write)."""
    code = package / "pipeline.py"
    old = '"topic", "partition", "offset", "v.id", "v.name", "v.score"'
    new = '"topic", "partition", "offset", "v.id", F.upper(F.col("v.name")).alias("name"), "v.score"'
    assert old in code.read_text()
    code.write_text(code.read_text().replace(old, new))


@pytest.fixture()
def users(stack: RelayConfig, postgres_url: str, sink_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    name = f"users{uuid.uuid4().hex[:6]}"
    folder = stack.data_dir / f"{name}-project"
    folder.mkdir()
    package = _users_package(folder, name)
    declared = folder / "pipelines.toml"
    declared.write_text(
        f'[pipelines.{name}]\ntopic = "{name}"\npartitions = 3\npipeline_code = "{name}"\n'
        f'secret_env = ["{SINK_ENV}"]\nmax_offsets_per_trigger = 2000\ntrigger_seconds = 1.0\n'
    )
    env = {k: v for k, v in config_env(stack).items() if k not in ("RELAY_PIPELINE", "RELAY_TOPIC")}
    env.update(RELAY_PIPELINES_FILE=str(declared), RELAY_LEDGER_URL=postgres_url)
    cfg = load_config(env, pipeline=name)
    assert cfg.pipeline_code == package and cfg.topic == name
    (folder / "faults").mkdir()
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(folder / "faults"))  # forwarded to drivers and tasks
    ensure_airflow_db(cfg)
    # The sink's URL lives in Airflow (a Variable in its metastore), not in the environment of the
    # DAG runs: the tasks fill it in themselves and relay copies it to the driver only.
    monkeypatch.delenv(SINK_ENV, raising=False)
    subprocess.run(
        [airflow_bin(), "variables", "set", SINK_ENV, sink_url],
        env=airflow_env(cfg),
        check=True,
        capture_output=True,
        timeout=120,
    )
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    with pipeline_run(cfg):
        yield cfg, package, sink_url


class Updates(Load):
    """Every user updated once per version at ~100 msg/s, version after version from ``first``, on a
    thread for as long as the block runs; ``last`` is the last version sent."""

    def __init__(self, cfg: RelayConfig, first: int) -> None:
        super().__init__(cfg)
        self.last = first - 1

    def send_some(self) -> int:
        version = self.last + 1
        sent = produce_versions(self.cfg.kafka_bootstrap, self.cfg.topic, range(version, version + 1), 100.0)
        self.last = version
        return sent


def _succeeded(run, tasks: int) -> None:  # noqa: ANN001 - helpers.DagTest
    assert run.state == "success", run.output[-6000:]
    assert list(run.tasks.values()) == ["success"] * tasks, run.tasks


def _deep_audit(cfg: RelayConfig, ledger: Ledger, sent: int, lost: int = 0):  # noqa: ANN202
    wait_for("the pipeline to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    report = audit(cfg, ledger, deep=True)
    assert report.ok, report.to_json()
    assert sum(p.applied_once for p in report.partitions) == sent - lost, report.to_json()
    assert sum(p.declared_lost for p in report.partitions) == lost
    assert report.totals["unread"] == 0 and sum(p.duplicates for p in report.partitions) == 0
    return report


def _lineage(cfg: RelayConfig, sink_url: str, dag_id: str, path: Path, version: str, run) -> None:  # noqa: ANN001
    """#19's acceptance on this run: every OpenLineage event valid, the topic and the table named as
    the spec says with the version and code hash, the asset event on the table's AIP-60 URI."""
    host, port = cfg.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    pg = urlsplit(sink_url)
    db = pg.path.lstrip("/")
    facet = (cfg.pipeline, version, artifact(cfg, version).code_hash())
    source, table_ = (
        (f"kafka://{host}:{port}", cfg.topic),
        (f"postgres://{pg.hostname}:{pg.port}", f"{db}.public.json_upsert_users"),
    )
    expect_operation(dag_id, valid_events(path), source, table_, facet)
    assert [a["uri"] for a in run.asset_events] == [
        f"postgres://{pg.hostname}:{pg.port}/{db}/public/json_upsert_users"
    ]
    assert run.asset_events[0]["extra"]["version"] == version


def test_users_pipeline_is_deployed_upgraded_and_recovered_by_the_dags(users, tmp_path: Path) -> None:  # noqa: ANN001
    cfg, package, sink = users
    ledger = Ledger(cfg.ledger_url)
    pick = {"pipeline": cfg.pipeline}
    lineage = {d: tmp_path / f"{d}.jsonl" for d in ("relay_deploy", "relay_upgrade", "relay_recover")}

    faults = Path(os.environ[CRASH_ONCE_DIR_ENV])
    arm_once(str(faults), "pg_sink.before_commit")  # the first task to get there dies before COMMIT
    sent = produce_versions(cfg.kafka_bootstrap, cfg.topic, range(3))
    run = dag_test(
        cfg,
        "relay_deploy",
        {**pick, "version": "v1", "wait_seconds": 600},
        env=file_transport(lineage["relay_deploy"]),
    )
    _succeeded(run, 3)
    _lineage(cfg, sink, "relay_deploy", lineage["relay_deploy"], "v1", run)
    assert "JSON_UPSERT_SINK_URL from Airflow Variables (masked)" in run.output
    assert sink not in run.output, "the sink's URL must be masked in the task's log"
    assert run.asset_events[0]["uri"] == PostgresUpsertSink(sink, "json_upsert_users", ["id"]).dataset().uri
    blue = ledger.instances(cfg.pipeline)[0]
    assert blue.version == "v1"
    _deep_audit(cfg, ledger, sent)
    assert not (faults / "pg_sink.before_commit").exists(), "no task reached the armed crash point"
    assert table(sink) == expected(2)
    assert [a.state.value for a in ledger.attempts(blue.id)] == ["RUNNING"], "a task crash is Spark's"

    # The driver dies after its tasks wrote a batch, before the ledger commit: the batch is replayed.
    arm_once(str(faults), "pipeline.before_ledger_commit")
    sent += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(3, 5))
    wait_for(
        "the armed driver crash", lambda: not (faults / "pipeline.before_ledger_commit").exists(), timeout=120
    )
    wait_for("the relaunched driver", lambda: len(ledger.attempts(blue.id)) == 2, timeout=240)
    _deep_audit(cfg, ledger, sent)
    assert table(sink) == expected(4)

    # The user changes the code; the upgrade DAG builds v2 from it and hands off under load.
    _upper_case_names(package)
    with Updates(cfg, 5) as load:
        conf = {**pick, "version": "v2", **WAITS}
        run = dag_test(cfg, "relay_upgrade", conf, env=file_transport(lineage["relay_upgrade"]))
    _succeeded(run, 9)
    _lineage(cfg, sink, "relay_upgrade", lineage["relay_upgrade"], "v2", run)
    sent += load.sent
    op = ledger.operations(cfg.pipeline, "upgrade", 1)[0]
    assert op["state"] == "DONE", op
    green = ledger.instance(op["data"]["green_id"])
    assert (green.version, ledger.instance(blue.id).state.value) == ("v2", "STOPPED")
    assert [a.name for a in master_apps(cfg, cfg.pipeline)] == [green.app_name]
    _deep_audit(cfg, ledger, sent)
    h = {int(p): o for p, o in op["data"]["handoff"].items()}
    final = expected(load.last)
    for uid, name, partition, offset in positioned_rows(sink):
        plain = final[uid][0]
        assert name == (plain.upper() if offset >= h[partition] else plain), (uid, partition, offset, h)
    v = load.last + 1  # a round after the upgrade: every newest row is v2's
    sent += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(v, v + 1))
    _deep_audit(cfg, ledger, sent)
    assert table(sink) == {i: (n.upper(), s) for i, (n, s) in expected(v).items()}

    # Stopped; retention deletes records it never read; the recovery declares them lost.
    _succeeded(dag_test(cfg, "relay_stop", {**pick, "timeout_seconds": 120}), 2)
    sent += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(v + 1, v + 3))
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        latest = kafka.latest(cfg.topic)
        kafka.delete_records(cfg.topic, {0: latest[0] - 20})
    cursor0 = max(lease.next_offset for lease in ledger.pipeline_leases(cfg.pipeline) if lease.partition == 0)
    lost = latest[0] - 20 - cursor0
    assert lost > 0
    conf = {**pick, "strategy": "earliest", "dry_run": False, "pre_approved": True, "reason": "users test"}
    run = dag_test(cfg, "relay_recover", conf, env=file_transport(lineage["relay_recover"]))
    _succeeded(run, 8)
    _lineage(cfg, sink, "relay_recover", lineage["relay_recover"], "v2", run)
    recovered = ledger.operations(cfg.pipeline, "recovery", 1)[0]["data"]["instance_id"]
    assert ledger.instance(recovered).version == "v2"
    assert [a.name for a in master_apps(cfg, cfg.pipeline)] == [ledger.instance(recovered).app_name]
    report = _deep_audit(cfg, ledger, sent, lost)
    assert [p.declared_lost for p in report.partitions] == [lost, 0, 0]
    sent += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(v + 3, v + 4))
    _deep_audit(cfg, ledger, sent, lost)
    assert table(sink) == {i: (user_name(i, v + 3).upper(), v + 3 + i / 1000) for i in range(IDS)}

    _succeeded(dag_test(cfg, "relay_stop", {**pick, "timeout_seconds": 120}), 2)
    assert master_apps(cfg, cfg.pipeline) == []
