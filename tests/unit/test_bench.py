"""The pure parts of ``relay bench``: statistics, ratios, the table, the result's JSON shape.

No services: the benchmark itself needs the embedded stack and is run by ``relay bench``.
"""

from __future__ import annotations

import json

import pytest
from relay.errors import ConfigError
from relay_dev.bench import (
    SECTIONS,
    BenchOptions,
    PhaseTimer,
    classify_process,
    figure,
    fmt_number,
    fmt_ratio,
    memory_peaks,
    new_result,
    parse_sections,
    percentile,
    ratio,
    render_table,
    summarize,
    throughput_from_batches,
    write_result,
)


def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)  # numpy: 95.05
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_reports_median_p95_and_bounds() -> None:
    s = summarize([10, 20, 30, 40])
    assert s["n"] == 4 and s["median"] == 25 and s["min"] == 10 and s["max"] == 40 and s["mean"] == 25
    assert s["p95"] == pytest.approx(38.5)
    assert summarize([]) == {"n": 0, "median": None, "p95": None, "min": None, "max": None, "mean": None}


def test_ratio_and_formatting() -> None:
    assert ratio(50, 200) == 0.25
    assert ratio(None, 1) is None and ratio(1, None) is None and ratio(1, 0) is None
    assert fmt_ratio(0.25) == "0.25x" and fmt_ratio(None) == "-"
    assert fmt_number(None) == "-"
    assert fmt_number(123456.7) == "123,457"
    assert fmt_number(512.4) == "512"
    assert fmt_number(42.25) == "42.2" or fmt_number(42.25) == "42.3"
    assert fmt_number(3.14159) == "3.14"
    assert fmt_number(6) == "6" and fmt_number(0.0) == "0"


def test_figure_carries_its_ratio() -> None:
    f = figure("applied", 20_000, "msg/s", "kafka-python", 100_000, better="higher")
    assert f["ratio"] == 0.2 and f["better"] == "higher" and f["baseline_name"] == "kafka-python"
    assert figure("max rows", 10, "rows")["ratio"] is None


def test_sections_parse_in_run_order_and_reject_unknown_names() -> None:
    assert parse_sections(None) == SECTIONS
    assert parse_sections("memory, throughput") == ("throughput", "memory")
    with pytest.raises(ConfigError):
        parse_sections("throughput,speed")
    with pytest.raises(ConfigError):
        parse_sections(" , ")


def test_options_quick_and_messages() -> None:
    full = BenchOptions.build()
    assert full.messages == 500_000 and full.max_offsets_per_trigger == 50_000 and full.partitions == 3
    quick = BenchOptions.build(quick=True, only="ledger")
    assert quick.messages == 50_000 and quick.only == ("ledger",)
    assert quick.max_offsets_per_trigger < quick.messages  # several batches: the bound is visible
    small = BenchOptions.build(messages=20_000)
    assert small.messages == 20_000 and small.max_offsets_per_trigger == 4_000
    with pytest.raises(ConfigError):
        BenchOptions.build(messages=0)


def _batch(batch_id: int, start: float, end: float, rows: int, to: dict[int, int]) -> dict:
    return {
        "batch_id": batch_id,
        "started_at": start,
        "committed_at": end,
        "rows_read": rows,
        "ranges": [{"topic": "t", "partition": p, "from": 0, "to": o} for p, o in to.items()],
    }


def test_throughput_runs_from_first_batch_start_to_the_batch_reaching_latest() -> None:
    latest = {0: 100, 1: 100}
    batches = [
        _batch(0, 10.0, 12.0, 100, {0: 50, 1: 50}),
        _batch(1, 12.5, 14.0, 100, {0: 100, 1: 100}),
        _batch(2, 20.0, 20.5, 3, {0: 103}),  # later trickle: not part of the backlog
        _batch(3, 21.0, 21.1, 0, {}),
    ]
    r = throughput_from_batches(reversed(batches), latest)
    assert r["reached_latest"] and r["batches"] == 2 and r["rows"] == 200
    assert r["seconds"] == pytest.approx(4.0) and r["msg_s"] == pytest.approx(50.0)
    assert r["max_batch_rows"] == 100 and r["first_batch_s"] == pytest.approx(2.0)
    assert r["warm_msg_s"] == pytest.approx(100 / 1.5)


def test_throughput_without_batches_or_not_reaching_latest() -> None:
    assert throughput_from_batches([], {0: 1})["msg_s"] is None
    r = throughput_from_batches([_batch(0, 0.0, 1.0, 10, {0: 10})], {0: 100})
    assert not r["reached_latest"] and r["rows"] == 10


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        (
            ["/usr/bin/java", "-cp", "x", "org.apache.spark.deploy.worker.DriverWrapper", "spark://"],
            "driver_jvm",
        ),
        (["/usr/lib/jvm/bin/java", "org.apache.spark.executor.CoarseGrainedExecutorBackend"], "executor_jvm"),
        (["java", "org.apache.spark.deploy.master.Master", "--host"], "spark_master"),
        (["java", "org.apache.spark.deploy.worker.Worker"], "spark_worker"),
        (
            ["/venv/bin/python", "/data/artifacts/v1/pipeline_driver.py", "--instance-id", "7"],
            "python_driver",
        ),
        (["/venv/bin/python", "-m", "pyspark.daemon"], "python_workers"),
        (["/site-packages/noida_db/noida-db", "start", "--only", "kafka"], "kafka"),
        ([], "other"),
    ],
)
def test_processes_are_classified_by_command_line(cmd: list[str], expected: str) -> None:
    assert classify_process(cmd) == expected


