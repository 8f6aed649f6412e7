"""``relay status`` and ``relay offsets``: what the ledger knows, next to what Kafka reports."""

from __future__ import annotations

from relay.config import RelayConfig
from relay.kafka_offsets import KafkaOffsets
from relay.ledger.store import Ledger


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
        "message_count": ledger.message_count(config.pipeline),
        "dead_letters": ledger.dead_letter_count(config.pipeline),
        "gaps": [g.to_json() for g in ledger.gaps(config.pipeline)],
        "instances": instances,
        "upgrades": [r["body"] for r in ledger.reports(config.pipeline, "upgrade", 5)],
    }
    if with_kafka:
        out["offsets"] = offsets_view(config, ledger)
    return out
