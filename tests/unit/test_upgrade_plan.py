"""``relay upgrade --plan``: what an upgrade would do, said before anything changes, and why it can't.

A real SQLite ledger in a tmp dir; the Spark master and (unless a test fakes it) Kafka point at closed
ports, as in a unit test nothing runs. The plan must change nothing: the ledger's every row and the
artifacts folder are compared before and after.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay.artifacts import artifact, artifacts_dir, build_artifact, current_code_hash
from relay.cli.render import iso_time, render
from relay.config import RelayConfig, load_config
from relay.errors import ConfigError
from relay.ledger.models import Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations import upgrade_plan
from relay.operations.upgrade_plan import plan_upgrade
from relay.operations.upgrade_steps import ALL_TERMINAL
from rich.console import Console

from tests.conftest import free_port
from tests.ledger_builder import LedgerBuilder
from tests.ledger_state import ledger_state, seeded_ledger
from tests.unit.test_cli_errors import RELAY, assert_one_line

P = "p"


@pytest.fixture()
def config(tmp_path: Path) -> RelayConfig:
    closed = free_port()
    return load_config(
        {
            "RELAY_DATA_DIR": str(tmp_path / "data"),
            "RELAY_PIPELINE": P,
            "RELAY_TOPIC": P,
            "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}",
            "RELAY_SPARK_MASTER_UI_URL": f"http://127.0.0.1:{closed}",
            "RELAY_SPARK_REST_URL": f"http://127.0.0.1:{closed}",
            "RELAY_MAX_OFFSETS_PER_TRIGGER": "777",
        }
    )


@pytest.fixture()
def ledger(config: RelayConfig) -> Iterator[Ledger]:
    led = Ledger(config.ledger_url, create=True)
    yield led
    led.close()


class FakeKafka:
    """KafkaOffsets answering Kafka's latest offsets (``LATEST``) without a broker."""

    LATEST: dict[int, int] = {}

    def __init__(self, bootstrap: str, timeout_s: float = 10) -> None:
        pass

    def __enter__(self) -> FakeKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def latest(self, topic: str) -> dict[int, int]:
        return dict(self.LATEST)


@pytest.fixture()
def kafka(monkeypatch: pytest.MonkeyPatch) -> type[FakeKafka]:
    monkeypatch.setattr(upgrade_plan, "KafkaOffsets", FakeKafka)
    monkeypatch.setattr(FakeKafka, "LATEST", {0: 100, 1: 50})
    return FakeKafka


def blue(ledger: Ledger, version: str = "v1", state: InstanceState = InstanceState.ACTIVE) -> Instance:
    """A live instance holding partitions 0 and 1, cursors at 5 and 7."""
    b = LedgerBuilder(ledger, P, P)
    inst = b.instance(version)
    b.lease(inst, 0, 0, 5)
    b.lease(inst, 1, 0, 7)
    ledger.set_instance(inst.id, state=state)
    return ledger.instance(inst.id)


