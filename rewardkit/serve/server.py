"""``rewardkit serve``: an HTTP reward server on Starlette + uvicorn, with dynamic batching.

Endpoints (JSON in, JSON out; no pickle anywhere; a request body may also be the binary form of
:mod:`rewardkit.serve.binary`, ``Content-Type: application/octet-stream``: the same JSON fields in a small
header, the images' raw bytes after it, read in place; what ``RemoteReward`` sends):

- ``POST /score``    ``{"images": [IMG, ...], "prompt": str | [str], "sources": [[IMG, ...], ...] | null,
  "metadata": [{...}, ...] | null}`` -> the fields of :meth:`RewardOutput.to_dict` (NaN -> null).
- ``POST /compare``  ``{"images_a": [...], "images_b": [...], "prompt": ..., "sources": ..., "metadata": ...}``
  -> the fields of :meth:`PairwiseOutput.to_dict`.
- ``GET /health``    ``{"status": "ok"}``;  ``GET /info``: reward, config, metadata, limits, versions.

``IMG`` is a base64 string of an encoded file (PNG / JPEG / WebP ...; decoded by :mod:`rewardkit.media` with
its decompression-bomb guard), ``{"data": base64, "shape": [H, W, 3], "dtype": "uint8"}`` for raw pixels, or
``{"data": base64, "shape": [3, H, W], "dtype": "float32" | "float16" | "bfloat16"}`` for a float tensor
scored losslessly by the reward's tensor path (see :mod:`rewardkit.serve.wire`).

**Bounds.** Every resource a client can claim is bounded (``ServerConfig``; docs/serve.md, "Exposing the
server"): connections, header and body read time (:mod:`rewardkit.serve.net`), requests in flight, body
bytes, the bytes and values of the JSON a request carries (checked before it is parsed: the parser holds the
interpreter; a JSON body over 64 KiB is parsed in a worker thread), images, and the decoded pixels of a request
and of a model call, checked from the image headers before anything is decoded. Credentials never leave the
server: every answer and log record is redacted on its way out (:mod:`rewardkit.serve.secrets`).

A sample that cannot be decoded or scored comes back NaN with ``valid=false`` and a reason (the server always
scores with ``on_error="nan"``); a request that is malformed as a whole gets a 4xx with ``{"error": ...}``.

**Dynamic batching** (:mod:`rewardkit.serve.batch`; its limits are :class:`ServerConfig`'s, in
:mod:`rewardkit.serve.config`). Each model replica has a queue and one worker. The worker takes the oldest
request, then every compatible request already waiting (up to ``max_batch`` images and ``max_batch_pixels``
decoded pixels; a request of another kind, e.g. with metadata when the first has none, keeps its place in line
for the next batch), waits at most ``max_wait_ms`` for more while the batch is not full, and scores all of them
in one reward call; outputs are split back per request. Rewards whose scores depend on the other samples of a
call (``batch_relative``, e.g. z-scored composites) are never merged across requests. Several replicas (e.g.
one per GPU) share one endpoint; a request goes to the replica with the fewest queued images.

This module serves the ``Reward`` objects it is given; loading one by its registry name (``load_replicas``, the
``app_from_env`` factory) is :mod:`rewardkit.server`'s, which also re-exports everything here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import math
import os
import struct
import time
from typing import Any

from ..reward import PairwiseOutput, Reward, RewardOutput, config_dict  # noqa: F401 - outputs re-exported
from . import wire
from .batch import CONNECTION_KEY, Connection, Connections, _Job, _Replica
from .binary import LIGHT_HEADER_BYTES as LIGHT_BODY_BYTES
from .config import ServerConfig
from .secrets import RedactingFilter, Redactor
from .wire import HTTPError, decode_image

__all__ = ["ServerConfig", "RewardServer", "create_app", "serve_in_thread", "ServerHandle", "decode_image",
           "uvicorn_config", "run_server", "bind_socket", "token_from_env", "LOOPBACK_HOSTS"]

log = logging.getLogger("rewardkit.server")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class RewardServer:
    """The reward replicas, their queues and the request handlers (framework-independent logic)."""

    def __init__(self, rewards: list[Reward], cfg: ServerConfig | None = None):
        if not rewards:
            raise ValueError("a server needs at least one reward replica")
        names = {type(r) for r in rewards}
        if len(names) != 1:
            raise ValueError("all replicas must be the same reward")
        self.cfg = cfg or ServerConfig()
        self.reward = rewards[0]
        # the open connections, when the server runs on its own protocol (uvicorn_config): lets a batch close
        # before its wait is over once every known client is in (see serve.batch)
        self.connections = Connections()
        self.replicas = [_Replica(r, self.cfg, i, self.connections) for i, r in enumerate(rewards)]
        self.started = time.time()
        self.requests = 0
        self.in_flight = 0
        # credentials never leave the server: the token, the reward config's credential-like values, and
        # credential-like environment variables (OPENAI_API_KEY, HF_TOKEN, ...) are redacted everywhere
        self.redact = Redactor([self.cfg.token])
        self.redact.collect(_jsonable(config_dict(self.reward)))
        self._log_filter = RedactingFilter(self.redact)

    def supports_tensor_input(self) -> bool:
        return bool(getattr(self.reward, "supports_tensor_input", False))

    async def startup(self) -> None:
        # the server's own records, and every record any logger of the process (a judge's, uvicorn's) hands to
        # the handlers in place now: a logger's filter sees only the records made on it, a handler's all of them
        log.addFilter(self._log_filter)
        self._filtered = _log_handlers()
        for h in self._filtered:
            h.addFilter(self._log_filter)
        for r in self.replicas:
            r.start()

    async def shutdown(self) -> None:
        for r in self.replicas:
            await r.stop()
        log.removeFilter(self._log_filter)
        for h in getattr(self, "_filtered", []):
            h.removeFilter(self._log_filter)

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` answers (credentials redacted by the app's answer, like every answer)."""
        import platform

        import torch

        from .._version import __version__

        rw = self.reward
        versions = {"rewardkit": __version__, "torch": torch.__version__, "python": platform.python_version()}
        for mod in ("transformers", "diffusers"):
            m = __import__("sys").modules.get(mod)
            if m is not None:
                versions[mod] = getattr(m, "__version__", "?")
        return {
            "reward": rw.name, "class": type(rw).__name__, "config": _jsonable(config_dict(rw)),
            "tasks": sorted(rw.tasks), "dimensions": list(rw.dimensions), "higher_is_better": rw.higher_is_better,
            "score_range": None if rw.score_range is None else list(rw.score_range),
            "uses_prompt": rw.uses_prompt, "scores_empty_prompt": bool(getattr(rw, "scores_empty_prompt", False)),
            "batch_relative": bool(getattr(rw, "batch_relative", False)),
            "compare_is_symmetric": rw.compare_is_symmetric, "supports_tensor_input": self.supports_tensor_input(),
            "replicas": [str(r.reward.device) for r in self.replicas],
            "limits": {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "token"},
            "auth": self.cfg.token is not None, "versions": versions, "wire_formats": ["json", "binary"],
            "stats": {"requests": self.requests, "batches": sum(r.batches for r in self.replicas),
                      "merged_requests": sum(r.merged_requests for r in self.replicas),
                      "batches_closed_early": sum(r.closed_early for r in self.replicas)},
        }

    def parse(self, kind: str, body: Any) -> _Job:
        if not isinstance(body, dict):
            raise HTTPError(400, "the body must be a JSON object")
        allowed = {"images", "prompt", "sources", "metadata"} if kind == "score" else \
            {"images_a", "images_b", "prompt", "sources", "metadata"}
        unknown = set(body) - allowed
        if unknown:
            raise HTTPError(400, f"unknown fields {sorted(unknown)}; expected {sorted(allowed)}")
        lim = self.cfg.max_images
        if kind == "score":
            images = wire.image_list(body, "images", lim)
            n = len(images)
        else:
            a, b = wire.image_list(body, "images_a", lim), wire.image_list(body, "images_b", lim)
            if len(a) != len(b):
                raise HTTPError(400, f"got {len(a)} images_a but {len(b)} images_b")
            images, n = a + b, len(a)
        sources = wire.sources(body, n, lim)
        if sources is not None and not self.reward.accepts_sources:
            raise HTTPError(400, f"reward {self.reward.name!r} does not take sources")
        if sources is None and self.reward.requires_sources:
            raise HTTPError(400, f"reward {self.reward.name!r} scores edits and needs 'sources'")
        tensor = None
        floats = [wire.is_float_image(x) for x in images]
        if any(floats):
            shapes = {(*x.shape, str(x.dtype).removeprefix("torch.")) for x in images if wire.is_float_image(x)}
            if not all(floats) or len(shapes) != 1:
                raise HTTPError(400, "float images go in one request of a single shape and dtype, without "
                                     "encoded or uint8 images")
            if sources is not None or not self.supports_tensor_input():
                raise HTTPError(400, f"reward {self.reward.name!r} takes float images only without sources and "
                                     "when it has a tensor path (info: supports_tensor_input); send uint8 or PNG")
            tensor = shapes.pop()
        if sources is not None and any(wire.is_float_image(x) for e in sources for x in e):
            raise HTTPError(400, "sources are encoded files or uint8 pixels, not float images")
        # the decoded size of everything, from the headers: refused before a single pixel is decoded
        pixels = sum(wire.pixel_count(x) for x in images)
        pixels += sum(wire.pixel_count(x) for e in (sources or []) for x in e)
        if pixels > self.cfg.max_request_pixels:
            raise HTTPError(413, f"the request's images decode to {pixels:,} pixels, over this server's limit "
                                 f"of {self.cfg.max_request_pixels:,} per request; send fewer or smaller images")
        return _Job(kind, images, wire.prompts(body, n, self.reward.uses_prompt), sources,
                    wire.metadata(body, n), pixels=pixels, tensor=tensor)

    async def handle(self, job: _Job, connection: Connection | None = None) -> dict:
        """Queue ``job`` (sent on ``connection``, when the server's protocol tracks it) on the least-loaded
        replica and wait for its result. If the caller is cancelled (timeout, client gone), a queued job is
        dropped by the worker; a running one finishes for the other requests of its batch."""
        job.future = asyncio.get_running_loop().create_future()
        replica = min(self.replicas, key=lambda r: r.queued_images)
        self.requests += 1
        if connection is not None:
            job.known, job.connection = connection.submitted(), connection
        replica.submit(job)
        try:
            return await asyncio.shield(job.future)
        finally:
            if not job.future.done():
                job.future.cancel()
            job.answered()  # a job dropped or timed out: its replica never answered it


