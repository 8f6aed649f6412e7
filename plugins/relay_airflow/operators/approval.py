"""RecoveryApprovalOperator: a person approves the recovery plan before any record is declared lost.

Airflow 3's human-in-the-loop ``ApprovalOperator`` with the plan as its body (shown under the task's
*Required actions* in the UI, and by the REST API's ``hitlDetails``). Approve: the recovery runs.
Reject: this task and every task after it are skipped and the ledger is untouched. Nobody answers within
``response_timeout``: the default, Reject, is taken.

Answering within seconds of the request (an automated caller; a person is slower) can end this task
``failed`` with the answer recorded, whatever it was: Airflow 3.3.2's scheduler takes the executor's
report of the worker that parked the task (same key, same try) for the resumed attempt, and ignores it
only while that attempt is still ``scheduled`` (airflow/jobs/scheduler_job_runner.py:1476-1494;
apache/airflow #67287, #72716). The later tasks are then ``upstream_failed``: nothing was executed and
the ledger is untouched; trigger a new run. A caller of the REST API answers once the scheduler has
taken in that report (``TaskInstance Finished: ... task_id=approve ... state=awaiting_input`` in its
log), as ``tests/integration/test_airflow_dags.py`` does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk.exceptions import AirflowSkipException

RESPONSE_TIMEOUT = timedelta(hours=24)


def plan_markdown(planned: dict[str, Any]) -> str:
    """The plan as a person reads it: what is declared lost, per partition and in total."""
    plan = planned["plan"]
    lines = [
        f"**Pipeline** `{planned['pipeline']}`, topic `{plan['topic']}`, strategy **{plan['strategy']}**.",
        "",
        f"**{plan['total_lost']} record(s) will be declared lost** (Kafka retention deleted them before "
        f"they were applied), {plan['total_skipped']} skipped on purpose, "
        f"{plan['total_reprocess']} applied again.",
        "",
        "| partition | cursor | earliest | latest | target | lost | skipped | reprocess | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in plan["partitions"]:
        cells = [p[c] for c in ("partition", "cursor", "earliest", "latest", "target", "lost", "skipped")]
        lines.append("| " + " | ".join(str(c) for c in [*cells, p["reprocess"], p["note"] or ""]) + " |")
    lines += [f"- warning: {w}" for w in plan.get("warnings", [])]
    if planned.get("resume_recovery_id") is not None:
        lines.append(f"\nApproving resumes recovery {planned['resume_recovery_id']}, already in progress.")
    lines.append(
        "\nApprove: stop what runs, archive the checkpoints, record the gaps, start a fresh instance at "
        "the targets. Executing is refused if retention took more than this by then. "
        "Reject: nothing changes."
    )
    return "\n".join(lines)


class RecoveryApprovalOperator(ApprovalOperator):
    """Ask for approval of the plan the task ``plan_task_id`` pushed; skip on a dry run.

    ``pre_approved`` (the DAG param) is an automated caller's explicit approval: the task then
    succeeds at once, says so in its log and XCom, and asks nobody.
    """

    def __init__(self, *, plan_task_id: str = "plan", **kwargs: Any) -> None:
        kwargs.setdefault("subject", "Approve the recovery plan")
        kwargs.setdefault("defaults", ApprovalOperator.REJECT)
        kwargs.setdefault("response_timeout", RESPONSE_TIMEOUT)
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id

    def execute(self, context: Any) -> Any:
        params = context["params"]
        if params["dry_run"]:
            raise AirflowSkipException("dry run: nothing to approve, the plan was not executed")
        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        total = planned["plan"]["total_lost"]
        self.subject = f"Recover {planned['pipeline']}: declare {total} record(s) lost?"
        self.body = plan_markdown(planned)
        if params.get("pre_approved"):
            self.log.info(
                "pre-approved by the trigger (param pre_approved=true); nobody was asked:\n%s", self.body
            )
            return {"chosen_options": [self.APPROVE], "pre_approved": True, "total_lost": total}
        self.log.info("waiting for a person to approve or reject:\n%s", self.body)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Reject skips this task, and with it every task after it (their trigger rule is all_success).

        ``ApprovalOperator`` would succeed and skip only the downstream tasks (``SkipMixin.skip``);
        skipping this task too shows a rejected plan as skipped at a glance. (The resumed task that
        sometimes ended failed was not caused by either way of skipping: see the module's doc.)
        """
        answered = HITLOperator.execute_complete(self, context=context, event=event)
        chosen = answered["chosen_options"][0]
        self.hitl_summary_extra["approved"] = chosen == self.APPROVE
        if chosen != self.APPROVE:
            raise AirflowSkipException(
                f"{chosen} by {answered['responded_by_user']}: the recovery was not executed, nothing changed"
            )
        self.log.info("Approved by %s: the recovery runs", answered["responded_by_user"])
        return answered