def folders(config: RelayConfig) -> list[str]:
    root = artifacts_dir(config)
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ------------------------------------------------------------------------------- a plan that can run
def test_a_plan_names_both_versions_the_cursors_the_expected_handoff_and_the_gates(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    build_artifact(config, "v1")
    b = blue(ledger)
    db = Path(config.ledger_url.removeprefix("sqlite:///"))
    before = ledger_state(db)

    plan = plan_upgrade(config, "v2", catchup_s=30, max_lag=10, local=True)

    assert plan["blocked"] == []
    assert plan["current"]["instance"] == b.id and plan["current"]["version"] == "v1"
    assert plan["current"]["code_hash"] == artifact(config, "v1").code_hash()
    assert plan["target"]["artifact_exists"] is False
    assert plan["target"]["code_hash"] == current_code_hash(config)  # what the build would freeze
    assert plan["steps"][0] == "build v2 from the current code"
    assert plan["expected_handoff"] == {"0": 100, "1": 50}
    assert [
        (r["partition"], r["blue_cursor"], r["handoff"], r["blue_drains"]) for r in plan["partitions"]
    ] == [
        (0, 5, 100, 95),
        (1, 7, 50, 43),
    ]
    assert plan["gates"] == {
        "grace_s": 300.0,
        "catchup_s": 30.0,
        "max_lag": 10,
        "max_lag_from": "given",
        "drain_timeout_s": 600.0,
    }
    assert plan["checkpoints"]["blue"] == b.checkpoint_dir
    assert plan["checkpoints"]["green"].startswith(f"{config.checkpoints_dir}/instance-")
    assert any("same code as v1" in w for w in plan["warnings"])  # built from this very code
    # Nothing changed: no operation, no instance, no artifact built.
    assert ledger_state(db) == before
    assert folders(config) == ["v1"]


def test_the_lag_bound_defaults_to_one_batch(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    blue(ledger)
    gates = plan_upgrade(config, "v2", local=True)["gates"]
    assert (gates["max_lag"], gates["max_lag_from"]) == (777, "RELAY_MAX_OFFSETS_PER_TRIGGER (one batch)")
    assert plan_upgrade(config, "v2", max_lag=0, local=True)["gates"]["max_lag"] == 0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"grace_s": 0}, "grace must be a number of seconds > 0"),
        ({"grace_s": float("nan")}, "grace must be"),
        ({"catchup_s": -1.0}, "catch-up time must be"),
        ({"drain_timeout_s": float("inf")}, "drain timeout must be"),
        ({"max_lag": -1}, "max lag must be an integer >= 0"),
        ({"max_lag": 1.5}, "max lag must be an integer >= 0"),
        ({"handoff": "soon"}, "handoff must be"),
        ({"version": "../v2"}, "version must be"),
    ],
)
def test_bad_arguments_raise_before_anything_is_read(
    config: RelayConfig, kwargs: dict, expected: str, tmp_path: Path
) -> None:
    missing = config.with_(ledger_url=f"sqlite:///{tmp_path / 'no-ledger.db'}")  # read it: another error
    args = {"version": "v2", **kwargs}
    with pytest.raises(ConfigError, match=re.escape(expected)):
        plan_upgrade(missing, **args)
    assert not (tmp_path / "no-ledger.db").exists()


# ------------------------------------------------------------------------------- blocked, not raised
def test_nothing_running_is_a_blocked_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    plan = plan_upgrade(config, "v2", local=True)
    assert plan["blocked"] == [f"an upgrade needs exactly one running instance of {P}, found: nothing"]
    assert plan["current"] == {} and plan["partitions"] == []
    assert plan["expected_handoff"] == "none (no instance to hand off from)"


def test_two_live_instances_block_the_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    blue(ledger, "v1")
    blue(ledger, "v2", InstanceState.STARTING)
    (reason,) = plan_upgrade(config, "v3", local=True)["blocked"]
    assert reason.startswith(f"an upgrade needs exactly one running instance of {P}, found: instance 1 (v1")
    assert "instance 2 (v2" in reason


def test_the_target_being_the_running_version_blocks_the_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    b = blue(ledger, "v2")
    assert plan_upgrade(config, "v2", local=True)["blocked"] == [f"instance {b.id} already runs version v2"]


def test_a_blue_that_is_not_active_blocks_the_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    b = blue(ledger, "v1", InstanceState.DRAINING)
    assert plan_upgrade(config, "v2", local=True)["blocked"] == [f"instance {b.id} is DRAINING, not ACTIVE"]


def test_an_operation_in_progress_blocks_the_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    blue(ledger)
    op = ledger.open_operation(P, "upgrade", "GREEN_WARMING", {"version": "v3"}, {}, ALL_TERMINAL)
    assert plan_upgrade(config, "v2", local=True)["blocked"] == [
        f"upgrade {op['id']} to v3 is in progress (state GREEN_WARMING): "
        "relay upgrade --version v3 resumes it"
    ]
    ledger.move_operation(op["id"], "DONE")
    rec = ledger.open_operation(P, "recovery", "APPROVED", {}, {}, ALL_TERMINAL)
    assert plan_upgrade(config, "v2", local=True)["blocked"] == [
        f"recovery {rec['id']} is in progress (state APPROVED): finish it first"
    ]


