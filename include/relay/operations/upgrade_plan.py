"""What an upgrade will do, said before anything changes: ``relay upgrade --plan``.

Why on its own: an upgrade nobody can preview is one nobody notices until it went wrong. The plan
reads what the upgrade would read (the ledger, the Spark master, Kafka, both artifacts) and changes
nothing: no operation is opened, the inventory runs without reconciling (a dead instance is named,
not marked FAILED) and no artifact is built. A pipeline that can't be upgraded gets a plan that says
why (``blocked``) instead of an error; only bad arguments raise. Kafka is optional: unreachable, the
expected handoff is "unknown (...)" and the rest of the plan stands.
"""

from __future__ import annotations

from typing import Any

from relay.artifacts import (
    PIPELINE_DRIVER,
    Artifact,
    artifact,
    build_meta,
    current_code_hash,
    deploy_problems,
    validate_version,
)
from relay.config import RelayConfig
from relay.errors import ConfigError, KafkaError, TopicNotFoundError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import Inventory, take_inventory
from relay.operations.standby import hot_standbys
from relay.operations.upgrade_state import ALL_TERMINAL, check_gates, parse_handoff, resolved_max_lag
from relay.spark.capacity import HOW_TO_MAKE_ROOM, Needs, room_problem

KAFKA_TIMEOUT_S = 5.0  # a plan is read by a person waiting: an unreachable broker makes H unknown
CONTRACT_FIELDS = (
    "pipeline",
    "topics",
    "sink",
    "sink_target",
    "key",
    "stateful",
    "warm_up_s",  # how far back a stateful green starts reading (relay.pipeline.stateful)
    "driver",
    "secret_env",
)


def plan_upgrade(
    config: RelayConfig,
    version: str,
    handoff: str = "latest",
    grace_s: float = 300.0,
    drain_timeout_s: float = 600.0,
    catchup_s: float = 120.0,
    max_lag: int | None = None,
    local: bool = False,
    resources: dict | None = None,
) -> dict:
    """The upgrade of the pipeline to ``version`` as it would run now; changes nothing.

    ``blocked`` lists why it can't run ([]: it can). ConfigError only for bad arguments.
    ``resources``: a scale's (``relay scale --plan``).
    """
    validate_version(version)
    explicit = parse_handoff(handoff, config.topic)
    gates = _gates(config, grace_s, drain_timeout_s, catchup_s, max_lag)
    ledger = Ledger(config.ledger_url)
    inv = take_inventory(config, ledger, reconcile=False)
    blocked: list[str] = []
    warnings: list[str] = []
    blue = judge_blue(config, inv, local, version, blocked, warnings, resources)
    for op in ledger.in_progress(config.pipeline, ALL_TERMINAL):
        blocked.append(in_progress_reason(op))
    target = artifact(config, version)
    current = _current(config, blue)
    tgt = _target(config, target, blocked)
    contract = _contract_diff(current.get("contract"), tgt.get("contract"))
    warnings += [f"{c['field']} changes: {c['current']} -> {c['target']}" for c in contract if c["changed"]]
    if current.get("code_hash") and current["code_hash"] == tgt.get("code_hash"):
        warnings.append(
            f"{version} has the same code as {blue.version if blue else 'blue'}: only the name changes"
        )
    partitions, expected = _handoff(config, ledger, blue, explicit, blocked, warnings)
    return {
        "kind": "upgrade plan",
        "pipeline": config.pipeline,
        "topic": config.topic,
        "version": version,
        "blocked": blocked,
        "current": {k: v for k, v in current.items() if k != "contract"},
        "target": {k: v for k, v in tgt.items() if k != "contract"},
        "contract": contract,
        "handoff": "latest" if explicit is None else "explicit",
        "expected_handoff": expected,
        "partitions": partitions,
        "checkpoints": {
            "blue": blue.checkpoint_dir if blue else "none (no instance)",
            "green": f"{config.checkpoints_dir}/instance-<green's id> (a fresh folder: green starts at H)",
        },
        "gates": gates,
        "steps": _steps(version, tgt, gates, blue),
        "warnings": warnings,
    }


def _gates(
    config: RelayConfig, grace_s: float, drain_timeout_s: float, catchup_s: float, max_lag: int | None
) -> dict[str, Any]:
    check_gates(grace_s, drain_timeout_s, catchup_s, max_lag)
    return {
        "grace_s": float(grace_s),
        "catchup_s": float(catchup_s),
        "max_lag": resolved_max_lag(config, max_lag),
        "max_lag_from": _lag_from(config, max_lag),
        "drain_timeout_s": float(drain_timeout_s),
    }


