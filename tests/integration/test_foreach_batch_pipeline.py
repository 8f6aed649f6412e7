"""ForEachBatch end to end (examples/foreach_batch_files) on real parts: the broker, the Spark cluster,
a PostgreSQL ledger.

The example writes each batch as JSON files into a directory named by the batch's source ranges,
overwritten on a replay. Deployed through a probe package (the example's module plus a gate the test
opens), so the test can also hold a batch, fence the instance, and see ``ctx.check_fence()`` refuse.
After a SIGKILL of the driver mid-stream every kept record must be in exactly one file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaProducer
from relay.artifacts import build_artifact
from relay.audit import audit
from relay.config import PROJECT_ROOT, RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import AttemptState, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.stop import stop

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, print_drivers, python_driver_pid, wait_relaunched

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = PROJECT_ROOT / "examples" / "foreach_batch_files"
PROBE = "fb_probe"
LEVELS = ("info", "error", "debug", "warning", "info", "error")  # 3 in 6 are kept

PROBE_PIPELINE = '''"""The foreach_batch_files example behind a gate the test opens (control/, beside out/).

Every call is logged to control/calls.jsonl. With control/hold present, a batch waits until
control/release, then runs the example's function; what that function raised (its ctx.check_fence()
once the test fenced the instance) goes to control/refused. With control/hold-after-write present, a
batch waits after its write (before Relay commits the cursors) until the test kills the driver."""

import dataclasses
import json
import os
import time
from pathlib import Path

from fb_probe import files_example as ex
from relay.pipeline import ForEachBatch


def sink():
    inner = ex.sink()
    control = Path(os.environ[ex.OUTPUT_DIR_ENV]).parent / "control"

    def fn(df, ctx):
        name = ex.batch_dir_name(ctx.ranges)
        with (control / "calls.jsonl").open("a") as calls:
            calls.write(json.dumps({"batch": ctx.batch_id, "epoch": ctx.epoch, "dir": name}) + "\\n")
        if name is not None and (control / "hold-after-write").exists():
            written = inner.fn(df, ctx)
            (control / "written.tmp").write_text(json.dumps({"epoch": ctx.epoch, "dir": name}))
            (control / "written.tmp").rename(control / "written")
            deadline = time.time() + 600
            while (control / "hold-after-write").exists() and time.time() < deadline:
                time.sleep(0.05)
            return written
        if name is None or not (control / "hold").exists():
            return inner.fn(df, ctx)
        (control / "held.tmp").write_text(json.dumps({"batch": ctx.batch_id, "dir": name}))
        (control / "held.tmp").rename(control / "held")
        deadline = time.time() + 600
        while not (control / "release").exists() and time.time() < deadline:
            time.sleep(0.05)
        try:
            return inner.fn(df, ctx)
        except Exception as exc:
            (control / "refused").write_text(f"{type(exc).__name__}: {exc}")
            raise

    return ForEachBatch(fn)


PIPELINE = dataclasses.replace(ex.PIPELINE, sink=sink)
'''


def probe_package(folder: Path) -> Path:
    """The example's module, unchanged, inside a package whose PIPELINE adds the gate."""
    package = folder / PROBE
    package.mkdir()
    (package / "__init__.py").write_text('"""The fence probe of the ForEachBatch test."""\n')
    shutil.copy(EXAMPLE / "pipeline.py", package / "files_example.py")
    (package / "pipeline.py").write_text(PROBE_PIPELINE)
    return package


def kept(ids: range) -> set[int]:
    return {n for n in ids if LEVELS[n % len(LEVELS)] in ("error", "warning")}