def test_memory_peaks_take_the_largest_sample_per_category() -> None:
    samples = [
        {
            "at": 1,
            "categories": {
                "driver_jvm": {"rss": 300.0, "pss": 280.0, "procs": 1},
                "python_workers": {"rss": 100.0, "pss": 60.0, "procs": 2},
            },
            "total_rss": 400.0,
            "total_pss": 340.0,
        },
        {
            "at": 2,
            "categories": {"driver_jvm": {"rss": 350.0, "pss": 330.0, "procs": 1}},
            "total_rss": 350.0,
            "total_pss": 330.0,
        },
    ]
    peaks = memory_peaks(
        samples, {11: ("driver_jvm", 360.0), 12: ("python_workers", 70.0), 13: ("python_workers", 50.0)}
    )
    assert peaks["categories"]["driver_jvm"]["peak_rss_mb"] == 350.0
    workers = peaks["categories"]["python_workers"]
    assert workers == {"peak_rss_mb": 100.0, "peak_pss_mb": 60.0, "max_procs": 2, "hwm_sum_mb": 120.0}
    assert peaks["stack_peak_rss_mb"] == 400.0 and peaks["samples"] == 2
    assert memory_peaks([])["stack_peak_rss_mb"] is None


def test_phase_timer_keys_statements_by_verb_and_table() -> None:
    assert PhaseTimer.key("SELECT instances.id FROM instances WHERE id = ? FOR UPDATE") == "SELECT instances"
    assert PhaseTimer.key("INSERT INTO messages (pipeline) VALUES (?)") == "INSERT messages"
    assert PhaseTimer.key("UPDATE leases SET next_offset=? WHERE id = ?") == "UPDATE leases"
    assert PhaseTimer.key("BEGIN IMMEDIATE") == "BEGIN"


def test_result_json_shape_and_table(tmp_path) -> None:  # noqa: ANN001 - pytest fixture
    result = new_result(BenchOptions.build(quick=True, only="throughput,ledger"), "20260101-000000", tmp_path)
    assert result["schema"] == 1 and set(result["sections"]) == set(SECTIONS)
    assert all(s["status"] == "skipped" for s in result["sections"].values())
    result["machine"] = {
        "cores": 2,
        "memory_gib": 24.0,
        "python": "3.11",
        "pyspark": "4.2.0",
        "java": "17",
        "kafka_python": "3.0",
        "crc32c": True,
        "load_start": [1.0, 1.0, 1.0],
        "load_end": [2.0, 1.0, 1.0],
    }
    result["sections"]["throughput"].update(
        status="ok",
        figures=[
            figure("applied end to end", 25_000, "msg/s", "kafka-python consumer", 100_000, better="higher")
        ],
    )
    result["sections"]["ledger"].update(status="failed", error="LedgerError: boom")
    result["ok"] = False
    path = tmp_path / "results.json"
    write_result(result, path)
    back = json.loads(path.read_text())
    assert back["options"]["only"] == ["throughput", "ledger"] and back["options"]["quick"] is True
    fig = back["sections"]["throughput"]["figures"][0]
    assert set(fig) == {"name", "value", "unit", "baseline_name", "baseline", "ratio", "better"}
    table = render_table(back)
    assert "applied end to end" in table and "25,000" in table and "100,000" in table and "0.25x" in table
    assert "FAILED: LedgerError: boom" in table and "overall: FAILED" in table
    assert "2 cores" in table and "load average" in table


# ------------------------------------------------------------------ processing pause (bench/pause.py)
def _row(instance: int, batch: int, committed: float, ranges: list[tuple[int, int, int]]) -> dict:
    return {
        "instance_id": instance,
        "batch_id": batch,
        "committed_at": committed,
        "ranges": [{"topic": "t", "partition": p, "from": a, "to": b} for p, a, b in ranges],
    }


