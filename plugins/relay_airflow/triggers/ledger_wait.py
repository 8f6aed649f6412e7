"""LedgerWaitTrigger: poll one of the library's wait conditions (first commit, drain, stop, apps).

The checks are blocking (SQLAlchemy, requests), so each one runs in a thread (``asyncio.to_thread``)
and the triggerer's event loop never blocks. The condition itself is the library's
(``relay.operations.waits``): the CLI and Airflow judge a wait the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from relay.errors import OperationError, RelayError

DONE, FAILED, TIMEOUT = "done", "failed", "timeout"


class LedgerWaitTrigger(BaseTrigger):
    """Fires once: ``{"status": "done", "result": {...}}`` when the condition holds,
    ``{"status": "failed", "error": ...}`` when it never will (or the check itself broke),
    ``{"status": "timeout", "error": ...}`` at ``timeout_at`` (epoch seconds).

    ``kind`` and ``args`` name the condition (see ``relay.operations.waits.make_wait``); extra keys
    in ``args`` travel back in the event untouched (a step's own bookkeeping). A transient error
    (ledger locked, master not answering) is logged and polled again until the deadline.
    Addresses come from the ``relay_*`` connections and ``RELAY_*``, read in the triggerer;
    ``pipeline`` pins the pipeline the waiting task acts on. Nothing secret is serialized.
    """

    def __init__(
        self,
        kind: str,
        args: dict[str, Any],
        timeout_at: float,
        pipeline: str,
        poll_seconds: float = 2.0,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.args = dict(args)
        self.timeout_at = float(timeout_at)
        self.pipeline = pipeline
        self.poll_seconds = float(poll_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "kind": self.kind,
                "args": self.args,
                "timeout_at": self.timeout_at,
                "pipeline": self.pipeline,
                "poll_seconds": self.poll_seconds,
            },
        )

    def _event(self, status: str, started: float, **body: Any) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "kind": self.kind,
                "args": self.args,
                "waited_s": round(time.time() - started, 2),
                "result": body.get("result"),
                "error": body.get("error"),
            }
        )

    def _open(self) -> tuple[Any, Any]:
        """Config and ledger, built in a thread (connections may be read from a secrets backend)."""
        from relay.ledger.store import Ledger
        from relay.operations.waits import make_wait

        from relay_airflow.config import relay_config_from_connections

        config = relay_config_from_connections(pipeline=self.pipeline)  # its topic, code: pipelines file
        ledger = Ledger(config.ledger_url)
        return make_wait(config, ledger, self.kind, self.args), ledger

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.time()
        ledger = None
        try:
            wait, ledger = await asyncio.to_thread(self._open)
            last_error = ""
            # The triggerer's async loop (relay.polling.poll is synchronous and would hold its event
            # loop): the same check, its own deadline (timeout_at survives a triggerer restart).
            while True:
                try:
                    done = await asyncio.to_thread(wait.check)
                except OperationError as exc:
                    yield self._event(FAILED, started, error=str(exc))
                    return
                except RelayError as exc:  # transient: locked ledger, master restarting
                    done, last_error = None, f"{type(exc).__name__}: {exc}"
                    self.log.warning("%s check failed, polling again: %s", self.kind, last_error)
                if done is not None:
                    yield self._event(DONE, started, result=done)
                    return
                if time.time() >= self.timeout_at:
                    shortfall = getattr(wait, "shortfall", None)  # what the gate still misses
                    why = (
                        f"{self.kind} not reached by the deadline"
                        + (f": {shortfall()}" if shortfall else "")
                        + (f" (last error: {last_error})" if last_error else "")
                    )
                    yield self._event(TIMEOUT, started, error=why)
                    return
                await asyncio.sleep(min(self.poll_seconds, max(self.timeout_at - time.time(), 0.05)))
        except Exception as exc:  # noqa: BLE001 - any other error reaches the task as an event
            yield self._event(FAILED, started, error=f"{type(exc).__name__}: {exc}")
        finally:
            if ledger is not None:
                ledger.close()
