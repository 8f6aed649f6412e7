"""Section ``smallbatch``: a small batch's trigger-to-commit against Spark's ``rate`` source with the
same sink, the same deploy mode and the same span (issue #11: at most 1.5x).

Both sides run one after the other on the bench's cluster, in cluster mode, submitted with the same
resources (``relay.spark.driver_properties``), a 1 s trigger, under the same small steady load (``--quick``:
shorter), each writing to a fresh database of one throwaway PostgreSQL server through the same
pipeline package's ``transform`` and ``PostgresUpsertSink`` from ``mapInArrow`` tasks:

- A, Relay: a copy of ``examples/json_upsert`` (only its pipeline name and topic changed) deployed
  by ``relay.operations.deploy`` (ledger on that PostgreSQL, relaykafka source), while JSON records
  keyed by id are produced to its own topic at the load's rate;
- B, the baseline: ``rate_pipeline_driver.py`` (this folder), Spark's ``rate`` source at the same
  rows/s mapped to the Kafka source's columns, the same package's transform and sink, no ledger.

The span is Spark's own ``durationMs.triggerExecution`` on both sides, read from the line every
driver logs per batch in its stdout (``batch N: R rows; Spark's steps (ms): ...``, sampled once a
second from ``lastProgress`` by both) in the Spark worker's work dir. Counted: batches with rows,
without the first of them. Both sides start their executors' Python workers before the load (A: a
warm-up batch of a few records, which is that first batch; B: a warm-up job over static rows through
the same path, writing nothing), so the counted batches are steady small batches. Also Spark's
``addBatch`` (the ``foreachBatch``: the tasks, and on A the ledger) and the checkpoint's
``offsets/N`` -> ``commits/N``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from relay.errors import OperationError, RelayError

from .cluster import wait_caught_up
from .context import Context, driver_stdout
from .overhead import checkpoint_spans
from .pipeline import SINK_URL_ENV, package_variant
from .pipeline_backlog import json_record, sink_database
from .results import figure, load_average
from .stats import fmt_number, fmt_ratio, ratio, summarize
from .submit import end_driver

GOAL_RATIO = 1.5  # issue #11: Relay's small batch at most 1.5x the rate source's, same sink
SPAN = "triggerExecution"
NAME = "ju_small"  # package, pipeline and topic of side A
RATE_NAME = "rate_small"  # side B's fence row in its sink database
PARTITIONS = 3
WARM_UP_RECORDS = 10  # side A's first batch with rows (excluded): its Python workers start
IDS = 100  # distinct ids of the load: a few records per batch update different ids
RATE_DRIVER = Path(__file__).resolve().with_name("rate_pipeline_driver.py")
PROGRESS_RE = re.compile(r"batch (\d+): (\d+) rows; Spark's steps \(ms\): (.*)$")
RECENT_RE = re.compile(r"every batch's triggerExecution \(recentProgress\): (\[.*\])")
TOPIC_LINE = 'TOPIC = "json_upsert"'


# ------------------------------------------------------------------------------------------ pure
def parse_progress(text: str) -> list[dict[str, Any]]:
    """The ``batch N: R rows; Spark's steps (ms): k v, ...`` lines of a driver's log, one per batch id
    (the last line wins: a relaunched driver may log a batch again), in batch order."""
    found: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        m = PROGRESS_RE.search(line)
        if m is None:
            continue
        steps: dict[str, float] = {}
        for item in m.group(3).split(","):
            key, _, value = item.strip().rpartition(" ")
            with contextlib.suppress(ValueError):
                steps[key] = float(value)
        found[int(m.group(1))] = {"batch_id": int(m.group(1)), "rows": int(m.group(2)), "steps": steps}
    return [found[b] for b in sorted(found)]


def measured(batches: Iterable[Mapping[str, Any]], span: str = SPAN) -> list[Mapping[str, Any]]:
    """Batches with rows and the span, without the first of them (it starts the Python workers)."""
    with_rows = sorted(
        (b for b in batches if b["rows"] > 0 and span in b["steps"]), key=lambda b: b["batch_id"]
    )
    return with_rows[1:]


def side_summary(batches: Iterable[Mapping[str, Any]], span: str = SPAN) -> dict[str, Any]:
    """n, the span's summary, ``addBatch``'s, rows per batch and the batch ids counted."""
    kept = measured(batches, span)
    return {
        "n": len(kept),
        "span": span,
        span: summarize([b["steps"][span] for b in kept]),
        "addBatch": summarize([b["steps"]["addBatch"] for b in kept if "addBatch" in b["steps"]]),
        "rows": summarize([b["rows"] for b in kept]),
        "batch_ids": [int(b["batch_id"]) for b in kept],
    }


def recent_spans(text: str) -> list[float]:
    """Side B's every batch's triggerExecution (its final ``recentProgress`` line), for a cross-check."""
    m = RECENT_RE.search(text)
    return [float(v) for v in json.loads(m.group(1)) if v is not None] if m else []


def patch_topic(source: str, topic: str) -> str:
    """json_upsert's pipeline.py reading another topic (a fresh one: no backlog of other sections)."""
    out, n = re.subn(re.escape(TOPIC_LINE), f'TOPIC = "{topic}"', source)
    if n != 1:
        raise OperationError(f"examples/json_upsert/pipeline.py changed: expected one {TOPIC_LINE!r}")
    return out