def _lag_from(config: RelayConfig, max_lag: int | None) -> str:
    if max_lag is not None:
        return "given"
    if config.max_offsets_per_trigger is not None:
        return "RELAY_MAX_OFFSETS_PER_TRIGGER (one batch)"
    return "Relay's default (batches are adaptive)"


def judge_blue(
    config: RelayConfig,
    inv: Inventory,
    local: bool,
    version: str,
    blocked: list[str],
    warnings: list[str],
    resources: dict | None = None,
) -> Instance | None:
    """The instance the upgrade would replace (None when there isn't exactly one); the reasons an
    upgrade must refuse go to ``blocked``. The plan shows them all; the preflight raises them.
    ``resources``: green's own Spark resources (``relay scale``: the same version, other resources)."""
    if inv.master_error and not local:
        blocked.append(f"cannot check the Spark master: {inv.master_error}")
    waiting = hot_standbys(inv.live)  # stopped by the preflight, before green starts
    warnings += [f"hot standby {i.id} is stopped first; the next health check starts one" for i in waiting]
    live = [i for i in inv.live if i not in waiting]
    apps = [a for a in inv.apps if a.name not in {i.app_name for i in waiting}]
    if len(live) != 1 or inv.unknown_apps or (not local and not inv.master_error and len(apps) != 1):
        blocked.append(
            f"an upgrade needs exactly one running instance of {config.pipeline}, found: {inv.describe()}"
        )
    warnings += [
        f"instance {i.id} is live in the ledger but its driver is gone: the upgrade marks it FAILED first"
        for i in inv.dead
    ]
    active = [i for i in live if i.state is InstanceState.ACTIVE]
    blue = active[0] if len(active) == 1 else live[0] if len(live) == 1 else None
    if blue is not None and blue.state is not InstanceState.ACTIVE:
        blocked.append(f"instance {blue.id} is {blue.state.value}, not ACTIVE")
    if blue is not None and resources is None and blue.version == version:
        blocked.append(f"instance {blue.id} already runs version {version}")
    if blue is not None and resources is not None:
        now = config.with_resources(blue.resources).resources()
        if config.with_resources(resources).resources() == now:
            blocked.append(f"instance {blue.id} already runs with {now}")
    if not local and inv.master is not None:
        # Green must run beside blue until the handoff: without room it would wait for blue's cores.
        problem = room_problem(inv.master, Needs.of(config.with_resources(resources)))
        if problem:
            blocked.append(f"green can't start beside blue: {problem}; {HOW_TO_MAKE_ROOM}")
    return blue


def in_progress_reason(op: dict) -> str:
    """Why nothing new starts while ``op`` (an upgrade or a recovery) is in progress."""
    if op["kind"] == "upgrade":
        v = op["params"].get("version")
        return (
            f"upgrade {op['id']} to {v} is in progress (state {op['state']}): "
            f"relay upgrade --version {v} resumes it"
        )
    return f"{op['kind']} {op['id']} is in progress (state {op['state']}): finish it first"


def _current(config: RelayConfig, blue: Instance | None) -> dict[str, Any]:
    if blue is None:
        return {}
    art = artifact(config, blue.version)
    found = art.exists()
    return {
        "instance": blue.id,
        "state": blue.state.value,
        "color": blue.color.value,
        "version": blue.version,
        "code_hash": art.code_hash() if found else None,
        "built_at": art.built_at if found else None,
        "artifact": str(art.folder)
        if found
        else "gone (pruned, or built elsewhere): its contract is unknown",
        "contract": _artifact_contract(art) if found else None,
    }


def _target(config: RelayConfig, art: Artifact, blocked: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"version": art.version, "artifact_exists": art.exists()}
    if art.exists():
        blocked += deploy_problems(config, art.version, art.pipeline)
        return {
            **out,
            "code_hash": art.code_hash(),
            "built_at": art.built_at,
            "artifact": str(art.folder),
            "contract": _artifact_contract(art),
        }
    code = config.pipeline_code
    out["artifact"] = (
        f"not built: the upgrade builds it from the current code ({code or 'the counter, by default'})"
    )
    try:
        _, meta = build_meta(config)
        out["code_hash"] = current_code_hash(config)
    except (ConfigError, OSError) as exc:
        blocked.append(f"the current code can't be built as {art.version}: {exc}")
        return out
    blocked += deploy_problems(config, art.version, meta)
    stateful = bool(meta.get("stateful"))  # what build_artifact will record
    out["contract"] = _contract(meta, PIPELINE_DRIVER, stateful)
    return out


