"""The reward server's limits and batching settings (:class:`ServerConfig`; docs/serve.md, "Exposing the server").
Re-exported by :mod:`rewardkit.serve.server` (and :mod:`rewardkit.server`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ServerConfig"]


@dataclass
class ServerConfig:
    """Limits and batching of a reward server (docs/serve.md, "Exposing the server").

    Attributes:
        max_batch: most images scored in one model call (merged across requests).
        max_wait_ms: the longest a non-full batch waits for more requests (0: take only what is queued); it
            closes sooner once every client the server knows of is in (docs/serve.md, "Dynamic batching").
        max_body_bytes: largest request body accepted (413 above); a JSON body is also held to ``max_json_bytes``
            (the smaller of the two applies).
        max_json_bytes: largest JSON a request carries: a JSON body, or the header of a binary body (413 above,
            from ``Content-Length`` before the body is read when it has one). Far below ``max_body_bytes``: the
            JSON parser holds the interpreter for the whole parse, so this bounds how long one request can stall
            the server (docs/serve.md, "Exposing the server").
        max_json_items: most ``,`` ``[`` ``{`` characters in that JSON (inside strings too: an upper bound on
            the values it holds), counted before it is parsed (413 above): bounds the parse's time and memory.
        max_images: most images in one request (each of ``images_a`` / ``images_b`` for /compare), and most
            source images in one request, all samples together.
        timeout: seconds a request may take from arrival to response (504 after; the model call it joined
            still completes for the other requests of its batch).
        token: bearer token required on every endpoint but /health (None: no authentication).
        header_timeout: seconds a client has to send a request's line and headers, from the connection (or
            the previous response); then ``408`` and the connection is closed.
        body_timeout: seconds a client has to send a request's body once its headers are in (408 after); also
            the longest a connection's answers may stay unread (its write buffer full), then it is dropped.
        keep_alive: seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``).
        max_connections: most open client connections; one more is answered ``503`` and closed. Lowered at
            startup to stay under the process's file-descriptor limit.
        max_in_flight: most /score and /compare requests being read, queued or scored at once (503 with
            ``Retry-After`` above).
        max_header_bytes: most bytes of an unfinished request head held while waiting for its end (uvicorn's
            ``h11_max_incomplete_event_size``; 400 above).
        backlog: the listen backlog (connections the kernel holds before they are accepted).
        max_request_pixels: most decoded pixels in one request (all images and sources, read from their
            headers before anything is decoded; 413 above).
        max_batch_pixels: most decoded pixels in one model call (requests merge only up to it).
    """

    max_batch: int = 32
    max_wait_ms: float = 5.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_json_bytes: int = 16 * 1024 * 1024
    max_json_items: int = 100_000
    max_images: int = 256
    timeout: float = 120.0
    token: str | None = None
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keep_alive: float = 5.0
    max_connections: int = 512
    max_in_flight: int = 64
    max_header_bytes: int = 16 * 1024
    backlog: int = 256
    max_request_pixels: int = 64 * 1024 * 1024
    max_batch_pixels: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_body_bytes", "max_json_bytes", "max_json_items", "max_images",
                     "max_connections", "max_in_flight",
                     "max_header_bytes", "backlog", "max_request_pixels", "max_batch_pixels"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("max_wait_ms", "timeout", "header_timeout", "body_timeout", "keep_alive"):
            v = getattr(self, name)
            positive = name != "max_wait_ms"
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 \
                    or (positive and v == 0):
                raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise ValueError("token must be a non-empty string or None")
