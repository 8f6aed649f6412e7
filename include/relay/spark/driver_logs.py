"""Read a cluster-mode driver's logs from the standalone worker that runs it.

Why: a supervised driver that dies before it reaches the ledger (an ImportError, a bad interpreter)
leaves no trace in Relay. The master keeps showing it RUNNING while the worker relaunches it with
back-off; only the worker's files say how often it was launched and why it died.

What a Spark 4.2.0 worker serves (observed on a worker started from the pip wheel):

- ``GET <worker web UI>/log/?driverId=D&logType=stderr|stdout[&offset=N][&byteLength=N]`` answers
  ``text/plain``: one header line ``==== Bytes S-E of T of <work dir>/D/<type> ====`` then the bytes
  ``[S, E)`` of a file of ``T`` bytes. Without ``offset`` it is the last ``byteLength`` bytes
  (default 100 KiB). ``/log`` answers 301 to ``/log/``. An unknown driver or log type still answers
  200, with ``Bytes 0-0 of 0`` and a line starting ``Error:``.
- ``stderr`` is the driver JVM's log; the worker's DriverRunner appends ``Launch Command: ...`` and a
  line of ``=`` before every (re)launch, so counting those lines counts launches.
- ``stdout`` holds the Python process's output: PythonRunner merges Python's stdout and stderr into
  the JVM's stdout, so a Python driver's traceback is there, not in ``stderr``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import requests

from relay.errors import SparkError
from relay.polling import get_with_retry

HEADER_RE = re.compile(r"==== Bytes (\d+)-(\d+) of (\d+) of (.*) ====")
LAUNCH_MARKER = "Launch Command: "
CHUNK_BYTES = 1 << 20
TRACEBACK = "Traceback (most recent call last):"
# Lines that never say why a driver died: Spark's start-up chatter, launch headers, caret markers.
NOISE_RE = re.compile(
    r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|DEBUG|TRACE) "
    r"|Launch Command: "
    r"|=+$"
    r"|WARNING: Using incubator modules"
    r"|Using Spark's default log4j profile"
    r"|\s*[\^~]+\s*$)"
)


class DriverLogUnavailable(SparkError):
    """The worker has no such log (the driver has not started there yet, or its folder was cleaned)."""


@dataclass(frozen=True)
class LogChunk:
    """One answer of the worker's ``/log/`` endpoint: bytes ``[start, end)`` of a ``total``-byte file."""

    start: int
    end: int
    total: int
    path: str
    text: str


def parse_log_response(body: str) -> LogChunk:
    """Split the byte-range header from the text; SparkError on an answer of another shape."""
    header, _, text = body.partition("\n")
    match = HEADER_RE.fullmatch(header.strip())
    if match is None:
        raise SparkError(f"unexpected answer from a worker's log endpoint: {body[:200]!r}")
    start, end, total = (int(match.group(i)) for i in (1, 2, 3))
    path = match.group(4)
    if total == 0 and text.startswith("Error"):
        raise DriverLogUnavailable(f"the worker has no log {path}: {text.strip()}")
    return LogChunk(start, end, total, path, text)


def count_launches(text: str) -> int:
    """Launch headers the worker wrote into a driver's stderr (one per launch)."""
    return sum(1 for line in text.split("\n") if line.startswith(LAUNCH_MARKER))


def error_tail(text: str, max_lines: int = 20, cut_first_line: bool = False) -> str:
    """The lines that say why a driver died: its last Python traceback, else its last meaningful lines.

    ``cut_first_line`` drops a first line that a tail read started in the middle of.
    """
    lines = text.split("\n")
    if cut_first_line:
        lines = lines[1:]
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
    if starts:
        lines = lines[starts[-1] :]
    meaningful = [line.rstrip() for line in lines if line.strip() and not NOISE_RE.match(line)]
    return "\n".join(meaningful[-max_lines:])


def explain_failure(stdout_tail: str, stderr_tail: str, max_lines: int = 20) -> str:
    """The driver's own error: Python's output first (a traceback), the JVM's log when Python said nothing."""
    return error_tail(stdout_tail, max_lines) or error_tail(stderr_tail, max_lines)


class WorkerLogs:
    """The driver logs of one worker, read through its web UI (plain HTTP, like the master's /json/)."""

    def __init__(self, session: requests.Session, webui_url: str, timeout_s: float = 10) -> None:
        self.session = session
        self.webui_url = webui_url.rstrip("/")
        self.timeout_s = timeout_s

    def read(self, driver_id: str, log_type: str, offset: int | None, byte_length: int) -> LogChunk:
        """``byte_length`` bytes from ``offset``, or the last ``byte_length`` bytes when offset is None."""
        params = {"driverId": driver_id, "logType": log_type, "byteLength": str(byte_length)}
        if offset is not None:
            params["offset"] = str(offset)
        url = f"{self.webui_url}/log/"
        what = f"Spark worker at {url}: {log_type} of {driver_id}"
        try:
            response = get_with_retry(self.session, url, params=params, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SparkError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise SparkError(f"{what}: HTTP {response.status_code}: {response.text[:200]!r}")
        return parse_log_response(response.text)

    def tail(self, driver_id: str, log_type: str, max_bytes: int) -> tuple[str, bool]:
        """The last ``max_bytes`` of a log and whether it starts in the middle of a line."""
        chunk = self.read(driver_id, log_type, None, max_bytes)
        return chunk.text, chunk.start > 0


class LaunchCounter:
    """Counts a driver's launches from its stderr, reading only the bytes added since the last call.

    Why incremental: the wait for a first commit polls every few seconds, and a healthy driver's
    stderr grows with every batch; rereading it whole would cost more the longer the start takes.
    """

    def __init__(self, driver_id: str) -> None:
        self.driver_id = driver_id
        self.offset = 0
        self.launches = 0
        self._carry = ""  # start of a line the last read ended in (enough to recognise a header)

    def update(self, logs: WorkerLogs) -> int:
        """Read what is new and return the launches seen so far."""
        more = True
        while more:  # chunk by chunk to the end of what the worker has written so far
            chunk = logs.read(self.driver_id, "stderr", self.offset, CHUNK_BYTES)
            if chunk.total < self.offset:  # the file was replaced: count again from its start
                self.offset, self.launches, self._carry = 0, 0, ""
                continue
            *complete, partial = (self._carry + chunk.text).split("\n")
            self.launches += sum(1 for line in complete if line.startswith(LAUNCH_MARKER))
            self._carry = partial[: len(LAUNCH_MARKER)]
            self.offset = chunk.end
            more = chunk.start < chunk.end < chunk.total
        return self.launches
