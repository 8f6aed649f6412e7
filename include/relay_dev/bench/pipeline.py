"""Section ``pipeline``: the user pipeline examples/json_upsert as users get it, against hand-written
consumers doing the same work.

One JSON backlog of ``--messages`` records (``{"id", "name", "score"}`` keyed by id, every id updated
~5 times) in topic ``json_upsert``, on one throwaway PostgreSQL server that holds the ledger and one
fresh sink database per reader (each checked to hold every id's newest value):

- baselines, each reading the backlog from its beginning (baselines.py): b1 kafka-python,
  ``json.loads``, newest-wins ``execute_values`` upsert, one transaction per poll of 10,000; b2 = b1
  with ``COPY`` into a temporary table and one ``INSERT .. SELECT .. ON CONFLICT`` per poll; b3 = b2
  in two processes (the partitions split between them); b4 = b3 with confluent-kafka;
- the example in cluster mode (its code copied, only its name, topic and, for the best limit, its
  read limit changed), at Relay's default read limit (nothing forced: the package's own value or
  Relay's) and at the best one (200,000), each two ways:
  - warm: deployed on a topic holding a small warm-up backlog, caught up, then a burst of
    ``--messages`` records; the figure is the burst's records over the time from the burst's start
    to the commit after which every cursor reached the burst's end (the ledger's batches);
  - cold: deployed on the backlog; the deploy call to every cursor at the backlog's end (every id
    newest), as records over that time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from relay.config import BATCH_LIMITS, RelayConfig
from relay.errors import OperationError, RelayError

from .baselines import b2_consumer, parallel_consumer
from .cluster import latest_offsets, wait_caught_up
from .context import Context, instance_batches
from .pipeline_backlog import (
    EXAMPLE,
    TOPIC,
    check_table,
    json_record,
    produce_json,
    produce_records,
    sink_database,
    upsert_consumer,
)
from .results import figure
from .stats import fmt_number
from .throughput import throughput_from_batches

SINK_URL_ENV = "JSON_UPSERT_SINK_URL"
BEST_LIMIT = 200_000
LIMITS: tuple[int | None, ...] = (None, BEST_LIMIT)  # None: Relay's default, nothing forced
WARM_UP = 1000  # records the warm instance catches up on before the burst
BASELINES = {
    "b1": "kafka-python, execute_values upsert",
    "b2": "b1 with COPY + one INSERT..SELECT",
    "b3": "b2 in 2 processes",
    "b4": "b3 with confluent-kafka",
}
AGAINST = ("b1", "b3", "b4")  # every Relay throughput figure gets a ratio to each of these
RSS_GOAL_PCT = 15.0  # the driver's memory should stay flat within this when batches grow


# ------------------------------------------------------------------------------------------ pure
_LIMIT_LINE = re.compile(r"\n[ \t]*max_offsets_per_trigger=[\d_]+,[ \t]*(?=\n)")


def patch_pipeline(source: str, name: str, limit: int | None = None, topic: str | None = None) -> str:
    """The example's pipeline.py as pipeline ``name``, reading ``topic`` (None: its own), with read
    limit ``limit`` (None: whatever the example declares, or nothing when it declares none)."""
    out, n_name = re.subn(r'name="json_upsert",', f'name="{name}",', source)
    problems = [] if n_name == 1 else [f'one name="json_upsert", (found {n_name})']
    if topic is not None:
        out, n_topic = re.subn(r'^TOPIC = "json_upsert"$', f'TOPIC = "{topic}"', out, flags=re.M)
        problems += [] if n_topic == 1 else [f'one TOPIC = "json_upsert" (found {n_topic})']
    if limit is not None:
        out, n_limit = _LIMIT_LINE.subn("", out)  # at most one: the limit goes after the name
        if n_limit > 1 or re.search(r"max_offsets_per_trigger\s*=", out):
            problems.append("at most one max_offsets_per_trigger=N line, of digits")
        out, n_put = re.subn(
            r'\n([ \t]*)name="([^"]+)",', rf'\n\1name="\2",\n\1max_offsets_per_trigger={limit},', out
        )
        problems += [] if n_put == 1 else [f'one indented name="..." line (found {n_put})']
    if problems:
        raise OperationError(f"examples/json_upsert/pipeline.py changed: expected {' and '.join(problems)}")
    return out


def limit_label(limit: int | None) -> str:
    return "default limit" if limit is None else f"limit {limit:,}"


def variant_config(
    base: RelayConfig, name: str, topic: str, ledger_url: str, limit: int | None, keep_trigger: bool = False
) -> RelayConfig:
    """The bench's configuration for one deploy. ``limit``: the operator's read limit. None: no batch
    setting of the operator's (the bench's RELAY_* ones dropped), Relay's own values, so the
    package's value or else Relay's default applies."""
    cfg = base.with_(pipeline=name, topic=topic, ledger_url=ledger_url)
    if limit is not None:  # the operator's: it beats the package's value
        named = {*cfg.limits_from_env, "max_offsets_per_trigger"}
        return cfg.with_(
            max_offsets_per_trigger=limit, limits_from_env=tuple(n for n in BATCH_LIMITS if n in named)
        )
    defaults = {f.name: f.default for f in dataclasses.fields(RelayConfig) if f.name in BATCH_LIMITS}
    if keep_trigger:  # relay bench --trigger-seconds: the operator's
        defaults.pop("trigger_seconds")
        return cfg.with_(limits_from_env=("trigger_seconds",), limits_from_file=(), **defaults)
    return cfg.with_(limits_from_env=(), limits_from_file=(), **defaults)


def burst_from_batches(
    batches: Iterable[dict[str, Any]], start_at: float, end: dict[int, int], records: int
) -> dict[str, Any]:
    """A burst of ``records`` produced from ``start_at`` (epoch s) up to offsets ``end``: from its
    start to the commit after which every partition's cursor reached ``end`` (batches in commit order)."""
    rows = sorted(
        (b for b in batches if b.get("committed_at") is not None),
        key=lambda b: (b["committed_at"], b["batch_id"]),
    )
    reach: dict[int, int] = {}
    used: list[dict[str, Any]] = []
    for b in rows:
        for r in b.get("ranges") or []:
            reach[int(r["partition"])] = max(reach.get(int(r["partition"]), 0), int(r["to"]))
        if b["committed_at"] > start_at and int(b["rows_read"]) > 0:
            used.append(b)
        if end and all(reach.get(p, 0) >= off for p, off in end.items()):
            seconds = b["committed_at"] - start_at
            return {
                "reached": True,
                "records": records,
                "seconds": seconds,
                "msg_s": records / seconds if seconds > 0 else None,
                "batches": len(used),
                "rows_read": sum(int(u["rows_read"]) for u in used),
                "max_batch_rows": max((int(u["rows_read"]) for u in used), default=0),
                "first_batch_start_s": used[0]["started_at"] - start_at if used else None,
            }
    return {"reached": False, "records": records, "seconds": None, "msg_s": None, "batches": len(used)}


