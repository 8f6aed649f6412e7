"""The ``autoscale`` finding of a pipeline with a lag policy: its bounds and the last decision.

OK for a scale done or a hold within the policy; WARN when the policy wanted more executors and
could not have them (at ``max_executors``, or no room on the cluster): the lag will not fall by
itself, a person decides (more workers, a higher bound, a faster transform). Never CRITICAL: the
``lag`` and ``progress`` findings page for the lag itself.
"""

from __future__ import annotations

from typing import Any

from relay.config import AutoscalePolicy
from relay.health.report import Check, Level


def check_autoscale(policy: AutoscalePolicy, last: dict[str, Any] | None) -> Check:
    """``last``: the newest ``autoscale`` report (its body and created_at), None before the first."""
    bounds = f"{policy.min_executors}-{policy.max_executors} executors, up past {policy.lag_seconds:g}s lag"
    data: dict[str, Any] = {"policy": bounds, "last": last}
    if last is None:
        return Check("autoscale", Level.OK, f"lag policy on ({bounds}); no decision yet", data)
    body = last["body"]
    said = f"{body['action']} {body['executors']} -> {body['target']}: {body['why']}"
    if body.get("wanted_more"):
        return Check(
            "autoscale",
            Level.WARN,
            f"behind and not scaled: {body['why']}",
            data,
            "add workers or raise max_executors in the pipelines file's autoscale table",
        )
    return Check("autoscale", Level.OK, f"lag policy on ({bounds}); last: {said}", data)