def test_application_times_join_the_batch_whose_ranges_cover_the_offset() -> None:
    from relay_dev.bench.pause import application_times, covers

    assert covers([{"topic": "t", "partition": 0, "from": 5, "to": 7}], "t", 0, 6)
    assert not covers([{"topic": "t", "partition": 0, "from": 5, "to": 7}], "t", 0, 7)
    assert not covers([{"topic": "u", "partition": 0, "from": 5, "to": 7}], "t", 0, 6)
    batches = [
        _row(1, 0, 10.0, [(0, 0, 2)]),
        _row(1, 0, 12.0, []),  # a replayed batch 0 after a relaunch: recorded, applies nothing
        _row(1, 1, 11.0, [(0, 2, 4)]),
        _row(2, 0, 20.0, [(0, 4, 6)]),  # green's batch 0: same batch id, another instance
    ]
    messages = [
        {"topic": "t", "partition": 0, "offset": o, "instance_id": i, "batch_id": b}
        for o, i, b in [
            (0, 1, 0),
            (1, 1, 0),
            (2, 1, 1),
            (3, 1, 1),
            (4, 2, 0),
            (5, 2, 0),
            (5, 1, 1),
            (9, 1, 2),
        ]
    ]
    messages.append({"topic": "other", "partition": 0, "offset": 0, "instance_id": 1, "batch_id": 0})
    applied, unmatched = application_times(messages, batches, "t")
    assert applied[(0, 0)] == [10.0] and applied[(0, 3)] == [11.0] and applied[(0, 4)] == [20.0]
    # (5, instance 1, batch 1): instance 1 wrote it and never committed it (it died; green took the
    # row over): applied when green's batch covering 5 committed; with green's own row, twice.
    assert applied[(0, 5)] == [20.0, 20.0]
    assert unmatched == 1  # offset 9: no commit covers it


def test_latency_windows_pause_and_exactly_once_counts() -> None:
    from relay_dev.bench.pause import (
        exactly_once_counts,
        in_flight,
        join_samples,
        latency_summary,
        pause_s,
    )

    produced = {(0, 0): 1.0, (0, 1): 2.0, (0, 2): 3.0, (1, 0): 4.0, (1, 1): 5.0}
    applied = {(0, 0): [1.5], (0, 1): [2.5, 9.0], (0, 2): [13.0], (1, 0): [13.5]}
    samples = join_samples(produced, applied)
    assert [(s.partition, s.offset) for s in samples] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert samples[1].applied == 2.5 and samples[2].latency == 10.0  # first application counts
    assert exactly_once_counts(produced, applied) == {"records": 5, "duplicates": 1, "gaps": 1}
    steady = latency_summary(in_flight(samples, 0.0, 2.2))
    assert steady["n"] == 2 and steady["max_s"] == 0.5 and steady["p50_s"] == 0.5
    # produced before the window, applied inside it: in flight during the operation
    op = latency_summary(in_flight(samples, 3.5, 5.0))
    assert (
        op["n"] == 2 and op["max_s"] == 10.0 and op["worst"]["offset"] == 2 and op["worst"]["partition"] == 0
    )
    assert pause_s(op, steady) == 9.5
    assert pause_s(latency_summary([]), steady) is None
    assert latency_summary([]) == {"n": 0, "p50_s": None, "p99_s": None, "max_s": None, "worst": None}


def test_the_operation_is_split_at_the_handoff_into_start_up_and_handoff_pauses() -> None:
    """Green's start-up slows blue long before the handoff: that record is the start-up's pause,
    not the handoff's."""
    from relay_dev.bench.pause import join_samples, latency_summary
    from relay_dev.bench.upgrade import _phase_pauses

    produced = {(0, 0): 10.0, (0, 1): 50.0, (0, 2): 51.0, (0, 3): 20.0}
    # 6 s and 1 s at start-up, 2.5 s and 1 s at the handoff
    applied = {(0, 0): [16.0], (0, 1): [52.5], (0, 2): [52.0], (0, 3): [21.0]}
    samples = join_samples(produced, applied)
    steady, lat = {"max_s": 2.0, "p50_s": 0.8}, {}
    result = {"started_at": 5.0, "handoff_at": 50.5, "caught_up_at": 52.5}
    names = {f["name"]: f["value"] for f in _phase_pauses("upgrade", result, samples, steady, lat)}
    assert names == {
        "upgrade: latency p50 during green's start-up": 2.5,  # 1, 2.5 (in flight at 50-50.5), 6
        "upgrade: pause during green's start-up": 4.0,
        "upgrade: latency max at the handoff": 2.5,
        "upgrade: pause at the handoff": 0.5,
    }
    assert lat["upgrade handoff"] == latency_summary(s for s in samples if s.produced >= 50)
    assert lat["upgrade start-up"] == latency_summary(s for s in samples if s.produced <= 50)
    assert _phase_pauses("rollback", {"started_at": 5.0, "handoff_at": 50.5}, samples, steady, lat) == []


def test_timing_figures_print_the_keys_the_result_has() -> None:
    from relay_dev.bench.upgrade import timing_figures

    result = {
        "total_s": 30.0,
        "green_first_commit_s": 24.0,
        "grace_s": 600,
        "handoff_s": 0.2,
        "state": "DONE",
    }
    names = [f["name"] for f in timing_figures("upgrade", result, 23.0)]
    assert names == ["upgrade: handoff -> green's first commit", "upgrade: total", "upgrade: handoff_s"]
    assert timing_figures("rollback", {"total_s": 46.0}, 23.0)[0]["ratio"] == 2.0