def growth_pct(small: float | None, big: float | None) -> float | None:
    if not small or big is None:
        return None
    return (big - small) / small * 100


def pipeline_figures(base: dict[str, float | None], runs: list[dict[str, Any]], messages: int) -> list[dict]:
    """The baselines (each against b1), then per limit warm and cold against b1, b3 and b4."""
    up = "higher"
    figures = [figure(f"b1: {BASELINES['b1']}", base["b1"], "msg/s")]
    figures += [
        figure(f"{k}: {BASELINES[k]}", base[k], "msg/s", "b1", base["b1"], up) for k in ("b2", "b3", "b4")
    ]
    for r in runs:
        lab, warm, cold = limit_label(r["limit"]), r["warm"], r["cold"]
        figures += [
            figure(
                f"warm: {messages:,} burst applied, {lab}", warm["burst"]["msg_s"], "msg/s", k, base[k], up
            )
            for k in AGAINST
        ]
        figures.append(figure(f"warm: burst start -> applied, {lab}", warm["burst"]["seconds"], "s"))
        figures += [
            figure(f"cold: deploy -> every id newest, {lab}", cold["msg_s"], "msg/s", k, base[k], up)
            for k in AGAINST
        ]
        figures.append(
            figure(f"cold: deploy call -> every id newest, {lab}", cold["deploy_to_caught_up_s"], "s")
        )
    if len(runs) >= 2:
        small, big = (r["warm"]["memory"] for r in runs[:2])
        span = f"{limit_label(runs[0]['limit'])} -> {limit_label(runs[1]['limit'])}"
        for label, key in (("driver JVM", "jvm_vmhwm_mb"), ("Python driver", "python_vmhwm_mb")):
            figures.append(
                figure(
                    f"warm {label} peak RSS growth, {span}",
                    growth_pct(small.get(key), big.get(key)),
                    "%",
                    "goal (at most)",
                    RSS_GOAL_PCT,
                )
            )
    return figures


