"""The pipeline section's faster hand-written baselines b2, b3, b4 (b1 is pipeline_backlog's).

Each does b1's work with b1's semantics: read the topic, ``json.loads`` every value, keep each id's
highest offset of the poll (``newest_rows``), and replace a row only with a record from a later
offset (``WHERE t._relay_offset < EXCLUDED._relay_offset``), one transaction per poll of up to
10,000 records, into a table of the example's shape (no fence, no ledger, no exactly-once):

- b2: b1 with the poll's rows ``COPY``'d into a temporary table and applied by one
  ``INSERT .. SELECT .. ON CONFLICT`` per poll (instead of ``execute_values`` pages);
- b3: b2 in two OS processes (spawned), the topic's partitions split between them; the figure is
  all records over the wall time from releasing both (each already connected) to both done;
- b4: b3 reading with confluent-kafka (librdkafka) instead of kafka-python.

b2 also runs as a continuous consumer (from the topic's end, a small poll timeout) for the latency
section's baseline. confluent-kafka is a dev/test dependency: imported here only, in the child.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import queue
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from relay.errors import OperationError
from relay.polling import poll

from .pipeline_backlog import TABLE, newest_rows

POLL_RECORDS = 10_000  # b1's max_records per poll
COLUMNS = ("id", "name", "score", "_relay_topic", "_relay_partition", "_relay_offset")
STAGE = "json_upsert_stage"
STAGE_DDL = f"CREATE TEMP TABLE {STAGE} (LIKE {TABLE}) ON COMMIT DELETE ROWS"
MERGE = (
    f"INSERT INTO {TABLE} AS t ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM {STAGE} "
    "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, score = EXCLUDED.score, "
    "_relay_topic = EXCLUDED._relay_topic, _relay_partition = EXCLUDED._relay_partition, "
    "_relay_offset = EXCLUDED._relay_offset WHERE t._relay_offset < EXCLUDED._relay_offset"
)
CLIENTS = ("kafka-python", "confluent-kafka")


# ------------------------------------------------------------------------------------------ pure
def split_partitions(partitions: Sequence[int], workers: int) -> list[list[int]]:
    """Partitions dealt round-robin to ``workers`` (none gets an empty share: fewer workers then)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    ordered = sorted(partitions)
    shares = [ordered[i::workers] for i in range(workers)]
    return [s for s in shares if s]


def _copy_field(value: Any) -> str:
    if value is None:
        return r"\N"
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_text(rows: Sequence[Sequence[Any]]) -> str:
    """Rows in COPY's text format: tab-separated, ``\\N`` for NULL, backslash escapes."""
    return "".join("\t".join(_copy_field(v) for v in row) + "\n" for row in rows)


# ------------------------------------------------------------------------------ the sink (b2..b4)
class CopyUpsert:
    """One connection; per poll: COPY into a temporary table, one INSERT .. SELECT .. ON CONFLICT."""

    def __init__(self, url: str) -> None:
        import psycopg2

        self.conn = psycopg2.connect(url)
        with self.conn.cursor() as cur:
            cur.execute(STAGE_DDL)
        self.conn.commit()

    def apply(self, polled: list[tuple[int, int, bytes | None]]) -> int:
        rows = newest_rows(polled)
        if not rows:
            return 0
        with self.conn.cursor() as cur:
            cur.copy_expert(f"COPY {STAGE} ({', '.join(COLUMNS)}) FROM STDIN", io.StringIO(copy_text(rows)))
            cur.execute(MERGE)
        self.conn.commit()  # ON COMMIT DELETE ROWS empties the stage
        return len(rows)

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------------------------- the readers
class KafkaPythonReader:
    """kafka-python, ``partitions`` assigned: from the beginning to the end at open (a backlog), or
    from the end at open until stopped (continuous, ``poll_ms`` small)."""

    def __init__(self, bootstrap: str, topic: str, partitions: Sequence[int], continuous: bool = False):
        from kafka import KafkaConsumer, TopicPartition

        self.continuous = continuous
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        self.tps = [TopicPartition(topic, p) for p in partitions]
        self.consumer.assign(self.tps)
        self.ends = self.consumer.end_offsets(self.tps)
        for tp in self.tps:
            if continuous:
                self.consumer.seek(tp, self.ends[tp])
            else:
                self.consumer.seek_to_beginning(tp)
            self.consumer.position(tp)  # resolved now, not on the first poll

    def polls(self, stop: Any = None, poll_ms: int = 1000) -> Iterator[list[tuple[int, int, bytes | None]]]:
        def more() -> bool:
            if self.continuous:
                return not stop.is_set()
            return any(self.consumer.position(tp) < self.ends[tp] for tp in self.tps)

        while more():
            polled = self.consumer.poll(timeout_ms=poll_ms, max_records=POLL_RECORDS)
            yield [(tp.partition, r.offset, r.value) for tp, recs in polled.items() for r in recs]

    def close(self) -> None:
        self.consumer.close()


