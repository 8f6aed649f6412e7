"""A topic re-created under the same name: the marks tell, the driver refuses, health says CRITICAL.

On the stack's real broker. The first test drives ``relay.kafka.identity`` directly over a delete and
re-create (with more records than before, then with fewer); the second deploys the counter, lets it
apply, re-creates its topic while it is stopped, and deploys again: the driver must refuse to start
(nothing read, nothing counted as applied), health must name the change, and a recovery from the new
topic's first offsets must run it again.
"""

from __future__ import annotations

import time
import uuid

import pytest
from relay.audit import audit
from relay.config import RelayConfig
from relay.errors import OperationError
from relay.health import Level, run_health
from relay.kafka.identity import Marker, applied_ends, changes, marks_of, take_marks
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.recover import recover
from relay.operations.stop import stop

from tests.conftest import wait_for
from tests.integration.helpers import caught_up

pytestmark = pytest.mark.integration


@pytest.fixture()
def cfg(stack: RelayConfig) -> RelayConfig:
    name = f"t{uuid.uuid4().hex[:8]}"
    return stack.with_(pipeline=name, topic=name, ledger_url=f"sqlite:///{stack.data_dir / (name + '.db')}")


def recreate(cfg: RelayConfig, records: int) -> None:
    """Delete the topic, wait until the broker forgot it, create it again and fill it."""
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.admin().delete_topics([cfg.topic])
        wait_for("the topic deleted", lambda: cfg.topic not in kafka.admin().list_topics(), timeout=30)
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    produce(cfg.kafka_bootstrap, cfg.topic, records, None, partitions=cfg.partitions)


def test_marks_see_a_recreated_topic_with_more_and_with_fewer_records(cfg: RelayConfig) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    with ledger.tx() as conn:  # the pipeline applied [0, 50) of every partition
        inst = ledger.create_instance(conn, cfg.pipeline, "v1", Color.BLUE, "/nonexistent", "relay-x")
        for p in range(cfg.partitions):
            lease = ledger.open_lease(conn, inst, cfg.topic, p, 0)
            ledger.advance_cursors(conn, [(lease, 50)])
    ends = applied_ends(ledger, cfg.pipeline, cfg.topic)
    assert ends == dict.fromkeys(range(cfg.partitions), 50)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        marks = take_marks(ledger, kafka, cfg.pipeline, cfg.topic, ends)
        assert {p: m.offset for p, m in marks.items()} == dict.fromkeys(range(cfg.partitions), 49)
        assert marks_of(ledger, cfg.pipeline, cfg.topic) == marks
        assert changes(ledger, kafka, cfg.pipeline, cfg.topic) == []  # the same topic: nothing changed

    recreate(cfg, 600)  # more records than before: offset 49 exists again, holding another record
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        found = changes(ledger, kafka, cfg.pipeline, cfg.topic)
    assert len(found) == cfg.partitions and all("holds another record" in f for f in found), found

    recreate(cfg, 30)  # fewer: the log ends below the applied record
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        found = changes(ledger, kafka, cfg.pipeline, cfg.topic)
    assert len(found) == cfg.partitions and all("ends at offset" in f for f in found), found


def test_marker_marks_what_it_saw_one_round_earlier(cfg: RelayConfig) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 90, None, partitions=cfg.partitions)
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, cfg.pipeline, "v1", Color.BLUE, "/nonexistent", "relay-x")
        lease = ledger.open_lease(conn, inst, cfg.topic, 0, 0)
        ledger.advance_cursors(conn, [(lease, 10)])
    marker = Marker(ledger, cfg.kafka_bootstrap, cfg.pipeline, cfg.topic, every_s=0)
    marker.tick()  # reads the ends only
    assert marks_of(ledger, cfg.pipeline, cfg.topic) == {}
    with ledger.tx() as conn:
        ledger.advance_cursors(conn, [(ledger.leases(inst.id, conn)[0], 20)])
    marker.tick()  # marks the ends of the round before (10), not the newest (20)
    assert {p: m.offset for p, m in marks_of(ledger, cfg.pipeline, cfg.topic).items()} == {0: 9}


def test_a_driver_refuses_a_recreated_topic_and_a_recovery_runs_it_again(cfg: RelayConfig) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 90, None, partitions=cfg.partitions)
    deploy(cfg, wait_s=240)
    wait_for("the job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:  # what the running driver does every 30 s
        take_marks(ledger, kafka, cfg.pipeline, cfg.topic, applied_ends(ledger, cfg.pipeline, cfg.topic))
    stop(cfg)
    applied_before = ledger.recent_batches(cfg.pipeline, limit=10_000)

    recreate(cfg, 300)
    with pytest.raises(OperationError, match="is not the one the pipeline read"):
        deploy(cfg, wait_s=240)
    newest = ledger.instances(cfg.pipeline)[-1]
    assert newest.state is InstanceState.FAILED and "relay recover" in (newest.error or "")
    assert ledger.recent_batches(cfg.pipeline, limit=10_000) == applied_before, "a batch was committed"
    report = run_health(cfg, ledger, persist=False)
    identity = report.check("topic_identity")
    assert identity.level is Level.CRITICAL and "holds another record" in identity.message, report.summary()

    # Read the new topic from its first offsets: its records are not the ones applied under those numbers.
    start = dict.fromkeys(range(cfg.partitions), 0)
    done = recover(cfg, strategy="offsets", offsets=start, allow_reprocess=True, dry_run=False)
    assert done["state"] == "EXECUTED", done
    t0 = time.monotonic()
    wait_for("the new topic applied", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    assert time.monotonic() - t0 < 180
    assert marks_of(ledger, cfg.pipeline, cfg.topic) == {} or not changes_now(cfg, ledger)
    stop(cfg)
    report = audit(cfg)  # the new topic's records, each applied once
    assert report.ok and sum(p.applied_once for p in report.partitions) == 300, report


def changes_now(cfg: RelayConfig, ledger: Ledger) -> list[str]:
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        return changes(ledger, kafka, cfg.pipeline, cfg.topic)