# --------------------------------------------------------------------------------- environment
def _kib(pid: int, field: str) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def driver_memory(cfg: RelayConfig, instance_id: int) -> dict[str, Any]:
    """Peak (VmHWM) and current RSS in MiB of the running attempt's Python driver and its JVM."""
    from relay.ledger.models import AttemptState
    from relay.ledger.store import Ledger

    running = [a for a in Ledger(cfg.ledger_url).attempts(instance_id) if a.state is AttemptState.RUNNING]
    if not running or not running[-1].pid:
        return {}
    py_pid = int(running[-1].pid)
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{py_pid}/stat").read_text()
        jvm_pid = int(stat.rsplit(")", 1)[1].split()[1])
        out: dict[str, Any] = {"python_pid": py_pid, "jvm_pid": jvm_pid}
        for who, pid in (("python", py_pid), ("jvm", jvm_pid)):
            for field in ("VmHWM", "VmRSS"):
                kib = _kib(pid, field)
                out[f"{who}_{field.lower()}_mb"] = round(kib / 1024, 1) if kib is not None else None
        return out
    return {}


def package_variant(root: Path, name: str, limit: int | None, topic: str | None = None) -> Path:
    """A copy of the example as package ``name`` (a package name can be imported only once)."""
    dest = root / name
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "pipeline.py").write_text(
        patch_pipeline((EXAMPLE / "pipeline.py").read_text(), name, limit, topic)
    )
    return dest


@contextlib.contextmanager
def deployed(
    ctx: Context,
    ledger_url: str,
    name: str,
    topic: str,
    limit: int | None,
    url: str,
    section: str = "pipeline",
) -> Iterator[tuple[RelayConfig, dict[str, Any], float]]:
    """The example deployed as ``name`` on ``topic`` into sink ``url``: (config, deploy info, the
    deploy call's epoch time); stopped on exit."""
    from relay.artifacts import build_artifact
    from relay.operations.deploy import deploy
    from relay.operations.stop import stop

    cfg = variant_config(ctx.config, name, topic, ledger_url, limit, ctx.options.trigger_seconds is not None)
    package = package_variant(ctx.work_dir / "pipeline-code", name, limit, None if topic == TOPIC else topic)
    build_artifact(cfg, f"{name}-v1", pipeline_code=package)
    # the sink's URL where deploy runs: the launcher hands it to the driver's environment
    with mock.patch.dict(os.environ, {SINK_URL_ENV: url}):
        ctx.progress(f"{section}: deploying {name} on {topic} ({limit_label(limit)}) in cluster mode")
        t0 = time.time()
        try:
            info = deploy(cfg, version=f"{name}-v1", wait_s=600, progress=ctx.progress)
            yield cfg, info, t0
        finally:
            with contextlib.suppress(RelayError):
                stop(cfg, timeout_s=120, progress=ctx.progress)


# ------------------------------------------------------------------------------------- the runs
def run_cold(ctx: Context, ledger_url: str, limit: int | None, messages: int, ids: int) -> dict[str, Any]:
    """Deploy on the backlog: the deploy call to every cursor at its end."""
    name = f"ju_cold_{'default' if limit is None else limit}"
    url = sink_database(ledger_url, f"sink_{name}_{uuid.uuid4().hex[:6]}")
    with deployed(ctx, ledger_url, name, TOPIC, limit, url) as (cfg, info, t0):
        latest = latest_offsets(cfg)
        waited = wait_caught_up(cfg, ctx.progress, max(600.0, messages / 100), name)
        seconds = time.time() - t0
        stats = throughput_from_batches(instance_batches(cfg, int(info["instance_id"])), latest)
    table = check_table(url, messages, ids)
    ctx.progress(
        f"pipeline: {name}: deploy call -> every id newest {seconds:.1f}s "
        f"({fmt_number(messages / seconds)} msg/s)"
    )
    return {
        "pipeline": name,
        "deploy_to_caught_up_s": seconds,
        "msg_s": messages / seconds,
        "first_commit_s": info.get("first_commit_s"),
        "caught_up_wait_s": waited,
        "relay": stats,
        "table": table,
    }