class ConfluentReader:
    """confluent-kafka (librdkafka), ``partitions`` assigned, from the beginning to the end at open."""

    def __init__(self, bootstrap: str, topic: str, partitions: Sequence[int]):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"relay-bench-b4-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.ends: dict[int, int] = {}
        self.next: dict[int, int] = {}
        for p in partitions:
            low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            self.ends[p], self.next[p] = int(high), int(low)
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])

    def polls(self, stop: Any = None, poll_ms: int = 1000) -> Iterator[list[tuple[int, int, bytes | None]]]:
        from confluent_kafka import KafkaError

        while (left := sum(max(0, end - self.next[p]) for p, end in self.ends.items())) > 0:
            out = []
            # consume() waits until it has num_messages or the timeout: never ask past the end
            for msg in self.consumer.consume(num_messages=min(POLL_RECORDS, left), timeout=poll_ms / 1000):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"b4 consume: {msg.error()}")
                self.next[msg.partition()] = msg.offset() + 1
                out.append((msg.partition(), msg.offset(), msg.value()))
            yield out

    def close(self) -> None:
        self.consumer.close()


def reader(client: str, bootstrap: str, topic: str, partitions: Sequence[int], continuous: bool = False):  # noqa: ANN201
    if client == "confluent-kafka":
        if continuous:
            raise ValueError("the continuous baseline reads with kafka-python (b2)")
        return ConfluentReader(bootstrap, topic, partitions)
    return KafkaPythonReader(bootstrap, topic, partitions, continuous)


def drain(src: Any, sink: CopyUpsert, stop: Any = None, poll_ms: int = 1000) -> tuple[int, int]:
    """Every poll of ``src`` applied to ``sink``: (records read, rows upserted)."""
    rows = written = 0
    for polled in src.polls(stop, poll_ms):
        rows += len(polled)
        written += sink.apply(polled)
    return rows, written


def b2_consumer(bootstrap: str, topic: str, url: str, partitions: Sequence[int]) -> dict[str, Any]:
    """b2 in this process: the backlog from beginning to end (timed like b1: from connecting)."""
    sink = CopyUpsert(url)
    t0 = time.monotonic()
    src = reader("kafka-python", bootstrap, topic, partitions)
    try:
        rows, written = drain(src, sink)
        seconds = time.monotonic() - t0
    finally:
        src.close()
        sink.close()
    return {
        "rows": rows,
        "upserted": written,
        "seconds": seconds,
        "msg_s": rows / seconds if seconds else None,
    }


