"""A deadline for a whole HTTP request on httpx's sync client (used by
:class:`~rewardkit.judges.openai_backend.OpenAIJudge`): every socket read, write and connect gets only the time
left before the request's deadline, so a server that drips one byte at a time cannot hold a call past its
``timeout``.
"""

from __future__ import annotations

import threading
import time
from typing import Any


# ---------------------------------------------------------------------------------------- request deadline
# The deadline of the request the current thread is making (httpx's sync client does its I/O in the calling
# thread). Every socket operation of the connection pool gets min(its own timeout, time left).
_local = threading.local()


def _time_left(timeout: float | None, exc_cls: type[Exception]) -> float | None:
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc_cls("the request's total timeout elapsed")
    return left if timeout is None else min(timeout, left)


def _deadline_transport(httpx: Any, limits: Any) -> Any:
    """An ``httpx.HTTPTransport`` whose connection pool bounds every read / write / connect by the deadline."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner):
            self._inner = inner

        def read(self, max_bytes, timeout=None):
            return self._inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

        def write(self, buffer, timeout=None):
            return self._inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

        def close(self):
            self._inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            return Stream(self._inner.start_tls(ssl_context, server_hostname,
                                                _time_left(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info):
            return self._inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self):
            self._inner = httpcore.SyncBackend()

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            return Stream(self._inner.connect_tcp(host, port, _time_left(timeout, httpcore.ConnectTimeout),
                                                  local_address, socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            return Stream(self._inner.connect_unix_socket(path, _time_left(timeout, httpcore.ConnectTimeout),
                                                          socket_options))

        def sleep(self, seconds):
            self._inner.sleep(seconds)

    transport = httpx.HTTPTransport(limits=limits)
    if isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        transport._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=Backend())
    # (an httpx without ``_pool`` keeps per-read timeouts; the body loop below still checks the deadline)
    return transport
