"""Section ``upgrade``: a blue/green handoff under steady load, against a cold deploy's first commit."""

from __future__ import annotations

import threading
import time
from typing import Any

from relay.config import RelayConfig
from relay.errors import OperationError

from .context import Context, ensure_running
from .results import figure


class RateProducer:
    """Counter messages at a steady rate on a thread, until stopped (the upgrade runs under load)."""

    def __init__(self, config: RelayConfig, rate: float) -> None:
        self.config = config
        self.rate = rate
        self.sent = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.sent

    def _run(self) -> None:
        from kafka import KafkaProducer
        from relay.producer import highest_counter

        try:
            previous = highest_counter(self.config.kafka_bootstrap, self.config.topic)
            first = 0 if previous is None else previous + 1
            producer = KafkaProducer(bootstrap_servers=self.config.kafka_bootstrap, acks="all", linger_ms=5)
        except Exception as exc:  # noqa: BLE001 - reported by the section
            self.errors.append(exc)
            return
        t0 = time.monotonic()
        try:
            while not self._stop.is_set():
                text = str(first + self.sent).encode()
                producer.send(self.config.topic, key=text, value=text).add_errback(self.errors.append)
                self.sent += 1
                ahead = t0 + self.sent / self.rate - time.monotonic()
                if ahead > 0:
                    self._stop.wait(ahead)
            producer.flush()
        finally:
            producer.close()


def section_upgrade(ctx: Context) -> dict[str, Any]:
    from relay.ledger.store import Ledger
    from relay.operations.upgrade import upgrade

    cfg, opts = ctx.config, ctx.options
    ensure_running(ctx)
    live = Ledger(cfg.ledger_url).instances(cfg.pipeline, live_only=True)
    target = "v2" if live[-1].version != "v2" else "v3"
    producer = RateProducer(cfg, opts.upgrade_rate)
    producer.start()
    ctx.progress(f"upgrade: {live[-1].version} -> {target} while producing {opts.upgrade_rate:.0f} msg/s")
    t0 = time.time()
    try:
        time.sleep(2)  # records in flight when the handoff is taken
        result = upgrade(cfg, target, grace_s=600, drain_timeout_s=600, progress=ctx.progress)
    finally:
        sent = producer.stop()
    ctx.windows["upgrade"] = (t0, time.time())
    if producer.errors:
        raise OperationError(f"the producer failed during the upgrade: {producer.errors[0]}")
    if result.get("state") != "DONE":
        raise OperationError(f"upgrade ended {result.get('state')}: {result.get('error')}")
    dups, gaps = int(result.get("duplicates", -1)), int(result.get("gaps", -1))
    figures = [
        figure(
            "handoff -> green's first commit",
            result.get("green_first_commit_s"),
            "s",
            "cold deploy first commit",
            ctx.deploy_first_commit_s,
        ),
        figure("blue drain", result.get("blue_drain_s"), "s"),
        figure(
            "upgrade total", result.get("total_s"), "s", "cold deploy first commit", ctx.deploy_first_commit_s
        ),
        figure("duplicates (must be 0)", dups, "records"),
        figure("gaps (must be 0)", gaps, "records"),
    ]
    if dups != 0 or gaps != 0:
        raise OperationError(f"upgrade applied {dups} record(s) twice and missed {gaps}")
    keep = {
        k: result.get(k)
        for k in (
            "upgrade_id",
            "state",
            "blue_id",
            "green_id",
            "handoff",
            "green_first_commit_s",
            "blue_drain_s",
            "total_s",
            "applied_by_blue",
            "applied_by_green",
            "duplicates",
            "gaps",
        )
    }
    return {"figures": figures, "details": {"result": keep, "produced_during": sent, "version": target}}