# ------------------------------------------------------------------------- the spawned processes
def _child(spec: dict[str, Any], ready: Any, go: Any, stop: Any, out: Any) -> None:
    """One baseline process: connect, say ready, wait for go, drain, report (rows, end time)."""
    src = sink = None
    try:
        sink = CopyUpsert(spec["url"])
        src = reader(spec["client"], spec["bootstrap"], spec["topic"], spec["partitions"], spec["continuous"])
        ready.put(("ready", spec["partitions"]))
        if not go.wait(spec["timeout_s"]):
            raise TimeoutError("never released")
        rows, written = drain(src, sink, stop, spec["poll_ms"])
        out.put(
            (
                "done",
                {
                    "partitions": spec["partitions"],
                    "rows": rows,
                    "upserted": written,
                    "end": time.monotonic(),
                },
            )
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        with contextlib.suppress(Exception):
            ready.put(("error", f"{type(exc).__name__}: {exc}"))
            out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for part in (src, sink):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()


class Processes:
    """Baseline children (spawned), each on its share of partitions; stopped by their own PIDs."""

    def __init__(
        self,
        client: str,
        bootstrap: str,
        topic: str,
        url: str,
        shares: list[list[int]],
        continuous: bool = False,
        poll_ms: int = 1000,
        timeout_s: float = 600.0,
        target: Callable[..., None] | None = None,
    ) -> None:
        """``target(spec, ready, go, stop, out)``: what each child runs (None: the upsert baseline)."""
        ctx = multiprocessing.get_context("spawn")
        self.timeout_s = timeout_s
        self.ready, self.out, self.go, self.stop_event = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
        self.procs = [
            ctx.Process(
                target=target or _child,
                name=f"bench-{client}-{i}",
                args=(
                    {
                        "client": client,
                        "bootstrap": bootstrap,
                        "topic": topic,
                        "url": url,
                        "partitions": share,
                        "continuous": continuous,
                        "poll_ms": poll_ms,
                        "timeout_s": timeout_s,
                    },
                    self.ready,
                    self.go,
                    self.stop_event,
                    self.out,
                ),
            )
            for i, share in enumerate(shares)
        ]
        self.started_at: float | None = None

    def _get(self, q: Any, what: str) -> Any:

        def message() -> tuple[str, Any]:
            dead = [p.name for p in self.procs if p.exitcode not in (None, 0)]
            if dead:
                raise OperationError(f"baseline processes: no {what}: {', '.join(dead)} died")
            return q.get(timeout=1.0)  # queue.Empty: look again

        got = poll(
            message,
            self.timeout_s,
            0.0,
            transient=(queue.Empty,),
            on_timeout=lambda: OperationError(
                f"baseline processes: no {what}: nothing after {self.timeout_s:.0f}s"
            ),
        )
        assert got is not None
        kind, body = got
        if kind == "error":
            raise OperationError(f"baseline process failed: {body}")
        return body

    def start(self) -> None:
        """Start every child, wait until each is connected, release them all at once."""
        for p in self.procs:
            p.start()
        for _ in self.procs:
            self._get(self.ready, "ready")
        self.started_at = time.monotonic()
        self.go.set()

    def results(self) -> list[dict[str, Any]]:
        done = [self._get(self.out, "result") for _ in self.procs]
        for p in self.procs:
            p.join(timeout=30)
        return done

    def close(self) -> None:
        """Stop what still runs, by its PID (Process.terminate, then kill)."""
        self.stop_event.set()
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)


def parallel_consumer(
    client: str, bootstrap: str, topic: str, url: str, partitions: Sequence[int], processes: int = 2
) -> dict[str, Any]:
    """b3 (kafka-python) / b4 (confluent-kafka): the backlog split over ``processes`` processes."""
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {CLIENTS}, got {client!r}")
    shares = split_partitions(partitions, processes)
    group = Processes(client, bootstrap, topic, url, shares)
    try:
        group.start()
        done = group.results()
    finally:
        group.close()
    seconds = max(d["end"] for d in done) - (group.started_at or 0.0)
    rows = sum(d["rows"] for d in done)
    return {
        "client": client,
        "processes": len(shares),
        "shares": [d["partitions"] for d in done],
        "rows": rows,
        "upserted": sum(d["upserted"] for d in done),
        "per_process_rows": [d["rows"] for d in done],
        "per_process_s": [d["end"] - (group.started_at or 0.0) for d in done],
        "seconds": seconds,
        "msg_s": rows / seconds if seconds > 0 else None,
    }