def test_an_unreachable_spark_master_blocks_a_cluster_upgrade(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    blue(ledger)
    (reason,) = plan_upgrade(config, "v2")["blocked"]
    assert reason.startswith("cannot check the Spark master: ")
    assert plan_upgrade(config, "v2", local=True)["blocked"] == []  # a local upgrade never asks it


def test_a_dead_instance_is_named_not_reconciled(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    """The upgrade's inventory would mark it FAILED; the plan only says so."""
    dead = blue(ledger)
    ledger.set_instance(dead.id, created_at=0.0)  # no driver, no attempt, long ago: gone
    plan = plan_upgrade(config, "v2", local=True)
    assert f"instance {dead.id} is live in the ledger but its driver is gone" in " ".join(plan["warnings"])
    assert plan["blocked"] == [f"an upgrade needs exactly one running instance of {P}, found: nothing"]
    assert ledger.instance(dead.id).state is InstanceState.ACTIVE


@pytest.mark.parametrize(
    "setup",
    [
        [],
        [("v1", InstanceState.ACTIVE), ("v2", InstanceState.STARTING)],
        [("v2", InstanceState.ACTIVE)],
        [("v1", InstanceState.DRAINING)],
    ],
    ids=["nothing", "two-live", "same-version", "not-active"],
)
def test_the_upgrade_refuses_with_the_plans_reasons_and_changes_nothing(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka], setup: list[tuple[str, InstanceState]]
) -> None:
    """One judgement: what the plan lists as blocked is what the upgrade's preflight refuses with."""
    from relay.errors import OperationError
    from relay.operations.upgrade import upgrade

    for version, state in setup:
        blue(ledger, version, state)
    blocked = plan_upgrade(config, "v2", local=True)["blocked"]
    assert blocked
    db = Path(config.ledger_url.removeprefix("sqlite:///"))
    before = ledger_state(db)
    with pytest.raises(OperationError) as err:
        upgrade(config, "v2", local=True)
    assert str(err.value) == "; ".join(blocked) + ". Nothing was changed."
    assert ledger_state(db) == before


# ---------------------------------------------------------------------------------- the handoff
def test_an_unreachable_broker_makes_the_handoff_unknown_not_an_error(
    config: RelayConfig, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upgrade_plan, "KAFKA_TIMEOUT_S", 0.3)
    blue(ledger)
    plan = plan_upgrade(config, "v2", local=True)
    assert plan["blocked"] == []
    assert plan["expected_handoff"].startswith("unknown (broker unreachable: Kafka at 127.0.0.1:")
    assert [r["handoff"] for r in plan["partitions"]] == [None, None]
    assert [r["blue_cursor"] for r in plan["partitions"]] == [5, 7]
    assert any("Kafka can't be read now" in w for w in plan["warnings"])
    # An explicit H for every partition of blue's is known without Kafka.
    explicit = plan_upgrade(config, "v2", handoff=json.dumps({P: {"0": 9, "1": 8}}), local=True)
    assert explicit["expected_handoff"] == {"0": 9, "1": 8} and explicit["handoff"] == "explicit"
    assert [r["blue_drains"] for r in explicit["partitions"]] == [4, 1]


def test_an_explicit_handoff_below_blues_cursor_blocks_the_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    blue(ledger)
    plan = plan_upgrade(config, "v2", handoff=json.dumps({P: {"0": 3, "1": 60}}), local=True)
    assert plan["blocked"] == [
        f"handoff offset 3 of {P}[0] is below blue's cursor 5: those offsets are already applied"
    ]
    assert "handoff 60 of partition 1 is past Kafka's latest 50" in plan["warnings"]


# ----------------------------------------------------------------------------------- the contract
def _package(tmp_path: Path, key: list[str], table: str = "users", extra: str = "") -> Path:
    """A user pipeline package of pipeline P whose sink factory upserts ``table`` by ``key``
    (``extra``: more Pipeline arguments, e.g. ``stateful=True, warm_up_s=60``)."""
    name = f"plan_pkg_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "pipeline.py").write_text(
        textwrap.dedent(
            f"""
            import os
            from relay.pipeline import Pipeline
            from relay.sinks.postgres_upsert import PostgresUpsertSink

            TABLE = {table!r}

            def sink():
                return PostgresUpsertSink(os.environ["PLAN_SINK_URL"], table=TABLE, key={key!r})

            PIPELINE = Pipeline({P!r}, ({P!r},), lambda df: df, sink, secret_env=("PLAN_SINK_URL",){extra})
            """
        )
    )
    return folder


@pytest.fixture()
def sink_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PLAN_SINK_URL", "postgresql://writer@127.0.0.1:1/app")
    loaded = set(sys.modules)
    yield
    for name in set(sys.modules) - loaded:
        if name.startswith("plan_pkg_"):
            del sys.modules[name]


def _changes(plan: dict) -> dict[str, tuple]:
    return {r["field"]: (r["current"], r["target"]) for r in plan["contract"] if r["changed"]}


