"""``relay bench``: Relay's costs on a private embedded stack, each next to a baseline from the same run.

Why baselines: absolute figures from a shared 2-core machine mean little on their own; a ratio
against a baseline measured minutes apart on the same machine (a plain kafka-python consumer, Spark's
``rate`` source, a bare INSERT, a cold deploy, the idle stack) says what Relay itself costs.

Sections (each can be run alone with ``--only``): throughput, overhead, ledger, upgrade, recovery,
memory, pipeline (a user pipeline, examples/json_upsert, warm burst and cold deploy against
hand-written consumers b1..b4 doing the same upserts), latency (produce -> row visible, against b2 as
a continuous consumer), smallbatch (json_upsert's small-batch trigger-to-commit against Spark's rate
source, same sink and deploy mode), failover (a hot standby's takeover against Spark's relaunch),
failover-hosts (a whole host lost, on the namespace cluster; needs root), autoscale (a load step one
executor core cannot keep up with: the lag with the lag policy off and on, each scale handoff's
pause; examples/kafka_to_kafka, counted from outside). The stack (noida-db, Spark master + worker,
and PostgreSQL for the ledger, pipeline, latency and smallbatch sections) runs on free loopback
ports under ``var/bench/<timestamp>/`` and is always stopped by PID at the end, also on failure.
Results go to ``var/bench/results-<timestamp>.json``.
This package imports neither pyspark nor Airflow: the Spark baselines run as a subprocess
(``bench/rate_overhead.py``) or as a cluster-mode driver (``rate_pipeline_driver.py``).

Modules:

- ``options``: the run's flags (sections, sizes, ``--quick``);
- ``stats``: percentiles, summaries, ratios, number formatting (pure);
- ``results``: the result's JSON shape, figures, machine facts, the atomic write;
- ``table``: the printed summary;
- ``cluster``: the private stack's configuration on free ports, cursors and latest offsets;
- ``context``: what sections share, the v1 deploy, stopping child processes;
- ``sampler``: memory of the stack's processes, sampled from /proc;
- ``throughput``, ``overhead``, ``ledger``, ``upgrade``, ``recovery``, ``memory``, ``pipeline``,
  ``latency``, ``smallbatch``, ``failover``, ``autoscale``: one section each
  (``rate_pipeline_driver.py``: smallbatch's Spark-side driver, submitted to the bench's cluster
  as a file; ``pipeline_backlog``: the pipeline's backlog and b1; ``baselines``: the hand-written
  consumers b2..b4; ``failover_faults``: the failover section's worker-host loss;
  ``autoscale_load``: the autoscale section's workload);
- ``failover_hosts``: the failover section's host loss on the namespace cluster (root; skipped otherwise);
- ``runner``: ``run_bench``, the run on a private stack, always stopped at the end.

The names below are re-exported so ``from relay_dev.bench import X`` keeps working.
"""

from __future__ import annotations

from .cluster import (
    PIPELINE,
    TOPIC,
    bench_config,
    cursors,
    free_port,
    latest_offsets,
    wait_caught_up,
)
from .context import Context, ensure_running, instance_batches, kill_child
from .ledger import PhaseTimer, section_ledger
from .memory import section_memory
from .options import SECTIONS, BenchOptions, Progress, parse_sections
from .overhead import RATE_SCRIPT, checkpoint_spans, run_rate_baseline, section_overhead
from .recovery import section_recovery
from .results import RESULT_SCHEMA, figure, load_average, machine_facts, new_result, write_result
from .runner import BENCH_DIR, NEEDS_STACK, SECTION_FUNCS, run_bench
from .sampler import MemorySampler, classify_process, memory_peaks
from .smallbatch import parse_progress, section_smallbatch, side_summary
from .stats import fmt_number, fmt_ratio, percentile, ratio, summarize
from .table import render_table
from .throughput import plain_consumer, section_throughput, throughput_from_batches
from .upgrade import RateProducer, section_upgrade

__all__ = [
    "BENCH_DIR",
    "NEEDS_STACK",
    "PIPELINE",
    "RATE_SCRIPT",
    "RESULT_SCHEMA",
    "SECTIONS",
    "SECTION_FUNCS",
    "TOPIC",
    "BenchOptions",
    "Context",
    "MemorySampler",
    "PhaseTimer",
    "Progress",
    "RateProducer",
    "bench_config",
    "checkpoint_spans",
    "classify_process",
    "cursors",
    "ensure_running",
    "figure",
    "fmt_number",
    "fmt_ratio",
    "free_port",
    "instance_batches",
    "kill_child",
    "latest_offsets",
    "load_average",
    "machine_facts",
    "memory_peaks",
    "new_result",
    "parse_progress",
    "parse_sections",
    "percentile",
    "plain_consumer",
    "ratio",
    "render_table",
    "run_bench",
    "run_rate_baseline",
    "section_ledger",
    "section_memory",
    "section_overhead",
    "section_recovery",
    "section_smallbatch",
    "section_throughput",
    "section_upgrade",
    "side_summary",
    "summarize",
    "throughput_from_batches",
    "wait_caught_up",
    "write_result",
]
