"""The autoscale section's pure figures: when a lag series is caught up, and a handoff's pause."""

from __future__ import annotations

from pathlib import Path

import pytest
from relay_dev.bench import SECTIONS, parse_sections
from relay_dev.bench.autoscale import catch_up_s, handoff_pause, lag_summary
from relay_dev.bench.autoscale_load import package
from relay_dev.bench.runner import NEEDS_STACK, SECTION_FUNCS


def test_the_section_is_registered() -> None:
    assert "autoscale" in SECTIONS and "autoscale" in SECTION_FUNCS and "autoscale" in NEEDS_STACK
    assert parse_sections("autoscale") == ("autoscale",)


def test_caught_up_is_the_first_sample_after_the_peak_from_which_the_lag_stays_low() -> None:
    series = [
        (0.0, 1.0),
        (2.0, 12.0),
        (4.0, 30.0),
        (6.0, 4.0),
        (8.0, 9.0),
        (10.0, 3.0),
        (12.0, None),
        (14.0, 0.0),
    ]
    assert catch_up_s(series) == 10.0  # 6 s dipped under 5 s but rose again; a failed sample is skipped


def test_no_catch_up_when_still_behind_or_never_behind() -> None:
    assert catch_up_s([(0.0, 2.0), (2.0, 40.0), (4.0, 35.0)]) is None
    assert catch_up_s([(0.0, 2.0), (2.0, 3.0)]) is None
    assert catch_up_s([(0.0, None)]) is None


def test_a_handoffs_pause_is_its_longest_commit_gap_minus_the_median_gap_before() -> None:
    commits = [0.0, 2.0, 4.0, 6.0, 8.0, 15.0, 17.0, 19.0]  # the handoff between 8 and 15
    got = handoff_pause(commits, 7.0, 16.0)
    assert got["longest_gap_s"] == 7.0 and got["steady_gap_s"] == 2.0
    assert got["pause_s"] == pytest.approx(5.0)


def test_no_pause_without_commits_before_the_scale() -> None:
    assert handoff_pause([10.0, 12.0], 0.0, 20.0)["pause_s"] is None


def test_the_lag_summary_splits_the_window_under_load_from_the_tail_without() -> None:
    samples = [(0.0, 1.0), (2.0, 8.0), (4.0, 3.0), (150.0, 2.0), (152.0, 20.0), (156.0, 0.0)]
    got = lag_summary(samples, 150.0)
    assert got["window_end"] == 2.0 and got["peak"] == 20.0  # the peak over the tail too
    assert got["caught_up_at"] == 4.0 and got["tail_drained_s"] == 6.0


def test_the_lag_summary_of_a_backlog_that_never_drained() -> None:
    got = lag_summary([(0.0, 3.0), (148.0, 40.0), (200.0, 12.0)], 150.0)
    assert got["window_end"] == 40.0 and got["caught_up_at"] is None and got["tail_drained_s"] is None


def test_the_package_is_the_example_renamed_with_the_heavier_parse(tmp_path: Path) -> None:
    from relay.pipeline import load_package

    code = package(tmp_path, "as_x", "as_x_out")
    text = (code / "pipeline.py").read_text()
    assert 'OUTPUT_TOPIC = "as_x_out"' in text and ".where(_work(F.col('value')) >= 0)" in text
    _, pipeline = load_package(code)
    assert pipeline.name == "as_x" and pipeline.topics == ("as_x",)
