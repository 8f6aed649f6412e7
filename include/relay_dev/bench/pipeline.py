"""Section ``pipeline``: the user pipeline examples/json_upsert end to end, against kafka-python.

One JSON backlog (``{"id", "name", "score"}`` keyed by id, every id updated ~5 times) in topic
``json_upsert``; everything below reads it from the beginning, on one throwaway PostgreSQL server that
holds the ledger and one fresh sink database per reader:

- baselines: a bare kafka-python consumer that only reads, and one that parses (``json.loads``) and
  upserts newest-wins by id into a table of the example's shape (``execute_values`` in pages, one
  transaction per poll), as a hand-written consumer would (no fence, no ledger, no exactly-once);
- the example, deployed three times in cluster mode (its code copied, only the pipeline's name and
  its ``max_offsets_per_trigger`` changed: 10,000 then 200,000 on one executor core, then 200,000 on
  two: two readers): applied msg/s from the ledger's batches (as in ``throughput``), the driver JVM's
  and the Python driver's peak RSS (``VmHWM``) for each read limit on one core, and the table checked
  to hold the newest value of every id.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

from relay.config import RelayConfig
from relay.errors import OperationError, RelayError

from .cluster import latest_offsets, wait_caught_up
from .context import Context, instance_batches
from .pipeline_backlog import EXAMPLE, TOPIC, check_table, produce_json, sink_database, upsert_consumer
from .results import figure
from .stats import fmt_number
from .throughput import plain_consumer, throughput_from_batches

SINK_URL_ENV = "JSON_UPSERT_SINK_URL"
LIMITS = (10_000, 200_000)  # maxOffsetsPerTrigger of the two deploys (the memory comparison)
TWO_CORES = 2  # the last deploy: two executor cores at the larger read limit
RSS_GOAL_PCT = 15.0  # the driver's memory should stay flat within this when batches grow 20x


# ------------------------------------------------------------------------------------------ pure
def patch_pipeline(source: str, name: str, limit: int) -> str:
    """The example's pipeline.py with another pipeline name and read limit (nothing else changes)."""
    out, n_name = re.subn(r'name="json_upsert"', f'name="{name}"', source)
    out, n_limit = re.subn(r"max_offsets_per_trigger=\d+", f"max_offsets_per_trigger={limit}", out)
    if n_name != 1 or n_limit != 1:
        raise OperationError(
            'examples/json_upsert/pipeline.py changed: expected one name="json_upsert" and one '
            f"max_offsets_per_trigger=N (found {n_name} and {n_limit})"
        )
    return out


def growth_pct(small: float | None, big: float | None) -> float | None:
    if not small or big is None:
        return None
    return (big - small) / small * 100


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
        raise OperationError(f"instance {instance_id} has no running attempt with a PID")
    py_pid = int(running[-1].pid)
    stat = Path(f"/proc/{py_pid}/stat").read_text()
    jvm_pid = int(stat.rsplit(")", 1)[1].split()[1])
    out: dict[str, Any] = {"python_pid": py_pid, "jvm_pid": jvm_pid, "attempts": len(running)}
    for who, pid in (("python", py_pid), ("jvm", jvm_pid)):
        for field in ("VmHWM", "VmRSS"):
            kib = _kib(pid, field)
            out[f"{who}_{field.lower()}_mb"] = round(kib / 1024, 1) if kib is not None else None
    return out


def package_variant(root: Path, name: str, limit: int) -> Path:
    """A copy of the example as package ``name`` (a package name can be imported only once)."""
    dest = root / name
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "pipeline.py").write_text(patch_pipeline((EXAMPLE / "pipeline.py").read_text(), name, limit))
    return dest


# ------------------------------------------------------------------------------------- the runs
def run_variant(
    ctx: Context, ledger_url: str, limit: int, messages: int, ids: int, cores: int = 1
) -> dict[str, Any]:
    """Deploy the example with read limit ``limit`` and ``cores`` executor cores (that many tasks
    read and write at once), wait for the backlog, measure, stop it."""
    from relay.artifacts import build_artifact
    from relay.operations.deploy import deploy
    from relay.operations.stop import stop

    name = f"ju_m{limit}" + (f"_c{cores}" if cores > 1 else "")
    cfg = ctx.config.with_(
        pipeline=name,
        topic=TOPIC,
        ledger_url=ledger_url,
        max_offsets_per_trigger=limit,
        executor_cores=cores,
        cores_max=cores,
    )
    package = package_variant(ctx.work_dir / "pipeline-code", name, limit)
    url = sink_database(ledger_url, f"sink_{name}_{uuid.uuid4().hex[:6]}")
    build_artifact(cfg, f"{name}-v1", pipeline_code=package)
    latest = latest_offsets(cfg)
    t0 = time.time()
    try:
        # where deploy runs: the launcher copies it to the driver's env
        with mock.patch.dict(os.environ, {SINK_URL_ENV: url}):
            ctx.progress(
                f"pipeline: deploying {name} (maxOffsetsPerTrigger {limit:,}, {cores} executor core(s))"
                " in cluster mode"
            )
            info = deploy(cfg, version=f"{name}-v1", wait_s=600, progress=ctx.progress)
            instance_id = int(info["instance_id"])
            waited = wait_caught_up(cfg, ctx.progress, max(600.0, messages / 100), name)
            t1 = time.time()
            memory = driver_memory(cfg, instance_id)
            stats = throughput_from_batches(instance_batches(cfg, instance_id), latest)
    finally:
        with contextlib.suppress(RelayError):
            stop(cfg, timeout_s=120, progress=ctx.progress)
    table = check_table(url, messages, ids)
    ctx.progress(
        f"pipeline: {name} applied {stats['rows']:,} in {stats['batches']} batches, "
        f"{fmt_number(stats['msg_s'])} msg/s; driver JVM peak {memory['jvm_vmhwm_mb']} MiB, "
        f"Python driver peak {memory['python_vmhwm_mb']} MiB"
    )
    return {
        "limit": limit,
        "pipeline": name,
        "cores_max": cfg.cores_max,
        "executor_cores": cfg.executor_cores,
        "instance_id": instance_id,
        "first_commit_s": info.get("first_commit_s"),
        "deploy_to_caught_up_s": t1 - t0,
        "caught_up_wait_s": waited,
        "relay": stats,
        "memory": memory,
        "table": table,
        "window": (t0, t1),
    }


