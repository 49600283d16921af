"""Reward servers that the serve tests start in a thread (``serve_in_thread``): stopping one without waiting.

``ServerHandle.stop()`` joins the server's thread: uvicorn notices ``should_exit`` on its next 0.1 s tick, then
waits another 0.1 s for its connections, so every stop costs a test about 0.2 s of waiting. Where the stop is
only clean-up (nothing after it depends on the server being gone), :func:`stop_soon` asks the server to exit and
returns; the thread is joined at the end of the module (``tests/serve/conftest.py``). A test that needs the
server gone (its port closed, a replica away) calls ``handle.stop()``.
"""

from __future__ import annotations

_pending: list = []


def stop_soon(handle) -> None:
    """Ask ``handle``'s server to exit now; its thread is joined by :func:`join_stopped`."""
    handle._server.should_exit = True
    _pending.append(handle)


def join_stopped(timeout: float = 10.0) -> None:
    """Join every server :func:`stop_soon` asked to exit."""
    while _pending:
        _pending.pop().stop(timeout)
