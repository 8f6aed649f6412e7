"""FirstCommitSensor: wait until an instance committed its first batch, without holding a worker slot."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseSensorOperator
from relay.errors import OperationError
from relay.ledger.models import InstanceState

from relay_airflow.hooks.ledger import LedgerHook


class FirstCommitSensor(BaseSensorOperator):
    """True once the ledger shows the instance ACTIVE (or DRAINING); fails at once if it died.

    Reschedule mode by default: between pokes the task gives its slot back, which matters with
    parallelism 4 and a first commit that takes 20-40 s. Use it when a deploy is split into submit +
    wait; ``relay.operations.deploy.deploy`` waits by itself.
    """

    template_fields = ("instance_id",)

    def __init__(
        self, *, instance_id: int | str, ledger_conn_id: str = LedgerHook.default_conn_name, **kwargs: Any
    ) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 5)
        super().__init__(**kwargs)
        self.instance_id = instance_id
        self.ledger_conn_id = ledger_conn_id

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