def test_the_contract_diff_names_sink_and_key_changes(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka], tmp_path: Path, sink_env: None
) -> None:
    build_artifact(config, "v1")  # no code: the counter
    build_artifact(config, "v2", pipeline_code=_package(tmp_path, ["id"]))
    build_artifact(config, "v3", pipeline_code=_package(tmp_path, ["id", "region"]))
    b = blue(ledger, "v1")

    plan = plan_upgrade(config, "v2", local=True)
    assert plan["blocked"] == []
    assert _changes(plan) == {
        "sink": ("LedgerMessagesSink", "PostgresUpsertSink"),
        "sink_target": ("messages", "users"),
        "secret_env": ([], ["PLAN_SINK_URL"]),
    }
    assert plan["current"]["code_hash"] != plan["target"]["code_hash"]

    ledger.set_instance(b.id, version="v2")
    plan = plan_upgrade(config, "v3", local=True)
    assert _changes(plan) == {"key": (["id"], ["id", "region"])}
    assert "key changes: ['id'] -> ['id', 'region']" in plan["warnings"]
    assert {r["field"]: r["changed"] for r in plan["contract"]}["stateful"] is False


def test_the_plan_says_when_the_target_is_stateful_and_how_far_back_green_starts(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka], tmp_path: Path, sink_env: None
) -> None:
    build_artifact(config, "v1", pipeline_code=_package(tmp_path, ["id"]))
    b = blue(ledger, "v1")
    ledger.set_instance(b.id, pipeline=P)
    build_artifact(
        config, "v2", pipeline_code=_package(tmp_path, ["id"], extra=", stateful=True, warm_up_s=90")
    )
    plan = plan_upgrade(config, "v2", local=True)
    assert plan["blocked"] == []
    assert _changes(plan) == {"stateful": (False, True), "warm_up_s": (0, 90)}


def test_a_field_an_old_artifact_did_not_record_is_unknown(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    old = build_artifact(config, "v1")
    meta = old.metadata()
    del meta["stateful"], meta["code_hash"]
    (old.folder / "artifact.json").write_text(json.dumps(meta))
    build_artifact(config, "v2")
    blue(ledger, "v1")
    plan = plan_upgrade(config, "v2", local=True)
    row = next(r for r in plan["contract"] if r["field"] == "stateful")
    assert (row["current"], row["target"], row["changed"]) == (None, False, None)
    assert plan["current"]["code_hash"] == plan["target"]["code_hash"]  # recomputed from the zip


def test_a_target_that_cannot_run_here_blocks_the_plan(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka], tmp_path: Path, sink_env: None
) -> None:
    blue(ledger, "v1")
    build_artifact(config, "v2", pipeline_code=_package(tmp_path, ["id"]))
    other = config.with_(pipeline="q", topic="q")
    blue_q = LedgerBuilder(ledger, "q", "q").instance("v1")
    ledger.set_instance(blue_q.id, state=InstanceState.ACTIVE)
    (reason,) = plan_upgrade(other, "v2", local=True)["blocked"]
    assert reason.startswith(
        f"version v2 is pipeline {P} on topic(s) ['{P}'], but Relay is configured for pipeline q"
    )
    broken = config.with_(pipeline_code=tmp_path / "not-a-package")
    (reason,) = plan_upgrade(broken, "v3", local=True)["blocked"]
    assert (
        reason.startswith("the current code can't be built as v3: ") and "is not a pipeline package" in reason
    )
    assert folders(config) == ["v2"]


