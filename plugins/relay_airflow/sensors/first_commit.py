"""FirstCommitSensor: wait until an instance committed its first batch, without holding a worker slot."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException
from relay.errors import OperationError
from relay.ledger.models import InstanceState
from relay.operations.waits import FIRST_COMMIT

from relay_airflow.hooks.ledger import LedgerHook
from relay_airflow.triggers.ledger_wait import DONE, LedgerWaitTrigger

DEFER_MARGIN = timedelta(minutes=5)


class FirstCommitSensor(BaseSensorOperator):
    """Done once the ledger shows the instance ACTIVE (or DRAINING); fails at once if its driver died.

    Deferrable by default: the task waits in state ``deferred`` while
    :class:`~relay_airflow.triggers.ledger_wait.LedgerWaitTrigger` polls the ledger from the
    triggerer (the library's ``FirstCommitWait``: a dead driver, a failed attempt or a driver the
    worker keeps relaunching end the wait with the driver's own error). ``wait_seconds`` is
    templated (e.g. ``"{{ params.wait_seconds }}"``). With ``deferrable=False`` it pokes the
    instance's state in reschedule mode instead.
    """

    template_fields = ("instance_id", "wait_seconds")

    def __init__(
        self,
        *,
        instance_id: int | str,
        wait_seconds: int | str = 300,
        deferrable: bool = True,
        ledger_conn_id: str = LedgerHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 5)
        super().__init__(**kwargs)
        self.instance_id = instance_id
        self.wait_seconds = wait_seconds
        self.deferrable = deferrable
        self.ledger_conn_id = ledger_conn_id

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from relay_airflow.config import relay_config_from_connections, selected_pipeline

        timeout_s = float(self.wait_seconds)
        self.defer(
            trigger=LedgerWaitTrigger(
                kind=FIRST_COMMIT,
                args={"instance_id": int(self.instance_id)},
                timeout_at=time.time() + timeout_s,
                pipeline=relay_config_from_connections(pipeline=selected_pipeline(context)).pipeline,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout_s) + DEFER_MARGIN,
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] != DONE:
            raise AirflowFailException(f"instance {self.instance_id}: no first commit: {event['error']}")
        self.log.info("instance %s committed its first batch after %ss", self.instance_id, event["waited_s"])
        return {**event["result"], "first_commit_s": event["waited_s"]}

    def poke(self, context: Any) -> bool:
        ledger = LedgerHook(self.ledger_conn_id).get_conn()
        try:
            inst = ledger.instance(int(self.instance_id))
        finally:
            ledger.close()
        if inst.state in (InstanceState.ACTIVE, InstanceState.DRAINING):
            return True
        if not inst.state.live:
            why = inst.error or "see driver log"
            raise OperationError(f"instance {inst.id} is {inst.state.value}: {why}")
        self.log.info("instance %s is %s, waiting for its first commit", inst.id, inst.state.value)
        return False