def _log_handlers() -> list[logging.Handler]:
    """The handlers of the root logger, of every logger configured so far and the last-resort handler."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = {id(h): h for lg in loggers for h in lg.handlers}
    if logging.lastResort is not None:
        handlers[id(logging.lastResort)] = logging.lastResort
    return list(handlers.values())


def _is_binary(content_type: str | None) -> bool:
    from .binary import CONTENT_TYPE

    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == CONTENT_TYPE


def _jsonable(obj: Any) -> Any:
    """Config values and answers as strict JSON: non-finite floats -> None, tuples -> lists, numpy scalars and
    arrays / tensors -> numbers and lists, anything else -> str."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and type(obj).__module__.split(".")[0] in ("numpy", "torch"):
        return _jsonable(obj.tolist())  # numpy scalar / array, torch tensor
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def create_app(rewards: Reward | list[Reward], cfg: ServerConfig | None = None):
    """A Starlette ASGI app serving ``rewards`` (one instance, or one per device). Run it with uvicorn
    (:func:`uvicorn_config` adds the connection bounds), or mount it in any ASGI server."""
    from .._imports import require

    require("starlette", "serve")
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from . import binary
    from .binary import parse_body as parse_binary

    server = RewardServer(rewards if isinstance(rewards, list) else [rewards], cfg)
    cfg = server.cfg
    expected = None if cfg.token is None else cfg.token.encode()

    def error(status: int, message: str, close: bool = False, retry_after: int | None = None) -> JSONResponse:
        headers = {"Connection": "close"} if close else {}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return answer({"error": message}, status, headers)

    def answer(obj: Any, status: int = 200, headers: dict | None = None) -> JSONResponse:
        """Every JSON answer leaves through here: strict JSON, credentials redacted (the edge)."""
        return JSONResponse(server.redact(_jsonable(obj)), status_code=status, headers=headers)

    def authorised(request: Request) -> bool:
        if expected is None:
            return True
        # the whole token, compared in constant time (never a prefix of it, never an empty one)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return hmac.compare_digest(given.strip().encode(), expected) and scheme.lower() == "bearer"

    async def read_body(request: Request, limit: int, what: str, check_start: Any = None) -> bytes | bytearray:
        """The body, at most ``limit`` bytes (413) within the body timeout (408); ``check_start(first_bytes)``
        is called once the first 8 bytes are in (a binary body's header length is refused there)."""
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HTTPError(400, "bad Content-Length")
            if int(length) > limit:  # refused before a byte of it is read
                raise HTTPError(413, f"{what} of {int(length):,} bytes is over the limit of {limit:,}")

        async def body() -> bytes | bytearray:
            if length is not None:
                # filled chunk by chunk: no copy of the whole body at the end (a 64 MB join held the interpreter
                # for ~45 ms of CPU time and doubled the body's memory). h11 holds the client to its length.
                buf, size, head = None, 0, b""
                async for chunk in request.stream():
                    if check_start is not None and len(head) < 8:
                        head += chunk[:8 - len(head)]
                        if len(head) == 8:
                            check_start(head)
                    if buf is None:  # allocated after the first bytes: a body refused from them costs nothing
                        buf = bytearray(int(length))
                    if size + len(chunk) > len(buf):  # never with h11's framing; a slice past the end would grow it
                        raise HTTPError(400, f"the body is longer than its Content-Length of {len(buf):,}")
                    buf[size:size + len(chunk)] = chunk
                    size += len(chunk)
                if buf is None:
                    buf = bytearray()
                if size != len(buf):  # never with h11's framing either: a short body ends in ClientDisconnect
                    raise HTTPError(400, f"the body has {size:,} bytes, not its Content-Length of {len(buf):,}")
                return buf
            chunks, size, head = [], 0, b""
            async for chunk in request.stream():  # chunked bodies carry no length: bounded while read
                if check_start is not None and len(head) < 8:
                    head += chunk[:8 - len(head)]
                    if len(head) == 8:
                        check_start(head)
                size += len(chunk)
                if size > limit:
                    raise HTTPError(413, f"{what} is over the limit of {limit:,} bytes")
                if chunk:  # Starlette ends with an empty chunk; joining one chunk returns it, uncopied
                    chunks.append(chunk)
            return b"".join(chunks)

        try:  # a client dripping its body cannot hold a slot
            return await asyncio.wait_for(body(), cfg.body_timeout)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"the request body took longer than {cfg.body_timeout:g} s") from None

    def parse_json(raw: bytes) -> Any:
        return wire.loads_json(raw, "the body", cfg.max_json_bytes, cfg.max_json_items)

    # a JSON body's own limit, far below a binary body's (the JSON parser holds the interpreter while it runs)
    json_limit = min(cfg.max_json_bytes, cfg.max_body_bytes)

    def check_binary_start(first: bytes) -> None:
        """A binary body announcing a header over max_json_bytes is refused before the rest is read."""
        if first[:4] == binary.MAGIC and struct.unpack_from("<I", first, 4)[0] > cfg.max_json_bytes:
            hlen = struct.unpack_from("<I", first, 4)[0]
            raise HTTPError(413, f"the binary body's header has {hlen:,} bytes of JSON, over this server's limit "
                                 f"of {cfg.max_json_bytes:,}")

    def endpoint(kind: str):
        def parse_binary_body(raw: bytes) -> dict:
            return parse_binary(raw, kind, cfg.max_json_bytes, cfg.max_json_items)

        def parse_heavy(raw: bytes, body: dict | None, binary_body: bool) -> _Job:
            if not binary_body:
                return server.parse(kind, parse_json(raw))
            return server.parse(kind, parse_binary_body(raw) if body is None else body)

        async def handler(request: Request) -> Response:
            if not authorised(request):  # its body is never read: the connection is closed after the answer
                return error(401, "missing or wrong bearer token", close=True)
            if server.in_flight >= cfg.max_in_flight:
                return error(503, f"the server has {server.in_flight} requests in flight, its limit; retry later",
                             close=True, retry_after=1)

            async def process() -> dict:
                if not _is_binary(request.headers.get("content-type")):
                    raw = await read_body(request, json_limit, "a JSON body")
                    # a short body is parsed and checked on the event loop (less work than a hop to a thread);
                    # a longer one in a thread, so that its base64 decoding and image headers never hold the loop
                    # (the parse itself is bounded by max_json_bytes / max_json_items: it holds the interpreter)
                    if len(raw) <= LIGHT_BODY_BYTES:
                        job = server.parse(kind, parse_json(raw))
                    else:
                        job = await asyncio.get_running_loop().run_in_executor(None, parse_heavy, raw, None, False)
                else:
                    raw = await read_body(request, cfg.max_body_bytes, "body", check_binary_start)
                    # the header parsed on the event loop when short; the images checked there too when they are
                    # raw uint8 pixels (views of the body: less work than a hop to a thread), otherwise (encoded
                    # files have their headers opened, float images are copied) in a thread
                    body = parse_binary_body(raw) if binary.light_header(raw) else None
                    if body is not None and binary.only_raw_pixels(body):
                        job = server.parse(kind, body)
                    else:
                        job = await asyncio.get_running_loop().run_in_executor(None, parse_heavy, raw, body, True)
                return await server.handle(job, request.scope.get("state", {}).get(CONNECTION_KEY))

            server.in_flight += 1
            try:  # the timeout covers the whole request: reading the body, queueing, scoring
                result = await asyncio.wait_for(process(), cfg.timeout)
            except asyncio.TimeoutError:
                return error(504, f"the request took longer than the server's timeout of {cfg.timeout:g} s")
            except HTTPError as exc:  # an unread body (413, 408) leaves the connection unusable: close it
                return error(exc.status, exc.message, close=exc.status in (408, 413))
            except ClientDisconnect:
                return Response(status_code=499)
            except Exception as exc:  # a bug or a failing model: a message, never a dropped connection
                log.exception("request failed")
                return error(500, f"{type(exc).__name__}: {exc}")
            finally:
                server.in_flight -= 1
            # every field is the reward's own: a judge's errors, rationales, info and details may quote its
            # request, URL or key (redacted in answer); NaN for a failed sample, numpy scalars... (strict JSON)
            return answer(result)
        return handler

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def info(request: Request) -> Response:
        if not authorised(request):
            return error(401, "missing or wrong bearer token")
        return answer(server.info())

    @asynccontextmanager
    async def lifespan(app):
        await server.startup()
        try:
            yield
        finally:
            await server.shutdown()

    app = Starlette(routes=[Route("/score", endpoint("score"), methods=["POST"]),
                            Route("/compare", endpoint("compare"), methods=["POST"]),
                            Route("/health", health, methods=["GET"]),
                            Route("/info", info, methods=["GET"])], lifespan=lifespan)
    app.state.rewardkit = server
    return app


