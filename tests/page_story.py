"""A pipeline's recent history, written into a real ledger, for the Relay page's tests (no Spark).

Three hours of ``orders`` on two partitions: instance 1 (v1, blue) runs, an upgrade hands over to
instance 2 (v2, green) at H, a recovery declares a gap and starts instance 3 (v2, green), which is
still ACTIVE. One batch a minute, a health report every 5 minutes (the last one WARN), dead letters.
Rows are written with the Ledger API and the test builder, then dated back (``created_at`` & co.)
so the story spans the window the page shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from relay.health.report import Check, HealthReport, Level
from relay.ledger import schema as s
from relay.ledger.models import AttemptState, Color, Instance, InstanceState
from relay.ledger.store import Ledger

from tests.ledger_builder import LedgerBuilder

HOUR = 3600.0


@dataclass
class Story:
    """What was written, for the assertions."""

    pipeline: str
    topic: str
    now: float
    batches: int = 0
    reports: int = 0
    handoff: dict[int, int] = field(default_factory=dict)
    gaps: list[tuple[int, int, int, str]] = field(default_factory=list)
    dead_letters: int = 0
    instances: list[int] = field(default_factory=list)


def _date_instance(
    ledger: Ledger, inst: Instance, color: Color, state: InstanceState, t0: float, t1: float
) -> None:
    with ledger.tx() as conn:
        conn.execute(
            s.instances.update()
            .where(s.instances.c.id == inst.id)
            .values(color=color.value, state=state.value, created_at=t0, updated_at=t1, current_epoch=inst.id)
        )
        conn.execute(
            s.attempts.insert().values(
                instance_id=inst.id,
                epoch=inst.id,
                state=(AttemptState.RUNNING if state.live else AttemptState.STOPPED).value,
                started_at=t0 + 5,
                heartbeat_at=t1,
                ended_at=None if state.live else t1,
                host="127.0.0.1",
                pid=1000 + inst.id,
            )
        )


def _batches(
    ledger: Ledger,
    story: Story,
    inst: Instance,
    cursors: dict[int, int],
    t0: float,
    t1: float,
    stop: dict | None,
) -> None:
    """One batch a minute over [t0, t1); each moves both cursors (up to ``stop`` when given)."""
    rows = []
    t, n = t0, 0
    while t < t1:
        ranges = []
        for p in sorted(cursors):
            step = 120 + 40 * p + int(60 * math.sin(t / 900 + p))
            to = cursors[p] + step if stop is None else min(cursors[p] + step, stop[p])
            ranges.append({"topic": story.topic, "partition": p, "from": cursors[p], "to": to})
            cursors[p] = to
        read = sum(r["to"] - r["from"] for r in ranges)
        duration = 320 + 120 * math.sin(t / 600) + (900 if n % 37 == 5 else 0)
        rows.append(
            dict(
                pipeline=story.pipeline,
                instance_id=inst.id,
                attempt_id=inst.id,
                epoch=inst.id,
                batch_id=n,
                rows_read=read,
                rows_applied=read,
                rows_skipped=0,
                dead_letters=0,
                ranges=ranges,
                started_at=t - duration / 1000,
                committed_at=t,
                duration_ms=duration,
                commit_ms=2.0 + (n % 5),
            )
        )
        t, n = t + 60, n + 1
    with ledger.tx() as conn:
        conn.execute(s.batches.insert(), rows)
    story.batches += len(rows)


def _operation(
    ledger: Ledger, story: Story, kind: str, params: dict, data: dict, states: list[tuple[str, float]]
) -> int:
    op = ledger.open_operation(
        story.pipeline, kind, states[0][0], params, data, terminal=("DONE", "EXECUTED")
    )
    with ledger.tx() as conn:
        conn.execute(
            s.operations.update()
            .where(s.operations.c.id == op["id"])
            .values(
                state=states[-1][0],
                history=[{"state": st, "at": at} for st, at in states],
                created_at=states[0][1],
                updated_at=states[-1][1],
            )
        )
    return int(op["id"])


def _health_body(story: Story, at: float, rows: list[dict], last: bool) -> tuple[str, dict]:
    lag_level = Level.WARN if last else Level.OK
    checks = [
        Check("single_instance", Level.OK, "one instance runs: #3 (v2, green)", {"status": "RUNNING"}),
        Check("driver", Level.OK, "attempt epoch 3 RUNNING, no restart in 10 min"),
        Check("progress", Level.OK, "every partition moved in the window"),
        Check("lag", lag_level, "lag p0 1800 records", action="check the job's throughput" if last else None),
        Check("latency", Level.OK, "batch median 320 ms, p95 1200 ms"),
        Check("dead_letters", Level.WARN if last else Level.OK, f"{story.dead_letters} dead letter(s)"),
    ]
    report = HealthReport(story.pipeline, at, Level.worst([c.level for c in checks]), checks)
    report.data = {"down": False, "run_state": "RUNNING", "offsets": rows, "dead_letters": story.dead_letters}
    return report.status.value, report.to_json()


def _reports(ledger: Ledger, story: Story, t0: float) -> None:
    at = t0 + 300
    while at < story.now - 30:
        last = at + 300 >= story.now - 30
        rows = [
            {
                "topic": story.topic,
                "partition": p,
                "earliest": 0,
                "latest": 10_000 + int(at - t0) * 5,
                "cursor": 10_000 + int(at - t0) * 5 - (200 + 150 * p + int(120 * math.sin(at / 1200 + p))),
                "lag": 200 + 150 * p + int(120 * math.sin(at / 1200 + p)) + (1500 if last and p == 0 else 0),
            }
            for p in (0, 1)
        ]
        status, body = _health_body(story, at, rows, last)
        report_id = ledger.save_report(story.pipeline, "health", status, body)
        with ledger.tx() as conn:
            conn.execute(s.reports.update().where(s.reports.c.id == report_id).values(created_at=at))
        story.reports += 1
        at += 300


def _dead(ledger: Ledger, story: Story, inst: Instance, at: float, offsets: list[int]) -> None:
    with ledger.tx() as conn:
        conn.execute(
            s.dead_letters.insert(),
            [
                dict(
                    pipeline=story.pipeline,
                    instance_id=inst.id,
                    topic=story.topic,
                    partition=o % 2,
                    offset=o,
                    key=str(-o).encode(),
                    value=b"\xff\x00not json" if n == 0 else f'{{"n": -{o}}}'.encode(),
                    error=f"ValueError: negative key -{o}",
                    created_at=at + 60 * n,
                )
                for n, o in enumerate(offsets)
            ],
        )
    story.dead_letters += len(offsets)


def write_story(ledger_url: str, now: float, pipeline: str = "orders", topic: str = "orders") -> Story:
    """Write the three-hour story ending at ``now`` into the (existing, empty) ledger at ``ledger_url``."""
    ledger = Ledger(ledger_url)
    build = LedgerBuilder(ledger, pipeline, topic)
    story = Story(pipeline, topic, now)
    t0 = now - 3 * HOUR
    upgrade_at, recover_at = t0 + HOUR, t0 + 2 * HOUR

    blue = build.instance("v1")
    cursors = {0: 0, 1: 0}
    _batches(ledger, story, blue, cursors, t0 + 60, upgrade_at, None)
    story.handoff = {p: c + 50 for p, c in cursors.items()}
    # blue drains to H (one batch), then green takes over from H
    _batches(ledger, story, blue, cursors, upgrade_at + 20, upgrade_at + 21, story.handoff)
    for p in (0, 1):
        build.lease(blue, p, 0, story.handoff[p], story.handoff[p])
    _date_instance(ledger, blue, Color.BLUE, InstanceState.STOPPED, t0, upgrade_at + 40)
    _operation(
        ledger,
        story,
        "upgrade",
        {"version": "v2", "handoff": "latest"},
        {
            "blue_id": blue.id,
            "blue_version": "v1",
            "handoff": {str(p): o for p, o in story.handoff.items()},
            "handoff_at": upgrade_at + 5,
        },
        [
            ("PREFLIGHT", upgrade_at),
            ("GREEN_STARTING", upgrade_at + 5),
            ("DRAINING_BLUE", upgrade_at + 25),
            ("STOPPING_BLUE", upgrade_at + 35),
            ("DONE", upgrade_at + 40),
        ],
    )

    green = build.instance("v2")
    cursors = dict(story.handoff)
    _batches(ledger, story, green, cursors, upgrade_at + 30, recover_at, None)
    for p in (0, 1):
        build.lease(green, p, story.handoff[p], cursors[p], cursors[p])
    _date_instance(ledger, green, Color.GREEN, InstanceState.STOPPED, upgrade_at, recover_at + 20)
    _dead(
        ledger,
        story,
        green,
        upgrade_at + 600,
        [story.handoff[0] + 7, story.handoff[1] + 9, cursors[0] - 3, cursors[1] - 5],
    )

    lost_end, target = cursors[0] + 300, cursors[0] + 400
    with ledger.tx() as conn:
        ledger.record_gap(
            conn,
            pipeline,
            topic,
            0,
            cursors[0],
            lost_end,
            "lost",
            "recovery: deleted by retention before it was applied",
        )
        ledger.record_gap(
            conn, pipeline, topic, 0, lost_end, target, "skipped", "recovery: skipped on purpose"
        )
        conn.execute(s.gaps.update().where(s.gaps.c.pipeline == pipeline).values(created_at=recover_at + 25))
    story.gaps = [(0, cursors[0], lost_end, "lost"), (0, lost_end, target, "skipped")]
    plan = [
        {
            "partition": 0,
            "cursor": cursors[0],
            "earliest": lost_end,
            "latest": target + 5000,
            "target": target,
        },
        {
            "partition": 1,
            "cursor": cursors[1],
            "earliest": 0,
            "latest": cursors[1] + 5000,
            "target": cursors[1],
        },
    ]
    _operation(
        ledger,
        story,
        "recovery",
        {"strategy": "earliest", "version": "v2", "reason": "retention overtook the cursor"},
        {"plan": {"partitions": plan}, "started_at": recover_at},
        [
            ("RECOVERING", recover_at),
            ("ARCHIVED", recover_at + 20),
            ("LEASED", recover_at + 25),
            ("EXECUTED", recover_at + 60),
        ],
    )

    third = build.instance("v2")
    cursors = {0: target, 1: cursors[1]}
    starts = dict(cursors)
    _batches(ledger, story, third, cursors, recover_at + 60, now - 20, None)
    for p in (0, 1):
        build.lease(third, p, starts[p], cursors[p])
    _date_instance(ledger, third, Color.GREEN, InstanceState.ACTIVE, recover_at + 25, now - 20)
    _dead(ledger, story, third, recover_at + 1800, [cursors[0] - 100, cursors[1] - 90])
    story.instances = [blue.id, green.id, third.id]
    _reports(ledger, story, t0)
    ledger.close()
    return story