def run_warm(ctx: Context, ledger_url: str, limit: int | None, messages: int, ids: int) -> dict[str, Any]:
    """Deploy on a small warm-up backlog, wait until caught up, then a burst of ``messages``."""
    from relay.kafka.offsets import KafkaOffsets

    tag = "default" if limit is None else str(limit)
    name, topic = f"ju_warm_{tag}", f"json_upsert_warm_{tag}"
    url = sink_database(ledger_url, f"sink_{name}_{uuid.uuid4().hex[:6]}")
    boot = ctx.config.kafka_bootstrap
    with KafkaOffsets(boot) as kafka:
        kafka.ensure_topic(topic, ctx.config.partitions)
    warm_up = min(WARM_UP, messages)
    produce_records(boot, topic, [json_record(i, ids) for i in range(warm_up)])
    burst = [json_record(i, ids) for i in range(warm_up, warm_up + messages)]  # encoded before the clock
    with deployed(ctx, ledger_url, name, topic, limit, url) as (cfg, info, _t0):
        wait_caught_up(cfg, ctx.progress, 600.0, f"{name} warm-up")
        start_at = time.time()
        produce_s = produce_records(boot, topic, burst)
        end = latest_offsets(cfg)
        wait_caught_up(cfg, ctx.progress, max(600.0, messages / 100), f"{name} burst")
        instance_id = int(info["instance_id"])
        memory = driver_memory(cfg, instance_id)
        result = burst_from_batches(instance_batches(cfg, instance_id), start_at, end, messages)
    if not result["reached"]:
        raise OperationError(f"{name}: no batch reached the burst's end {end}")
    table = check_table(url, warm_up + messages, ids)
    ctx.progress(
        f"pipeline: {name}: burst of {messages:,} applied in {result['seconds']:.1f}s "
        f"({fmt_number(result['msg_s'])} msg/s, {result['batches']} batches; produced in {produce_s:.1f}s)"
    )
    return {
        "pipeline": name,
        "topic": topic,
        "warm_up": warm_up,
        "burst": result,
        "burst_produce_s": produce_s,
        "memory": memory,
        "table": table,
    }


def section_pipeline(ctx: Context) -> dict[str, Any]:
    from relay.kafka.offsets import KafkaOffsets
    from relay.ledger.engine import create_ledger

    from relay_dev.postgres_local import LocalPostgres

    cfg, n = ctx.config, ctx.options.messages
    pg = LocalPostgres(cfg.data_dir, cfg.ports.postgres, cfg.host)
    tables: list[tuple[str, dict[str, int]]] = []
    try:
        ctx.progress(f"pipeline: starting PostgreSQL (ledger + sink databases) on {pg.address}")
        ledger_url = pg.start()
        create_ledger(ledger_url)
        with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
            kafka.ensure_topic(TOPIC, cfg.partitions)
            partitions = sorted(kafka.latest(TOPIC))
        ctx.progress(f"pipeline: producing {n:,} JSON records keyed by id to topic {TOPIC}")
        produced = produce_json(cfg.kafka_bootstrap, TOPIC, n)
        ids = produced["ids"]
        base: dict[str, dict[str, Any]] = {}
        for key in BASELINES:
            url = sink_database(ledger_url, f"sink_{key}_{uuid.uuid4().hex[:6]}")
            if key == "b1":
                base[key] = upsert_consumer(cfg.kafka_bootstrap, TOPIC, url)
            elif key == "b2":
                base[key] = b2_consumer(cfg.kafka_bootstrap, TOPIC, url, partitions)
            else:
                client = "kafka-python" if key == "b3" else "confluent-kafka"
                base[key] = parallel_consumer(client, cfg.kafka_bootstrap, TOPIC, url, partitions)
            base[key]["table"] = check_table(url, n, ids)
            tables.append((key, base[key]["table"]))
            ctx.progress(f"pipeline: {key} ({BASELINES[key]}): {fmt_number(base[key]['msg_s'])} msg/s")
        runs = []
        for limit in LIMITS:
            run = {"limit": limit, "warm": run_warm(ctx, ledger_url, limit, n, ids)}
            run["cold"] = run_cold(ctx, ledger_url, limit, n, ids)
            tables += [
                (run["warm"]["pipeline"], run["warm"]["table"]),
                (run["cold"]["pipeline"], run["cold"]["table"]),
            ]
            runs.append(run)
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    for who, table in tables:
        if table["rows"] != table["ids"] or table["newest"] != table["ids"]:
            raise OperationError(f"{who}: the table holds {table} (every id's newest value expected)")
    return {
        "figures": pipeline_figures({k: v["msg_s"] for k, v in base.items()}, runs, n),
        "details": {
            "produce": produced,
            "baselines": base,
            "runs": runs,
            "limits": [limit_label(limit) for limit in LIMITS],
            "rss_goal_pct": RSS_GOAL_PCT,
            "notes": [
                "the example's code with only its pipeline name, topic (warm) and read limit (best) changed",
                "default limit: no batch setting of the operator's, the package's value or Relay's default",
                "warm: burst start (first produce call) -> the commit after which every cursor is at its end",
                "cold: deploy call -> every cursor at the backlog's end (every id newest)",
                "b3/b4: wall time from releasing both connected processes to the later one's end",
                "ledger and sink databases on one throwaway PostgreSQL server; cluster-mode drivers",
            ],
        },
    }