def smallbatch_figures(relay: Mapping[str, Any], rate: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Medians and p95 of the span, A against B, the A/B ratio against the goal, batch counts, load."""
    a, b = relay["summary"], rate["summary"]
    base = "rate + same sink"
    med = ratio(a[SPAN]["median"], b[SPAN]["median"])
    p95 = ratio(a[SPAN]["p95"], b[SPAN]["p95"])
    figures = [
        figure(f"small batch {SPAN} median, json_upsert", a[SPAN]["median"], "ms", base, b[SPAN]["median"]),
        figure(f"small batch {SPAN} p95, json_upsert", a[SPAN]["p95"], "ms", base, b[SPAN]["p95"]),
        figure("median ratio json_upsert / rate", med, "x", "goal (at most)", GOAL_RATIO),
        figure("p95 ratio json_upsert / rate", p95, "x", "goal (at most)", GOAL_RATIO),
        figure(
            "  addBatch median (tasks + sink; ledger on A)",
            a["addBatch"]["median"],
            "ms",
            base,
            b["addBatch"]["median"],
        ),
        figure(
            "  offsets/N -> commits/N median",
            relay["checkpoint_span_ms"]["median"],
            "ms",
            base,
            rate["checkpoint_span_ms"]["median"],
        ),
        figure(
            "batches counted (with rows, not the first)", a["n"], "batches", base, b["n"], better="higher"
        ),
        figure("rows per batch, median", a["rows"]["median"], "rows", base, b["rows"]["median"], better="-"),
    ]
    for who, side in (("json_upsert", relay), ("rate", rate)):
        figures.append(
            figure(
                f"load average (1 min) during {who}: start / end",
                side["load"][0][0],
                "load",
                "end",
                side["load"][1][0],
                better="-",
            )
        )
    return figures


# --------------------------------------------------------------------------------- environment
def produce_steady(bootstrap: str, topic: str, rate: float, seconds: float, ids: int) -> dict[str, Any]:
    """json_upsert's records keyed by id at ``rate`` msg/s for ``seconds``, each sent on its tick."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    count = int(rate * seconds)
    t0 = time.monotonic()
    try:
        for i in range(count):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key, value = json_record(i, ids)
            producer.send(topic, key=key, value=value)
        producer.flush(60)
    finally:
        producer.close()
    return {"sent": count, "seconds": time.monotonic() - t0, "rate": rate, "ids": ids}


def package(ctx: Context) -> Path:
    """The example as package ``ju_small`` reading topic ``ju_small`` (its limit kept: 5,000)."""
    root = ctx.work_dir / "smallbatch" / "pipeline-code"
    dest = package_variant(root, NAME, 5000)
    (dest / "pipeline.py").write_text(patch_topic((dest / "pipeline.py").read_text(), NAME))
    return dest


def run_relay_side(ctx: Context, ledger_url: str, code: Path, seconds: float) -> dict[str, Any]:
    """Side A: deploy the package, produce the load, wait until applied, stop; parse its driver's log."""
    from relay.artifacts import build_artifact
    from relay.ledger.store import Ledger
    from relay.operations.deploy import deploy
    from relay.operations.stop import stop

    rate = ctx.options.overhead_rate
    cfg = ctx.config.with_(pipeline=NAME, topic=NAME, ledger_url=ledger_url)
    url = sink_database(ledger_url, f"sink_{NAME}_{uuid.uuid4().hex[:6]}")
    build_artifact(cfg, f"{NAME}-v1", pipeline_code=code)
    try:
        # deploy copies it into the driver's submission environment
        with mock.patch.dict(os.environ, {SINK_URL_ENV: url}):
            ctx.progress(f"smallbatch: deploying {NAME} (json_upsert, PostgresUpsertSink) in cluster mode")
            info = deploy(cfg, version=f"{NAME}-v1", wait_s=600, progress=ctx.progress)
            instance_id = int(info["instance_id"])
            ctx.progress(
                f"smallbatch: A: warm-up batch ({WARM_UP_RECORDS} records: the Python workers start)"
            )
            produce_steady(cfg.kafka_bootstrap, NAME, rate, WARM_UP_RECORDS / rate, IDS)
            wait_caught_up(cfg, ctx.progress, 300, "smallbatch A warm-up")
            time.sleep(2.0)  # its batch ends before the steady load starts
            load0 = load_average()
            ctx.progress(f"smallbatch: A: producing {rate:.0f} msg/s for {seconds:.0f}s (load {load0})")
            produced = produce_steady(cfg.kafka_bootstrap, NAME, rate, seconds, IDS)
            wait_caught_up(cfg, ctx.progress, 120, "smallbatch A")
            time.sleep(2.5)  # the driver logs a batch's progress up to ~1 s after it ended
            load1 = load_average()
    finally:
        with contextlib.suppress(RelayError):
            stop(cfg, timeout_s=120, progress=ctx.progress)
    inst = Ledger(ledger_url).instance(instance_id)
    text = driver_stdout(cfg, str(inst.submission_id))
    batches = parse_progress(text)
    summary = side_summary(batches)
    spans = checkpoint_spans(inst.checkpoint_dir, summary["batch_ids"])
    return {
        "pipeline": NAME,
        "instance_id": instance_id,
        "driver_id": inst.submission_id,
        "first_commit_s": info.get("first_commit_s"),
        "produce": produced,
        "trigger_line": next((ln for ln in text.splitlines() if " ready (sink " in ln), None),
        "logged_batches": len(batches),
        "summary": summary,
        "checkpoint_span_ms": summarize(list(spans.values())),
        "load": [load0, load1],
    }


def run_rate_side(ctx: Context, ledger_url: str, code: Path, seconds: float) -> dict[str, Any]:
    """Side B: submit the rate driver with a pipeline driver's properties; parse its log."""
    from relay.spark.driver_properties import driver_environment, driver_properties
    from relay.spark.launcher import spark_client

    cfg, rate = ctx.config, ctx.options.overhead_rate
    url = sink_database(ledger_url, f"sink_{RATE_NAME}_{uuid.uuid4().hex[:6]}")
    checkpoint = ctx.work_dir / "smallbatch" / "rate-checkpoint"
    run_s = seconds + 5  # its warm-up runs before the query: the first batches are small
    args = [
        "--pipeline-code", str(code.parent), "--package", code.name, "--name", RATE_NAME,
        "--rows-per-second", str(int(rate)), "--partitions", str(PARTITIONS), "--ids", str(IDS),
        "--seconds", str(run_s), "--trigger-seconds", str(cfg.trigger_seconds),
        "--checkpoint", str(checkpoint),
    ]  # fmt: skip
    props = driver_properties(cfg, f"relay-bench-{RATE_NAME}", supervise=False, py_files=[])
    env = {**driver_environment(cfg), SINK_URL_ENV: url}
    load0 = load_average()
    ctx.progress(f"smallbatch: B: rate source {rate:.0f} rows/s for {run_s:.0f}s, same sink (load {load0})")
    client = spark_client(cfg)
    try:
        driver_id = client.submit_python(str(RATE_DRIVER), args, props, env)
    finally:
        client.close()
    ended = end_driver(cfg, driver_id, timeout_s=run_s + 240)  # killed by its id if still running
    load1 = load_average()
    text = driver_stdout(cfg, driver_id)
    if not ended["ok"]:
        tail = "\n".join(text.splitlines()[-15:])
        raise OperationError(f"the rate driver {driver_id} ended {ended['state']}; its last output:\n{tail}")
    batches = parse_progress(text)
    summary = side_summary(batches)
    spans = checkpoint_spans(checkpoint, summary["batch_ids"])
    every = recent_spans(text)
    return {
        "pipeline": RATE_NAME,
        "driver_id": driver_id,
        "ended": ended,
        "logged_batches": len(batches),
        "summary": summary,
        "checkpoint_span_ms": summarize(list(spans.values())),
        "every_batch_trigger_ms": summarize(every[2:]),  # recentProgress: sampling cross-check
        "load": [load0, load1],
    }


def section_smallbatch(ctx: Context) -> dict[str, Any]:
    from relay.kafka.offsets import KafkaOffsets
    from relay.ledger.engine import create_ledger

    from relay_dev.postgres_local import LocalPostgres

    cfg = ctx.config
    seconds = 20.0 if ctx.options.quick else 45.0
    pg = LocalPostgres(cfg.data_dir, cfg.ports.postgres, cfg.host)
    try:
        ctx.progress(f"smallbatch: starting PostgreSQL (ledger + sink databases) on {pg.address}")
        ledger_url = pg.start()
        create_ledger(ledger_url)
        with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
            kafka.ensure_topic(NAME, PARTITIONS)
        code = package(ctx)
        relay = run_relay_side(ctx, ledger_url, code, seconds)
        rate = run_rate_side(ctx, ledger_url, code, seconds)
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    for who, side in (("json_upsert", relay), ("rate", rate)):
        if side["summary"]["n"] < 3:
            raise OperationError(f"{who}: only {side['summary']['n']} batches with rows were logged")
    a, b = relay["summary"][SPAN], rate["summary"][SPAN]
    ctx.progress(
        f"smallbatch: {SPAN} median json_upsert {fmt_number(a['median'])} ms ({relay['summary']['n']} "
        f"batches) vs rate {fmt_number(b['median'])} ms ({rate['summary']['n']}): "
        f"{fmt_ratio(ratio(a['median'], b['median']))} (goal <= {GOAL_RATIO}x)"
    )
    return {
        "figures": smallbatch_figures(relay, rate),
        "details": {
            "span": SPAN,
            "seconds": seconds,
            "rate": ctx.options.overhead_rate,
            "partitions": PARTITIONS,
            "goal_ratio": GOAL_RATIO,
            "relay": relay,
            "rate_source": rate,
            "notes": [
                "both sides cluster mode, same driver/executor resources, 1 s trigger, same package's "
                "transform and PostgresUpsertSink (mapInArrow tasks) into fresh databases",
                "durationMs sampled once a second from lastProgress by both drivers (same log line)",
                "counted: batches with rows, without the first of them",
            ],
        },
    }