def pipeline_figures(read_s: float | None, upsert_s: float | None, runs: list[dict]) -> list[dict]:
    """The printed figures: throughput per read limit against both baselines, then driver memory."""
    upsert_name, read_name, up = "kafka-python json.loads + upsert", "kafka-python read only", "higher"
    figures = [figure(upsert_name, upsert_s, "msg/s", read_name, read_s, better=up)]
    for r in runs:
        lim, s = (
            f"{r['limit']:,}" + (f", {r['executor_cores']} cores" if r["executor_cores"] > 1 else ""),
            r["relay"],
        )
        figures += [
            figure(f"json_upsert applied e2e, limit {lim}", s["msg_s"], "msg/s", upsert_name, upsert_s, up),
            figure(f"json_upsert applied e2e, limit {lim}", s["msg_s"], "msg/s", read_name, read_s, up),
            figure(
                f"applied after the first batch, limit {lim}",
                s["warm_msg_s"],
                "msg/s",
                upsert_name,
                upsert_s,
                up,
            ),
            figure(f"first batch (Python workers start), limit {lim}", s["first_batch_s"], "s"),
            figure(
                f"max rows per batch, limit {lim}",
                s["max_batch_rows"],
                "rows",
                "maxOffsetsPerTrigger",
                r["limit"],
            ),
            figure(f"batches for the backlog, limit {lim}", s["batches"], "batches"),
            figure(f"deploy call -> backlog applied, limit {lim}", r["deploy_to_caught_up_s"], "s"),
        ]
    small, big = (r["memory"] for r in runs[:2])  # one executor core, the two read limits
    lo, hi = (f"limit {r['limit']:,}" for r in runs[:2])
    for label, key in (("driver JVM", "jvm_vmhwm_mb"), ("Python driver", "python_vmhwm_mb")):
        figures += [
            figure(f"{label} peak RSS, {lo}", small[key], "MiB"),
            figure(f"{label} peak RSS, {hi}", big[key], "MiB", lo, small[key]),
            figure(
                f"{label} peak RSS growth",
                growth_pct(small[key], big[key]),
                "%",
                "goal (at most)",
                RSS_GOAL_PCT,
            ),
        ]
    return figures


def section_pipeline(ctx: Context) -> dict[str, Any]:
    from relay.kafka.offsets import KafkaOffsets
    from relay.ledger.engine import create_ledger

    from relay_dev.postgres_local import LocalPostgres

    cfg, n = ctx.config, ctx.options.messages
    pg = LocalPostgres(cfg.data_dir, cfg.ports.postgres, cfg.host)
    try:
        ctx.progress(f"pipeline: starting PostgreSQL (ledger + sink databases) on {pg.address}")
        ledger_url = pg.start()
        create_ledger(ledger_url)
        with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
            kafka.ensure_topic(TOPIC, cfg.partitions)
        ctx.progress(f"pipeline: producing {n:,} JSON records keyed by id to topic {TOPIC}")
        produced = produce_json(cfg.kafka_bootstrap, TOPIC, n)
        ids = produced["ids"]
        read = plain_consumer(cfg.kafka_bootstrap, TOPIC)
        ctx.progress(f"pipeline: kafka-python read only: {fmt_number(read['msg_s'])} msg/s")
        base_url = sink_database(ledger_url, f"sink_plain_{uuid.uuid4().hex[:6]}")
        upsert = upsert_consumer(cfg.kafka_bootstrap, TOPIC, base_url)
        upsert["table"] = check_table(base_url, n, ids)
        ctx.progress(f"pipeline: kafka-python json.loads + upsert: {fmt_number(upsert['msg_s'])} msg/s")
        runs = [run_variant(ctx, ledger_url, limit, n, ids) for limit in LIMITS]
        # two cores, two readers: the aim (1.5x the hand-written consumer)
        runs.append(run_variant(ctx, ledger_url, LIMITS[-1], n, ids, cores=TWO_CORES))
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    for who, table in [("kafka-python upsert", upsert["table"])] + [
        (r["pipeline"], r["table"]) for r in runs
    ]:
        if table["rows"] != ids or table["newest"] != ids:
            raise OperationError(f"{who}: the table holds {table} (every id's newest value expected)")
    figures = pipeline_figures(read["msg_s"], upsert["msg_s"], runs)
    for r in runs:
        r["window"] = list(r["window"])
    return {
        "figures": figures,
        "details": {
            "produce": produced,
            "kafka_python_read": read,
            "kafka_python_upsert": upsert,
            "runs": runs,
            "limits": list(LIMITS),
            "rss_goal_pct": RSS_GOAL_PCT,
            "notes": [
                "the example's code with only its pipeline name and max_offsets_per_trigger changed",
                "ledger and sink databases on one throwaway PostgreSQL server; cluster-mode drivers",
                "peak RSS = VmHWM of the running attempt's Python driver and of its parent JVM",
                "trigger-to-commit vs a rate source in cluster mode with the same sink: not measured",
            ],
        },
    }
