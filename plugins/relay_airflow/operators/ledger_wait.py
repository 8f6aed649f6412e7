"""LedgerWaitOperator: a persisted step that waits without holding a worker.

``prepare(context)`` runs in the worker and either returns the step's result (its work is already
done: nothing to wait for) or a :class:`WaitFor`; the task then defers to
:class:`~relay_airflow.triggers.ledger_wait.LedgerWaitTrigger` (state ``deferred``: no worker slot)
and ``complete(context, event)`` runs in a worker again with the trigger's event. Both callables act
on the ledger's persisted state, so clearing the task reruns them safely.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from relay_airflow.lineage import RelayLineage
from relay_airflow.triggers.ledger_wait import LedgerWaitTrigger

#: How long past the trigger's own deadline Airflow waits before it fails the deferral itself.
DEFER_MARGIN = timedelta(minutes=5)


@dataclass(frozen=True)
class WaitFor:
    """What to wait for: a condition of ``relay.operations.waits`` and how long (seconds from now)."""

    kind: str
    args: dict[str, Any]
    timeout_s: float
    pipeline: str
    poll_seconds: float = 2.0
    note: str = field(default="")


Prepare = Callable[[Any], "WaitFor | Any"]
Complete = Callable[[Any, dict[str, Any]], Any]


class LedgerWaitOperator(RelayLineage, BaseOperator):
    """Run ``prepare``, defer on the :class:`WaitFor` it returns, then ``complete`` with the event.

    Its OpenLineage events name the pipeline's datasets when ``complete`` ended an operation
    (``relay_airflow.lineage.RelayLineage``)."""

    ui_color = "#e8f4ea"

    def __init__(self, *, prepare: Prepare, complete: Complete, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prepare = prepare
        self.complete = complete

    def execute(self, context: Any) -> Any:
        step = self.prepare(context)
        if not isinstance(step, WaitFor):
            return step
        self.log.info("waiting (deferred, no worker held) for %s %s: %s", step.kind, step.args, step.note)
        self.defer(
            trigger=LedgerWaitTrigger(
                kind=step.kind,
                args=step.args,
                timeout_at=time.time() + step.timeout_s,
                pipeline=step.pipeline,
                poll_seconds=step.poll_seconds,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=step.timeout_s) + DEFER_MARGIN,
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self.log.info("wait for %s ended %s after %ss", event["kind"], event["status"], event["waited_s"])
        return self.complete(context, event)
