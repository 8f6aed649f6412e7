"""``relay bench --only smallbatch``: parsing the drivers' progress lines and the figures (no Spark)."""

from __future__ import annotations

import pytest
from relay.errors import OperationError
from relay_dev.bench import SECTIONS, parse_sections
from relay_dev.bench.runner import NEEDS_STACK, SECTION_FUNCS
from relay_dev.bench.smallbatch import (
    GOAL_RATIO,
    measured,
    parse_progress,
    patch_topic,
    recent_spans,
    side_summary,
    smallbatch_figures,
)

# As query_progress.log_progress (side A) and rate_pipeline_driver.log_progress (side B) log them.
STEPS = "Spark's steps (ms):"


def _lines(logger: str, *texts: str) -> str:
    return "".join(f"2026-11-26 05:50:1{i % 10},002 INFO {logger}: {t}\n" for i, t in enumerate(texts))


RELAY_LOG = _lines(
    "relay.pipeline",
    "pipeline ju_small ready (sink PostgresUpsertSink, epoch 1); maxOffsetsPerTrigger 5000 (package), "
    "trigger 1.0 s (operator)",
    "batch 1: rows in 120 written 100 skipped 0 (tasks); cursors [...]",
) + _lines(
    "relay.job",
    f"batch 1: 120 rows; {STEPS} addBatch 7012, commitOffsets 90, getBatch 0, latestOffset 20, "
    "queryPlanning 30, triggerExecution 7300, walCommit 80",
    f"batch 2: 20 rows; {STEPS} addBatch 900, commitOffsets 95, getBatch 0, latestOffset 15, "
    "queryPlanning 25, triggerExecution 1200, walCommit 75",
    f"batch 3: 21 rows; {STEPS} addBatch 800, triggerExecution 1000",
    f"batch 4: 0 rows; {STEPS} addBatch 100, triggerExecution 300",
    f"batch 5: 19 rows; {STEPS} addBatch 700, triggerExecution 1100",
    f"batch 3: 21 rows; {STEPS} addBatch 850, triggerExecution 1050",
)

RATE_LOG = _lines(
    "relay.bench.rate",
    f"batch 0: 0 rows; {STEPS} addBatch 50, triggerExecution 400",
    f"batch 1: 40 rows; {STEPS} addBatch 6000, triggerExecution 6500",
    f"batch 2: 20 rows; {STEPS} addBatch 600, triggerExecution 800",
    f"batch 3: 20 rows; {STEPS} addBatch 500, triggerExecution 700",
    f"batch 4: 20 rows; {STEPS} addBatch 700, triggerExecution 900",
    "rate pipeline stopped; every batch's triggerExecution (recentProgress): "
    "[400, 6500, 800, 700, 900, null]",
)


def test_parse_progress_keeps_the_last_line_per_batch_in_batch_order() -> None:
    batches = parse_progress(RELAY_LOG)
    assert [b["batch_id"] for b in batches] == [1, 2, 3, 4, 5]
    assert batches[0]["rows"] == 120 and batches[0]["steps"]["triggerExecution"] == 7300
    assert batches[0]["steps"]["walCommit"] == 80 and batches[0]["steps"]["getBatch"] == 0
    assert batches[2]["steps"] == {"addBatch": 850, "triggerExecution": 1050}  # the relaunch's line wins
    assert parse_progress("no progress here\nbatch 3: rows in 5 written 5") == []


def test_measured_drops_empty_batches_and_the_first_with_rows() -> None:
    kept = measured(parse_progress(RELAY_LOG))
    assert [b["batch_id"] for b in kept] == [2, 3, 5]
    assert [b["batch_id"] for b in measured(parse_progress(RATE_LOG))] == [2, 3, 4]
    assert measured([]) == []


def test_side_summary() -> None:
    s = side_summary(parse_progress(RELAY_LOG))
    assert s["n"] == 3 and s["batch_ids"] == [2, 3, 5] and s["span"] == "triggerExecution"
    assert s["triggerExecution"]["median"] == 1100 and s["triggerExecution"]["max"] == 1200
    assert s["addBatch"]["median"] == 850 and s["rows"]["median"] == 20
    assert s["triggerExecution"]["p95"] == pytest.approx(1190)


def test_recent_spans_cross_check_line() -> None:
    assert recent_spans(RATE_LOG) == [400, 6500, 800, 700, 900]
    assert recent_spans(RELAY_LOG) == []


def _side(log: str, span_ms: float, load: tuple[float, float]) -> dict:
    return {
        "summary": side_summary(parse_progress(log)),
        "checkpoint_span_ms": {"median": span_ms},
        "load": [[load[0], 1.0, 1.0], [load[1], 1.0, 1.0]],
    }


def test_figures_ratio_against_the_rate_side_and_the_goal() -> None:
    figs = {
        f["name"]: f
        for f in smallbatch_figures(_side(RELAY_LOG, 300, (2.0, 3.0)), _side(RATE_LOG, 150, (1, 2)))
    }
    med = figs["small batch triggerExecution median, json_upsert"]
    assert med["value"] == 1100 and med["baseline"] == 800 and med["ratio"] == pytest.approx(1.375)
    assert med["unit"] == "ms" and med["baseline_name"] == "rate + same sink"
    goal = figs["median ratio json_upsert / rate"]
    assert goal["value"] == pytest.approx(1.375) and goal["baseline"] == GOAL_RATIO == 1.5
    assert goal["ratio"] == pytest.approx(1.375 / 1.5)  # < 1: the goal is met
    assert figs["batches counted (with rows, not the first)"]["value"] == 3
    assert figs["batches counted (with rows, not the first)"]["baseline"] == 3
    assert figs["  offsets/N -> commits/N median"]["ratio"] == 2.0
    assert figs["load average (1 min) during json_upsert: start / end"]["value"] == 2.0
    assert figs["load average (1 min) during rate: start / end"]["baseline"] == 2


def test_patch_topic() -> None:
    src = 'X = 1\nTOPIC = "json_upsert"\nTABLE = "t"\n'
    assert patch_topic(src, "ju_small") == 'X = 1\nTOPIC = "ju_small"\nTABLE = "t"\n'
    with pytest.raises(OperationError):
        patch_topic("TOPIC = 'other'\n", "ju_small")


def test_section_registered() -> None:
    assert "smallbatch" in SECTIONS and parse_sections("smallbatch") == ("smallbatch",)
    assert "smallbatch" in SECTION_FUNCS and "smallbatch" in NEEDS_STACK


def test_the_example_still_patches() -> None:
    from relay_dev.bench.pipeline_backlog import EXAMPLE

    assert 'TOPIC = "ju_small"' in patch_topic((EXAMPLE / "pipeline.py").read_text(), "ju_small")
