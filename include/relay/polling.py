"""One way to wait for a condition: check it on a fixed period until it holds or a deadline passes.

Every wait of Relay's (a first commit, a drained lease, a stopped driver, a visible topic, a free
worker) is this loop, so no caller keeps its own deadline arithmetic; tenacity holds the policy and
the clock (monotonic: a wall-clock step does not end or stretch a wait). Loops that run for a
process's whole life (a heartbeat, the standby's watch, the triggerer's async poll) are not waits and
say so where they are. A GET that met a refused or reset connection is asked again the same way
(:func:`get_with_retry`): a server restarting for a second is not an answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
)

if TYPE_CHECKING:
    import requests

T = TypeVar("T")


def poll(
    check: Callable[[], T | None],
    timeout_s: float,
    every_s: float = 0.5,
    *,
    on_timeout: Callable[[], BaseException] | None = None,
    transient: tuple[type[BaseException], ...] = (),
    note: Callable[[float], None] | None = None,
    note_every_s: float = 10.0,
) -> T | None:
    """``check()``'s first result that is not None, checking every ``every_s`` for ``timeout_s``.

    On timeout: raise ``on_timeout()`` when given, else return None (the caller decides what a
    timeout means). An exception of a ``transient`` type is checked again until the deadline, then
    raised (as the cause of ``on_timeout()``); any other exception ends the wait at once. ``note``
    gets the seconds waited, about every ``note_every_s`` (progress output on long waits).
    """
    noted = 0.0

    def before_sleep(state: RetryCallState) -> None:
        nonlocal noted
        waited = state.seconds_since_start or 0.0
        if note is not None and waited - noted >= note_every_s:
            noted = waited
            note(waited)

    retrying = Retrying(
        retry=retry_if_result(lambda result: result is None) | retry_if_exception_type(transient),
        stop=stop_after_delay(max(timeout_s, 0.0)),
        wait=wait_fixed(every_s),
        before_sleep=before_sleep,
    )
    try:
        return retrying(check)
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        if on_timeout is not None:
            raise on_timeout() from cause
        if cause is not None:
            raise cause from None
        return None


GET_TRIES = 3
GET_RETRY_WAIT_S = 0.3


def get_with_retry(session: requests.Session | None, url: str, **kwargs: Any) -> requests.Response:
    """``GET url``, asked again (up to GET_TRIES, GET_RETRY_WAIT_S apart) when the connection was
    refused or reset; a timeout is not retried (the caller's timeout already waited), nor is any
    answer. The last ConnectionError propagates."""
    import requests  # here: most users of this module (the drivers' waits) make no HTTP call

    get = session.get if session is not None else requests.get
    retrying = Retrying(
        retry=retry_if_exception_type(requests.ConnectionError),
        stop=stop_after_attempt(GET_TRIES),
        wait=wait_fixed(GET_RETRY_WAIT_S),
        reraise=True,
    )
    return retrying(get, url, **kwargs)
