"""relay.polling.poll: every wait of Relay's, so its edges are what a user sees when a wait ends."""

from __future__ import annotations

import http.server
import itertools
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from relay.errors import OperationError
from relay.polling import GET_TRIES, get_with_retry, poll


def test_returns_the_first_result_that_is_not_none() -> None:
    calls = itertools.count(1)
    assert poll(lambda: "done" if next(calls) >= 3 else None, 5.0, 0.01) == "done"
    assert next(calls) == 4  # checked three times, no more


def test_a_timeout_returns_none_or_raises_what_the_caller_names() -> None:
    checked = []
    assert poll(lambda: checked.append(1), 0.05, 0.01) is None
    assert len(checked) >= 2  # checked again until the deadline, then gave up
    with pytest.raises(OperationError, match="never came"):
        poll(lambda: None, 0.02, 0.01, on_timeout=lambda: OperationError("never came"))


def test_a_zero_timeout_checks_once() -> None:
    checked = []
    assert poll(lambda: checked.append(1), 0.0, 0.01) is None
    assert checked == [1]


def test_transient_errors_are_checked_again_then_raised() -> None:
    calls = itertools.count(1)

    def flaky() -> str:
        if next(calls) < 3:
            raise ConnectionError("broker restarting")
        return "answered"

    assert poll(flaky, 5.0, 0.01, transient=(ConnectionError,)) == "answered"

    def down() -> None:
        raise ConnectionError("still down")

    with pytest.raises(ConnectionError, match="still down"):
        poll(down, 0.03, 0.01, transient=(ConnectionError,))
    with pytest.raises(OperationError, match="gave up") as caught:
        poll(down, 0.03, 0.01, transient=(ConnectionError,), on_timeout=lambda: OperationError("gave up"))
    assert isinstance(caught.value.__cause__, ConnectionError)  # the last error is kept as the cause


def test_any_other_error_ends_the_wait_at_once() -> None:
    calls = itertools.count(1)

    def broken() -> None:
        next(calls)
        raise ValueError("driver failed")

    with pytest.raises(ValueError, match="driver failed"):
        poll(broken, 5.0, 0.01, transient=(ConnectionError,))
    assert next(calls) == 2  # one check only


def test_long_waits_report_progress() -> None:
    seen: list[float] = []
    poll(lambda: None, 0.1, 0.01, note=seen.append, note_every_s=0.03)
    assert seen and all(b > a for a, b in itertools.pairwise(seen))
    assert 1 <= len(seen) <= 4


class _Flaky(requests.Session):
    """A real session whose first ``refusals`` GETs meet a refused connection (a restarting server)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals, self.calls = refusals, 0

    def get(self, url: str | bytes, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.calls += 1
        if self.calls <= self.refusals:
            raise requests.ConnectionError("connection refused")
        return super().get(url, **kwargs)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_get_is_asked_again_after_a_refused_connection(server: str) -> None:
    session = _Flaky(refusals=GET_TRIES - 1)
    assert get_with_retry(session, server, timeout=5).status_code == 200
    assert session.calls == GET_TRIES


def test_a_get_refused_every_time_raises_the_last_refusal() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = _Flaky(refusals=0)
    with pytest.raises(requests.ConnectionError):
        get_with_retry(session, f"http://127.0.0.1:{port}/", timeout=5)
    assert session.calls == GET_TRIES