# ------------------------------------------------------------------------------------ shown, CLI
def test_a_plan_is_shown_as_a_verdict_tables_and_steps(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    build_artifact(config, "v1")
    blue(ledger, "v1")
    plan = plan_upgrade(config, "v1", local=True)
    out = io.StringIO()
    render("upgrade", plan, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert text.startswith(f"Upgrade plan for {P} (topic {P}): v1 -> v1: BLOCKED; nothing was changed")
    assert "blocked: instance 1 already runs version v1" in text
    assert re.search(r"sink_target\s+messages\s+messages\s+same", text)
    assert re.search(r"\s0\s+5\s+100\s+100\s+95", text)
    assert iso_time(artifact(config, "v1").built_at) in text
    assert "1. start green (v1, green) as a warm standby" in text


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    closed = free_port()
    return {
        "PATH": str(Path(sys.executable).parent),
        "RELAY_DATA_DIR": str(tmp_path / "data"),
        "RELAY_LEDGER_URL": seeded_ledger(tmp_path / "ledger.db"),
        "RELAY_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}",
        "RELAY_SPARK_MASTER_UI_URL": f"http://127.0.0.1:{closed}",
        "RELAY_SPARK_REST_URL": f"http://127.0.0.1:{closed}",
    }


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELAY, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_relay_upgrade_plan_changes_nothing_and_exits_4_when_blocked(
    env: dict[str, str], tmp_path: Path
) -> None:
    before = ledger_state(tmp_path / "ledger.db")
    result = run(["upgrade", "--version", "v2", "--plan", "--local", "--json"], env)
    assert result.returncode == 4, result.stderr
    plan = json.loads(result.stdout)
    assert plan["kind"] == "upgrade plan" and plan["blocked"] == ["instance 1 is STARTING, not ACTIVE"]
    assert plan["gates"]["catchup_s"] == 120.0 and plan["gates"]["max_lag"] == 20000  # DEFAULT_GATE_LAG
    assert ledger_state(tmp_path / "ledger.db") == before
    assert not (tmp_path / "data" / "artifacts").exists()


GATE_ERRORS = [
    (
        ["upgrade", "--version", "v2", "--catchup-timeout", "0"],
        "argument --catchup-timeout: must be a number > 0",
    ),
    (
        ["upgrade", "--version", "v2", "--max-lag", "-1"],
        "argument --max-lag: must be an integer >= 0, got '-1'",
    ),
    (["upgrade", "--version", "v2", "--max-lag", "1.5"], "argument --max-lag: must be an integer >= 0"),
    (["rollback", "--to", "../v1"], "relay rollback: argument --to: version must be"),
    (["rollback", "--grace", "nan"], "relay rollback: argument --grace: must be a number > 0"),
    (["rollback", "--catchup-timeout", "-5"], "argument --catchup-timeout: must be a number > 0"),
    (["rollback", "--handoff", "soon"], 'relay rollback: argument --handoff: must be "latest"'),
    (["versions", "--keep", "3"], "relay: unrecognized arguments: --keep 3"),
]


@pytest.mark.parametrize(("args", "expected"), GATE_ERRORS, ids=[" ".join(a) for a, _ in GATE_ERRORS])
def test_a_bad_gate_option_is_one_line_and_exit_2(
    args: list[str], expected: str, env: dict[str, str], tmp_path: Path
) -> None:
    before = ledger_state(tmp_path / "ledger.db")
    assert_one_line(run(args, env), 2, expected)
    assert ledger_state(tmp_path / "ledger.db") == before
    assert not (tmp_path / "data").exists()


def test_grace_is_described_as_the_warm_standby_wait(env: dict[str, str]) -> None:
    for command in ("upgrade", "rollback"):
        text = " ".join(run([command, "--help"], env).stdout.split())
        assert "seconds for green to report READY (warm standby)" in text
        assert "--catchup-timeout" in text and "--max-lag" in text and "--plan" in text


# ------------------------------------------------------------------------ scale, hot standby
def test_a_scale_is_the_running_version_with_other_resources_and_the_same_ones_block_it(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    from relay.operations.scale import scale, target_resources

    b = blue(ledger, "v2")
    now = config.resources()
    assert target_resources(now, 3)["cores_max"] == 3 * now["executor_cores"]
    with pytest.raises(ConfigError, match="executor memory must be a Spark size"):
        target_resources(now, 2, executor_memory="lots")
    with pytest.raises(ConfigError, match="executors must be an integer"):
        target_resources(now, 0)
    plan = scale(config, 2, plan=True, local=True)
    assert plan["kind"] == "scale plan" and plan["blocked"] == []
    assert (plan["resources_before"]["cores_max"], plan["resources_after"]["cores_max"]) == (1, 2)
    same = scale(config, now["cores_max"], plan=True, local=True)
    assert same["blocked"] == [f"instance {b.id} already runs with {now}"]
    # An instance keeps what a scale gave it: a scale back is measured from there.
    ledger.set_instance(b.id, resources={"cores_max": 2})
    assert scale(config, 2, plan=True, local=True)["blocked"] == [
        f"instance {b.id} already runs with {config.with_resources({'cores_max': 2}).resources()}"
    ]
    assert scale(config, 1, plan=True, local=True)["blocked"] == []


def test_a_waiting_hot_standby_does_not_block_an_upgrade_it_is_stopped_first(
    config: RelayConfig, ledger: Ledger, kafka: type[FakeKafka]
) -> None:
    blue(ledger, "v1")
    with ledger.tx() as conn:
        standby = ledger.create_instance(
            conn, P, "v1", Color.GREEN, "", f"relay-{P}-9", InstanceState.READY, role="hot-standby"
        )
    plan = plan_upgrade(config, "v2", local=True)
    assert plan["blocked"] == []
    assert f"hot standby {standby.id} is stopped first; the next health check starts one" in plan["warnings"]
