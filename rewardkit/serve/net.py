"""Connection-level bounds of ``rewardkit serve`` on uvicorn (see docs/serve.md, "Exposing the server").

uvicorn bounds the keep-alive idle time (``timeout_keep_alive``), the unfinished request head it buffers
(``h11_max_incomplete_event_size``) and the listen backlog, and :func:`uvicorn_config` sets all three. Its
``limit_concurrency`` answers 503 only once a request's headers are in, and counts at most one task per
connection, so the connection cap below makes it redundant (it is left unset). uvicorn has no limit on the
time a client takes to send its headers and no cap on open connections, so clients that send one header
byte every few seconds hold a socket each, forever, until the process runs out of file descriptors.
:func:`protocol_class` adds both on top of uvicorn's h11 protocol:

- a connection beyond ``max_connections`` is answered ``503`` and closed at once (the cap and the backlog
  are kept below the file-descriptor limit by :func:`connection_cap`, so ``accept`` never fails with EMFILE);
- a request whose line and headers are not complete ``header_timeout`` seconds after the connection opened
  (or after the previous response) is answered ``408`` and its connection closed; so is a connection still
  sending the body of a request answered without reading it (e.g. a 401);
- every connection has Nagle's algorithm off (:func:`set_nodelay`), whatever socket the server was given;
- a connection whose answers stay unread for ``send_timeout`` seconds (its write buffer full: a client that
  pipelines requests and never reads) is dropped; uvicorn would wait for it forever;
- with ``connections`` (a :class:`rewardkit.serve.batch.Connections`), each connection is registered there for
  as long as it is open, and its requests carry it in the ASGI scope's ``state`` (dynamic batching reads it).
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("rewardkit.server")

#: file descriptors kept free for everything but client sockets (model files, threads' pipes, logs, ...)
FD_RESERVE = 32


def _raw_response(status: int, reason: str, message: str, retry_after: int | None = None) -> bytes:
    body = ('{"error": "%s"}' % message).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def fd_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process (None where the platform has none)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_fds() -> int:
    """File descriptors open in this process now (an estimate of 64 where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def connection_cap(max_connections: int, backlog: int) -> tuple[int, int]:
    """``(max_connections, backlog)``, lowered so that they fit under the file-descriptor limit together with
    the descriptors already open and :data:`FD_RESERVE`. Both count: asyncio accepts up to ``backlog``
    connections in one go before any of them reaches the protocol (where the cap refuses the extra ones)."""
    limit = fd_limit()
    if limit is None:
        return max_connections, backlog
    room = limit - open_fds() - FD_RESERVE
    if room < 2:
        raise RuntimeError(f"the file-descriptor limit ({limit}) leaves no room for client connections; "
                           "raise it (ulimit -n)")
    if max_connections + backlog <= room:
        return max_connections, backlog
    new_backlog = min(backlog, max(1, room // 4))
    new_cap = min(max_connections, room - new_backlog)
    log.warning("max_connections %d -> %d and backlog %d -> %d, to stay under the file-descriptor limit of %d",
                max_connections, new_cap, backlog, new_backlog, limit)
    return new_cap, new_backlog


def set_nodelay(transport: Any) -> None:
    """Turn Nagle's algorithm off on a TCP connection. asyncio does it only for sockets whose ``proto`` is
    ``IPPROTO_TCP``; a socket made with ``socket.socket(AF_INET, SOCK_STREAM)`` (proto 0: what uvicorn gets
    through ``sockets=`` / ``--fd``) is skipped, and then an answer's body, written after its head, waits for
    the client's delayed ACK of the head: about 40 ms added to every request on a keep-alive connection."""
    import socket

    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket: no Nagle
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # the connection is already gone
        pass


def protocol_class(max_connections: int, header_timeout: float, send_timeout: float | None = None,
                   connections: Any = None) -> type:
    """uvicorn's h11 protocol with a connection cap, a header-read timeout, a timeout on unread answers
    (``send_timeout``, default ``header_timeout``) and, with ``connections``, connection tracking (see the
    module doc)."""
    send_timeout = header_timeout if send_timeout is None else send_timeout
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    busy = _raw_response(503, "Service Unavailable", "the server is at its connection limit", retry_after=1)
    slow = _raw_response(408, "Request Timeout", "the request headers took longer than "
                                                 f"{header_timeout:g} s")

    class BoundedH11Protocol(H11Protocol):
        _header_timer: Any = None
        _write_timer: Any = None
        _tracked: Any = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            set_nodelay(transport)
            if len(self.connections) > max_connections:
                transport.write(busy)
                transport.close()
                return
            if connections is not None:
                from .batch import CONNECTION_KEY

                # every request's scope["state"] is a copy of this dict: its own, with this connection in it
                self._tracked = connections.opened()
                self.app_state = {**self.app_state, CONNECTION_KEY: self._tracked}
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._tracked is not None:
                self._tracked.lost()
            self._cancel_header_timer()
            self._cancel_write_timer()
            super().connection_lost(exc)
            self.flow.resume_writing()  # a response waiting for the buffer to drain ends (its cycle is gone)

        def pause_writing(self) -> None:
            super().pause_writing()
            self._cancel_write_timer()
            self._write_timer = self.loop.call_later(send_timeout, self._write_timed_out)

        def resume_writing(self) -> None:
            self._cancel_write_timer()
            super().resume_writing()

        def _cancel_write_timer(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_timed_out(self) -> None:
            self._write_timer = None
            if not self.transport.is_closing() or self.transport.get_write_buffer_size():
                self.transport.abort()  # its unread answers are dropped with it (close() would wait for them)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()  # the next request on this keep-alive connection gets the same bound

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._header_timed_out)

        def _header_timed_out(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served (its body and its whole time have their own timeouts)
            # No request in progress: the client has not sent a complete head in time, or it is still sending
            # the body of a request already answered without reading it (a 401): either way, close.
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                self.transport.write(slow)  # part of a request head arrived: say why it is dropped
            self.transport.close()

    return BoundedH11Protocol


def uvicorn_config(app: Any, cfg: Any, connections: Any = None, **kw: Any) -> Any:
    """A ``uvicorn.Config`` for ``app`` with ``cfg``'s (a ``ServerConfig``) connection bounds, tracking its
    connections in ``connections`` when given (see :func:`protocol_class`)."""
    from .._imports import require

    uvicorn = require("uvicorn", "serve")
    cap, backlog = connection_cap(cfg.max_connections, cfg.backlog)
    return uvicorn.Config(app, http=protocol_class(cap, cfg.header_timeout, cfg.body_timeout, connections),
                          timeout_keep_alive=cfg.keep_alive,
                          h11_max_incomplete_event_size=cfg.max_header_bytes, backlog=backlog,
                          log_level=kw.pop("log_level", "warning"), lifespan="on", **kw)