def uvicorn_config(app: Any, cfg: ServerConfig | None = None, **kw: Any) -> Any:
    """A ``uvicorn.Config`` serving ``app`` with ``cfg``'s connection bounds: the connection cap (kept under
    the file-descriptor limit), header timeout, keep-alive, header size and backlog (see
    :mod:`rewardkit.serve.net`). ``kw`` goes to ``uvicorn.Config`` (``host``, ``port``, ``log_level``...)."""
    from .net import uvicorn_config as _config

    server = app.state.rewardkit
    return _config(app, cfg or server.cfg, connections=server.connections, **kw)


class ServerHandle:
    """A server running in a background thread (tests, notebooks): ``.url`` and ``.stop()``."""

    def __init__(self, server, thread, url: str):
        self._server, self._thread, self.url = server, thread, url

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)


def serve_in_thread(rewards: Reward | list[Reward], cfg: ServerConfig | None = None, *, host: str = "127.0.0.1",
                    port: int = 0, startup_timeout: float = 30.0) -> ServerHandle:
    """Start uvicorn serving ``rewards`` in a daemon thread (``port=0``: an ephemeral port), with the
    connection bounds of ``cfg``; returns once it accepts connections."""
    import socket
    import threading

    from .._imports import require

    uvicorn = require("uvicorn", "serve")
    sock = bind_socket(host, port)
    family = sock.family
    bound = sock.getsockname()[1]
    app = create_app(rewards, cfg)
    server = uvicorn.Server(uvicorn_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"rewardkit-serve-{bound}")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the reward server on {host}:{bound} did not start")
        time.sleep(0.01)
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return ServerHandle(server, thread, f"http://{shown}:{bound}")


def run_server(app: Any, sock: Any, cfg: ServerConfig | None = None) -> None:
    """Serve ``app`` (from :func:`create_app`) on the bound socket ``sock`` with uvicorn and ``cfg``'s
    connection bounds, until interrupted."""
    from .._imports import require

    uvicorn = require("uvicorn", "serve")
    uvicorn.Server(uvicorn_config(app, cfg)).run(sockets=[sock])


def bind_socket(host: str, port: int):
    """A TCP socket bound to ``host:port`` (``port=0``: a free one; read it with ``getsockname()``). Raises
    ``OSError`` when the address is taken: call it before loading a model."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP (see serve.net)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers only, never a live port
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def token_from_env(env: dict[str, str] | None = None) -> str | None:
    """``REWARDKIT_SERVE_TOKEN``: None when unset; a ``ValueError`` when set but empty (an empty token must
    not silently turn authentication off)."""
    env = os.environ if env is None else env
    if "REWARDKIT_SERVE_TOKEN" not in env:
        return None
    token = env["REWARDKIT_SERVE_TOKEN"].strip()
    if not token:
        raise ValueError("REWARDKIT_SERVE_TOKEN is set but empty: set a token, or unset it to serve without "
                         "authentication")
    return token