def _artifact_contract(art: Artifact) -> dict[str, Any]:
    meta = art.metadata()
    return _contract(meta.get("pipeline") or {}, meta.get("driver", PIPELINE_DRIVER), meta.get("stateful"))


def _contract(meta: dict, driver: str, stateful: bool | None) -> dict[str, Any]:
    """The pipeline contract an artifact freezes (None: unknown, e.g. an artifact built before
    Relay recorded that field)."""
    declares = meta.get("sink_declares") or {}
    return {
        "pipeline": meta.get("name"),
        "topics": meta.get("topics"),
        "sink": declares.get("type") or (None if meta.get("sink") == "function" else meta.get("sink")),
        "sink_target": declares.get("target"),
        "key": declares.get("key"),
        "stateful": stateful,
        "warm_up_s": meta.get("warm_up_s"),
        "driver": driver,
        "secret_env": meta.get("secret_env"),
    }


def _contract_diff(current: dict | None, target: dict | None) -> list[dict[str, Any]]:
    """One row per contract field; ``changed`` None when either side is unknown."""
    rows = []
    for f in CONTRACT_FIELDS:
        a, b = (current or {}).get(f), (target or {}).get(f)
        rows.append(
            {"field": f, "current": a, "target": b, "changed": None if a is None or b is None else a != b}
        )
    return rows


def _handoff(
    config: RelayConfig,
    ledger: Ledger,
    blue: Instance | None,
    explicit: dict[int, int] | None,
    blocked: list[str],
    warnings: list[str],
) -> tuple[list[dict[str, Any]], dict[str, int] | str]:
    """Per partition of blue's open leases: cursor, Kafka's latest, the expected H, what blue drains."""
    latest: dict[int, int] = {}
    unknown = None
    try:
        with KafkaOffsets(config.kafka_bootstrap, timeout_s=KAFKA_TIMEOUT_S) as kafka:
            latest = kafka.latest(config.topic)
    except TopicNotFoundError as exc:
        unknown = f"unknown (topic not found: {exc})"
    except KafkaError as exc:
        unknown = f"unknown (broker unreachable: {exc})"
    if unknown:
        warnings.append("Kafka can't be read now (see the expected H): the upgrade reads it at the handoff")
    leases = [le for le in ledger.leases(blue.id) if le.end_offset is None] if blue else []
    rows = []
    for lease in sorted(leases, key=lambda le: le.partition):
        p, cursor = lease.partition, lease.next_offset
        h = (explicit or latest).get(p, latest.get(p))
        if explicit is not None and h is not None and h < cursor:
            blocked.append(
                f"handoff offset {h} of {lease.topic}[{p}] is below blue's cursor {cursor}: "
                "those offsets are already applied"
            )
        if explicit is not None and p in explicit and p in latest and explicit[p] > latest[p]:
            warnings.append(f"handoff {explicit[p]} of partition {p} is past Kafka's latest {latest[p]}")
        rows.append(
            {
                "partition": p,
                "blue_cursor": cursor,
                "kafka_latest": latest.get(p),
                "handoff": h,
                "blue_drains": None if h is None else max(h - cursor, 0),
            }
        )
    if explicit is not None:
        ignored = sorted(set(explicit) - {le.partition for le in leases})
        if ignored and blue is not None:
            warnings.append(f"handoff partitions {ignored} are not blue's: ignored")
    if blue is None:
        return rows, "none (no instance to hand off from)"
    if any(r["handoff"] is None for r in rows):
        return rows, unknown or "unknown"
    return rows, {str(r["partition"]): r["handoff"] for r in rows}


def _steps(version: str, tgt: dict[str, Any], gates: dict[str, Any], blue: Instance | None) -> list[str]:
    """What the upgrade does, in order, with this plan's figures."""
    green = blue.color.other.value if blue else "the other color"
    steps = [] if tgt["artifact_exists"] else [f"build {version} from the current code"]
    return steps + [
        f"start green ({version}, {green}) as a warm standby without leases; blue runs on; "
        f"green has {gates['grace_s']:g}s to report READY",
        "handoff: H = Kafka's latest offsets then (or the explicit H); "
        "blue's leases close at H, green's open at H",
        f"gate: within {gates['catchup_s']:g}s green commits past H "
        f"and its lag is <= {gates['max_lag']} records",
        f"blue drains up to H within {gates['drain_timeout_s']:g}s, then stops (fenced if it lingers)",
        "the upgrade's window is audited; old versions are pruned",
        "until blue stops, a failed step or gate aborts: green is fenced, "
        "blue keeps (or takes back) its leases",
    ]
