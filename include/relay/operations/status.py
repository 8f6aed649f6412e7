"""``relay status``, ``relay offsets`` and ``relay pipelines``: what the ledger knows, next to what
Kafka reports."""

from __future__ import annotations

import os
from collections.abc import Mapping

from relay.config import RelayConfig, load_config, pipeline_names
from relay.errors import LedgerNotFoundError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.operations.standby import failovers
from relay.sinks.ledger_messages_tables import message_count


def offsets_view(config: RelayConfig, ledger: Ledger | None = None) -> list[dict]:
    """Per partition: earliest, latest, the pipeline's frontier cursor, lag and retention margin."""
    ledger = ledger or Ledger(config.ledger_url)
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        earliest, latest = kafka.earliest(config.topic), kafka.latest(config.topic)
    cursors: dict[int, int] = {}
    for lease in ledger.pipeline_leases(config.pipeline):
        if lease.topic != config.topic or lease.drained:
            continue
        # the lowest undrained cursor is where the pipeline still has to read from
        cursors[lease.partition] = min(cursors.get(lease.partition, lease.next_offset), lease.next_offset)
    rows = []
    for p in sorted(latest):
        cur = cursors.get(p)
        rows.append(
            {
                "topic": config.topic,
                "partition": p,
                "earliest": earliest.get(p, 0),
                "latest": latest[p],
                "cursor": cur,
                "lag": None if cur is None else max(latest[p] - cur, 0),
                "retention_margin": None if cur is None else cur - earliest.get(p, 0),
                "invalidated": cur is not None and cur < earliest.get(p, 0),
            }
        )
    return rows


def status_view(config: RelayConfig, ledger: Ledger | None = None, with_kafka: bool = True) -> dict:
    ledger = ledger or Ledger(config.ledger_url)
    instances = []
    for inst in ledger.instances(config.pipeline)[-10:]:
        data = inst.to_json()
        data["attempts"] = [a.to_json() for a in ledger.attempts(inst.id)[-5:]]
        data["leases"] = [lease.to_json() for lease in ledger.leases(inst.id)]
        instances.append(data)
    out = {
        "pipeline": config.pipeline,
        "topic": config.topic,
        "ledger": ledger.safe_url,
        "message_count": _counted(ledger, config.pipeline),
        "dead_letters": ledger.dead_letter_count(config.pipeline),
        "gaps": [g.to_json() for g in ledger.gaps(config.pipeline)],
        "instances": instances,
        "upgrades": [r["body"] for r in ledger.reports(config.pipeline, "upgrade", 5)],
        "standby": config.standby,
        "failovers": failovers(ledger, config.pipeline, 5),
    }
    if with_kafka:
        out["offsets"] = offsets_view(config, ledger)
    return out


def _counted(ledger: Ledger, pipeline: str) -> int | None:
    """The counter's running count (None: the pipeline's sink is not the counter's, or it never ran)."""
    with ledger.tx() as conn:
        return message_count(conn, pipeline)


def pipelines_view(env: Mapping[str, str] | None = None) -> dict:
    """``relay pipelines``: every declared pipeline and its state in the ledger (no Kafka, no Spark).

    Why only the ledger: it is where a pipeline's state lives; the list must answer even while a
    broker or the master is down. A ledger that does not exist yet lists the pipelines without state.
    """
    env = os.environ if env is None else env
    names, default = pipeline_names(env)
    configs = [load_config(env, pipeline=name) for name in names]
    ledger = Ledger(configs[0].ledger_url)  # shared by every pipeline: the environment's
    rows, note = [], None
    try:
        for config in configs:
            rows.append(_pipeline_row(config, ledger, env) | {"default": config.pipeline == default})
    except LedgerNotFoundError as exc:
        note = str(exc)
        rows = [
            _pipeline_row(config, None, env) | {"default": config.pipeline == default} for config in configs
        ]
    finally:
        ledger.close()
    file = configs[0].pipelines_file
    return {
        "pipelines_file": None if file is None else str(file),
        "ledger": ledger.safe_url,
        "default": default,
        "pipelines": rows,
        "note": note,
    }


def _pipeline_row(config: RelayConfig, ledger: Ledger | None, env: Mapping[str, str]) -> dict:
    """One pipeline: what it reads and runs, and what the ledger says of it now."""
    row: dict = {
        "pipeline": config.pipeline,
        "topic": config.topic,
        "code": str(config.pipeline_code) if config.pipeline_code else "examples/counter (default)",
        "live_instances": [],
        "version": None,
        "state": None,
        "last_commit_at": None,
        "env_missing": [name for name in config.secret_env if not env.get(name)],  # names, never values
    }
    if ledger is None:
        return row
    instances = ledger.instances(config.pipeline)
    live = [i for i in instances if i.state.live]
    shown = live[-1] if live else (instances[-1] if instances else None)
    batches = ledger.recent_batches(config.pipeline, limit=1)
    row.update(
        live_instances=[i.id for i in live],
        version=shown.version if shown else None,
        state=shown.state.value if shown else "NEVER DEPLOYED",
        last_commit_at=batches[0]["committed_at"] if batches else None,
    )
    return row