def produce(bootstrap: str, topic: str, ids: range, rate: float | None = None) -> None:
    """The records ``ids`` (keyed by id) plus one value that is not JSON."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    t0 = time.monotonic()
    try:
        for sent, n in enumerate(ids, 1):
            value = {"id": n, "level": LEVELS[n % len(LEVELS)], "msg": f"message {n}"}
            producer.send(topic, key=str(n).encode(), value=json.dumps(value).encode())
            if rate and sent % 50 == 0:
                time.sleep(max(0.0, sent / rate - (time.monotonic() - t0)))
        producer.send(topic, key=b"junk", value=b"not json")  # dropped by the transform
        producer.flush(60)
    finally:
        producer.close()


def files(out: Path, topic: str = "foreach_batch_files") -> tuple[Counter, list[str]]:
    """Every record id in the committed batch directories (those holding _SUCCESS), counted; and
    the directories without _SUCCESS (a write that was never completed nor replayed)."""
    seen: Counter = Counter()
    unfinished = []
    for batch_dir in sorted(out.glob("ranges-*")):
        if not (batch_dir / "_SUCCESS").exists():
            unfinished.append(batch_dir.name)
            continue
        for part in batch_dir.glob("part-*"):
            for line in part.read_text().splitlines():
                record = json.loads(line)
                assert record["level"] in ("error", "warning") and record["topic"] == topic, record
                seen[record["id"]] += 1
    return seen, unfinished


def exactly_once(out: Path, want: set[int]) -> None:
    seen, unfinished = files(out)
    twice = sorted(i for i, c in seen.items() if c > 1)
    missing, extra = sorted(want - set(seen)), sorted(set(seen) - want)
    assert (unfinished, twice, missing, extra) == ([], [], [], []), (
        f"unfinished {unfinished}; duplicates {twice[:20]} ({len(twice)}), missing {missing[:20]} "
        f"({len(missing)}), not kept {extra[:20]} ({len(extra)})"
    )


def test_foreach_batch_writes_each_record_once_and_check_fence_refuses_a_fenced_attempt(
    stack: RelayConfig, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = stack.with_(pipeline="foreach_batch_files", topic="foreach_batch_files", ledger_url=postgres_url)
    root = cfg.data_dir / f"fb-{uuid.uuid4().hex[:8]}"  # executors write here: never /tmp
    (root / "control").mkdir(parents=True)
    try:
        _scenario(cfg, root, tmp_path, monkeypatch)
    except AssertionError:
        print_drivers(cfg)
        raise
    finally:
        stop(cfg, timeout_s=60)  # nothing live after a pass; after a failure, no driver lingers
        shutil.rmtree(root, ignore_errors=True)


def _scenario(cfg: RelayConfig, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, control = root / "out", root / "control"
    monkeypatch.setenv("FOREACH_BATCH_FILES_DIR", str(out))  # copied to the driver by deploy
    ledger = Ledger(cfg.ledger_url)
    art = build_artifact(cfg, "fb1", pipeline_code=probe_package(tmp_path))
    assert art.pipeline["name"] == "foreach_batch_files"
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    produce(cfg.kafka_bootstrap, cfg.topic, range(0, 3000))
    inst_id = deploy(cfg, version="fb1", wait_s=300)["instance_id"]
    wait_for("the backlog to be written", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    exactly_once(out, kept(range(0, 3000)))

    # Records keep coming while the driver is SIGKILLed mid-batch: after fn wrote a directory, before
    # Relay committed the cursors. The master relaunches it and the replayed batch (same ranges)
    # overwrites that directory.
    producer = threading.Thread(
        target=produce, args=(cfg.kafka_bootstrap, cfg.topic, range(3000, 9000), 300.0)
    )
    (control / "hold-after-write").touch()
    producer.start()
    try:
        attempt_id, pid = python_driver_pid(ledger, inst_id)
        wait_for("a batch written, not committed", lambda: (control / "written").exists(), timeout=180)
        written = json.loads((control / "written").read_text())
        assert (out / written["dir"] / "_SUCCESS").exists()
        os.kill(pid, signal.SIGKILL)
        (control / "hold-after-write").unlink()
        wait_relaunched(ledger, inst_id, attempt_id, timeout=240)
    finally:
        producer.join()
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=420, interval=1)
    exactly_once(out, kept(range(0, 9000)))
    calls = [json.loads(line) for line in (control / "calls.jsonl").read_text().splitlines()]
    replays = [c for c in calls if c["dir"] == written["dir"] and c["epoch"] > written["epoch"]]
    assert replays, f"the killed batch {written} was not handed over again: {calls[-10:]}"
    report = audit(cfg, ledger)
    assert report.ok, report.to_json()
    assert report.totals["unread"] == 0
    records = ledger.recent_batches(cfg.pipeline, 10_000, inst_id)
    assert sum(b["rows_applied"] for b in records) >= len(kept(range(0, 9000)))  # fn's returned counts

    # Hold a batch inside fn, fence the instance, release it: the example's ctx.check_fence() must
    # refuse, nothing of that batch be written, and the attempt end FENCED (not relaunched).
    attempt = [a for a in ledger.attempts(inst_id) if a.state is AttemptState.RUNNING][-1]
    (control / "hold").touch()
    produce(cfg.kafka_bootstrap, cfg.topic, range(9000, 9100))
    wait_for("a batch held in fn", lambda: (control / "held").exists(), timeout=180)
    held = json.loads((control / "held").read_text())
    ledger.fence(inst_id, "test: fenced while a batch is in fn")
    (control / "release").touch()
    wait_for("fn to be refused", lambda: (control / "refused").exists(), timeout=60)
    refused = (control / "refused").read_text()
    assert refused.startswith("ZombieAttemptError") and "must not write" in refused, refused
    wait_for(
        "the fenced attempt to end",
        lambda: ledger.attempt(attempt.id).state is not AttemptState.RUNNING,
        timeout=120,
    )
    assert ledger.attempt(attempt.id).state is AttemptState.FENCED
    assert ledger.instance(inst_id).state is InstanceState.FENCED
    wait_for("the fenced driver to be gone", lambda: master_apps(cfg, cfg.pipeline) == [], timeout=120)
    assert not (out / held["dir"]).exists()
    exactly_once(out, kept(range(0, 9000)))  # the held batch wrote nothing
    assert not any(a.id > attempt.id for a in ledger.attempts(inst_id)), "a fenced driver was relaunched"
