"""``rewardkit serve``: an HTTP reward server on Starlette + uvicorn, with dynamic batching.

Endpoints (JSON in, JSON out; no pickle anywhere; a request body may also be the binary form of
:mod:`rewardkit._serve_binary`, ``Content-Type: application/octet-stream``: the same JSON fields in a small
header, the images' raw bytes after it, decoded off the event loop; what ``RemoteReward`` sends):

- ``POST /score``    ``{"images": [IMG, ...], "prompt": str | [str], "sources": [[IMG, ...], ...] | null,
  "metadata": [{...}, ...] | null}`` -> the fields of :meth:`RewardOutput.to_dict` (NaN -> null).
- ``POST /compare``  ``{"images_a": [...], "images_b": [...], "prompt": ..., "sources": ..., "metadata": ...}``
  -> the fields of :meth:`PairwiseOutput.to_dict`.
- ``GET /health``    ``{"status": "ok"}``;  ``GET /info``: reward, config, metadata, limits, versions.

``IMG`` is a base64 string of an encoded file (PNG / JPEG / WebP ...; decoded by :mod:`rewardkit.media` with
its decompression-bomb guard), ``{"data": base64, "shape": [H, W, 3], "dtype": "uint8"}`` for raw pixels, or
``{"data": base64, "shape": [3, H, W], "dtype": "float32" | "float16" | "bfloat16"}`` for a float tensor
scored losslessly by the reward's tensor path (see :mod:`rewardkit._serve_wire`).

**Bounds.** Every resource a client can claim is bounded (``ServerConfig``; docs/serve.md, "Exposing the
server"): connections, header and body read time (:mod:`rewardkit._serve_net`), requests in flight, body
bytes, images, and the decoded pixels of a request and of a model call, checked from the image headers
before anything is decoded. Credentials never leave the server (:mod:`rewardkit._serve_secrets`).

A sample that cannot be decoded or scored comes back NaN with ``valid=false`` and a reason (the server always
scores with ``on_error="nan"``); a request that is malformed as a whole gets a 4xx with ``{"error": ...}``.

**Dynamic batching.** Each model replica has a queue and one worker. The worker takes the oldest request,
then every compatible request already waiting (up to ``max_batch`` images and ``max_batch_pixels`` decoded
pixels; a request of another kind, e.g. with metadata when the first has none, keeps its place in line for
the next batch), waits at most ``max_wait_ms`` for more while the batch is not full, and scores all of them
in one reward call; outputs are split back per request. Rewards whose scores depend on the other samples of a call (``batch_relative``, e.g. z-scored
composites) are never merged across requests. Several replicas (e.g. one per GPU) share one endpoint; a
request goes to the replica with the fewest queued images.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import _serve_wire as wire
from ._serve_secrets import RedactingFilter, Redactor
from ._serve_wire import HTTPError, decode_image
from .reward import PairwiseOutput, Reward, RewardOutput, config_dict

__all__ = ["ServerConfig", "RewardServer", "create_app", "app_from_env", "load_replicas", "serve_in_thread",
           "ServerHandle", "decode_image", "uvicorn_config", "run_server", "bind_socket", "token_from_env",
           "LOOPBACK_HOSTS"]

log = logging.getLogger("rewardkit.server")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass
class ServerConfig:
    """Limits and batching of a reward server (docs/serve.md, "Exposing the server").

    Attributes:
        max_batch: most images scored in one model call (merged across requests).
        max_wait_ms: how long a non-full batch waits for more requests (0: take only what is queued).
        max_body_bytes: largest request body accepted (413 above).
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
        for name in ("max_batch", "max_body_bytes", "max_images", "max_connections", "max_in_flight",
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


# ---------------------------------------------------------------------------------------------- batching
@dataclass
class _Job:
    kind: str                      # "score" | "compare"
    images: list[Any]              # score: B images; compare: images_a + images_b (2B)
    prompts: list[Any]             # B
    sources: list[list[Any]] | None
    metadata: list[dict] | None
    pixels: int = 0                # decoded pixels of images and sources (from their headers)
    tensor: tuple | None = None    # float images: (C, H, W, dtype); they merge only with the same
    future: asyncio.Future = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def n(self) -> int:
        return len(self.prompts)

    @property
    def cost(self) -> int:  # images through the model
        return len(self.images)

    def key(self) -> tuple:
        return (self.kind, self.sources is not None, self.metadata is not None, self.tensor)


def _decode(x: Any) -> Any:
    """An encoded wire image -> canonical RGB PIL (decoded here, in the replica's thread, so that a request
    that timed out stops being decoded); anything that fails stays as it was, for the reward to report."""
    if not isinstance(x, (bytes, bytearray)):
        return x
    from . import media

    try:
        return media.load_image(x)
    except Exception:  # noqa: BLE001 - reported per sample by the reward call, with its reason
        return x


class _Replica:
    """One reward instance, one queue, one worker thread for model calls."""

    def __init__(self, reward: Reward, cfg: ServerConfig, index: int):
        self.reward = reward
        self.cfg = cfg
        self.index = index
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.queued_images = 0
        self.batches = 0
        self.merged_requests = 0
        self._held: collections.deque[_Job] = collections.deque()  # waiting jobs a batch passed over, in order
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rewardkit-replica{index}")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    def submit(self, job: _Job) -> None:
        self.queued_images += job.cost
        self.queue.put_nowait(job)

    async def _next(self) -> _Job:
        if self._held:
            return self._held.popleft()
        return await self.queue.get()

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        mergeable = not getattr(self.reward, "batch_relative", False)
        while True:
            first = await self._next()
            jobs, cost, pixels = [first], first.cost, first.pixels
            deadline = loop.time() + self.cfg.max_wait_ms / 1000.0
            # every compatible job already waiting joins (jobs passed over before, then the queue); one of another
            # kind, or one that would overflow the batch (images or decoded pixels), keeps its place in line
            waiting = list(self._held) if mergeable else []
            skipped: list[_Job] = []
            if mergeable:
                self._held.clear()
            while mergeable and cost < self.cfg.max_batch:
                if waiting:
                    job = waiting.pop(0)
                else:
                    try:
                        job = self.queue.get_nowait()
                    except asyncio.QueueEmpty:
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            break
                        try:
                            job = await asyncio.wait_for(self.queue.get(), remaining)
                        except asyncio.TimeoutError:
                            break
                if job.key() != first.key():
                    skipped.append(job)
                    continue
                if cost + job.cost > self.cfg.max_batch or pixels + job.pixels > self.cfg.max_batch_pixels:
                    skipped.append(job)  # the batch is as full as it gets: score it now
                    break
                jobs.append(job)
                cost += job.cost
                pixels += job.pixels
            if mergeable:
                self._held.extend(skipped + waiting)  # in arrival order, ahead of the queue
            self.queued_images -= cost
            jobs = [j for j in jobs if not j.future.done()]  # timed out or disconnected while queued
            if not jobs:
                continue
            try:
                done = await loop.run_in_executor(self._executor, self._run, jobs)
            except Exception:
                # Per-sample problems come back as NaN; an exception is a call-level failure. When requests
                # were merged, score each alone so one request's failure does not fail its neighbours.
                log.exception("reward call failed")
                done = None
            if done is not None:
                self._deliver(done)
                continue
            for job in jobs:
                if job.future.done():
                    continue
                try:
                    self._deliver(await loop.run_in_executor(self._executor, self._run, [job]))
                except Exception as exc:
                    if not job.future.done():
                        job.future.set_exception(exc)

    def _deliver(self, done: list[tuple[_Job, dict]]) -> None:
        if not done:
            return
        self.batches += 1
        self.merged_requests += len(done)
        for j, r in done:
            if not j.future.done():
                j.future.set_result(r)

    def _run(self, jobs: list[_Job]) -> list[tuple[_Job, dict]]:
        """Runs in the replica's thread: decodes the jobs' images (dropping a job as soon as its request is
        gone: timed out or disconnected), then one reward call for the rest, split back per job."""
        live = []
        for j in jobs:
            images, srcs = [], None
            for x in j.images:
                if j.future.done():
                    break
                images.append(_decode(x))
            if j.sources is not None and not j.future.done():
                srcs = [[_decode(x) for x in entry] for entry in j.sources]
            if j.future.done():
                continue  # its decoded pixels are dropped here, not scored
            j.images, j.sources = images, srcs
            live.append(j)
        if not live:
            return []
        jobs = live
        kind = jobs[0].kind
        prompts = [p for j in jobs for p in j.prompts]
        sources = None if jobs[0].sources is None else [s for j in jobs for s in j.sources]
        metadata = None if jobs[0].metadata is None else [m for j in jobs for m in j.metadata]
        tensor = jobs[0].tensor is not None

        def batch(images: list[Any]) -> Any:
            if not tensor:
                return images
            import torch

            return torch.stack(images)  # [B, 3, H, W]: the reward's tensor path, as in-process

        if kind == "score":
            out = self.reward(batch([x for j in jobs for x in j.images]), prompts, sources=sources,
                              metadata=metadata, on_error="nan")
            return list(zip(jobs, _split_score(out, [j.n for j in jobs])))
        a = [x for j in jobs for x in j.images[:j.n]]
        b = [x for j in jobs for x in j.images[j.n:]]
        pair = self.reward.compare(batch(a), batch(b), prompts, sources=sources, metadata=metadata, on_error="nan")
        return list(zip(jobs, _split_pair(pair, [j.n for j in jobs])))


def _split_score(out: RewardOutput, sizes: list[int]) -> list[dict]:
    full = out.to_dict()
    res, s = [], 0
    for n in sizes:
        part = {k: (full[k][s:s + n] if isinstance(full[k], list) else full[k])
                for k in ("scores", "valid", "errors", "rationales", "details")}
        part["dimensions"] = {d: v[s:s + n] for d, v in full["dimensions"].items()}
        part["info"] = full["info"]
        res.append(part)
        s += n
    return res


def _split_pair(out: PairwiseOutput, sizes: list[int]) -> list[dict]:
    full = out.to_dict()
    res, s = [], 0
    for n in sizes:
        part = {k: (v[s:s + n] if isinstance(v, list) else v) for k, v in full.items()}
        res.append(part)
        s += n
    return res


# ---------------------------------------------------------------------------------------------- the app
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
        self.replicas = [_Replica(r, self.cfg, i) for i, r in enumerate(rewards)]
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
        log.addFilter(self._log_filter)
        for r in self.replicas:
            r.start()

    async def shutdown(self) -> None:
        for r in self.replicas:
            await r.stop()
        log.removeFilter(self._log_filter)

    def info(self) -> dict[str, Any]:
        import platform

        import torch

        from ._version import __version__

        rw = self.reward
        versions = {"rewardkit": __version__, "torch": torch.__version__, "python": platform.python_version()}
        for mod in ("transformers", "diffusers"):
            m = __import__("sys").modules.get(mod)
            if m is not None:
                versions[mod] = getattr(m, "__version__", "?")
        return self.redact({
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
                      "merged_requests": sum(r.merged_requests for r in self.replicas)},
        })

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

    async def handle(self, job: _Job) -> dict:
        """Queue ``job`` on the least-loaded replica and wait for its result. If the caller is cancelled
        (timeout, client gone), a queued job is dropped by the worker; a running one finishes for the other
        requests of its batch."""
        job.future = asyncio.get_running_loop().create_future()
        replica = min(self.replicas, key=lambda r: r.queued_images)
        self.requests += 1
        replica.submit(job)
        try:
            return await asyncio.shield(job.future)
        finally:
            if not job.future.done():
                job.future.cancel()


def _is_binary(content_type: str | None) -> bool:
    from ._serve_binary import CONTENT_TYPE

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
    from ._imports import require

    require("starlette", "serve")
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from ._serve_binary import parse_body as parse_binary

    server = RewardServer(rewards if isinstance(rewards, list) else [rewards], cfg)
    cfg = server.cfg
    expected = None if cfg.token is None else cfg.token.encode()

    def error(status: int, message: str, close: bool = False, retry_after: int | None = None) -> JSONResponse:
        headers = {"Connection": "close"} if close else {}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return JSONResponse({"error": server.redact.text(message)}, status_code=status, headers=headers)

    def authorised(request: Request) -> bool:
        if expected is None:
            return True
        # the whole token, compared in constant time (never a prefix of it, never an empty one)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return hmac.compare_digest(given.strip().encode(), expected) and scheme.lower() == "bearer"

    async def read_body(request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HTTPError(400, "bad Content-Length")
            if int(length) > cfg.max_body_bytes:
                raise HTTPError(413, f"body of {int(length):,} bytes is over the limit of {cfg.max_body_bytes:,}")

        async def body() -> bytes:
            chunks, size = [], 0
            async for chunk in request.stream():  # also bounds chunked bodies, which carry no length
                size += len(chunk)
                if size > cfg.max_body_bytes:
                    raise HTTPError(413, f"body is over the limit of {cfg.max_body_bytes:,} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

        try:  # a client dripping its body cannot hold a slot
            return await asyncio.wait_for(body(), cfg.body_timeout)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"the request body took longer than {cfg.body_timeout:g} s") from None

    def parse_json(raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer over int_max_str_digits
            raise HTTPError(400, f"the body is not valid JSON: {exc}") from None
        except RecursionError:
            raise HTTPError(400, "the body is not valid JSON: nested too deeply") from None

    def endpoint(kind: str):
        async def handler(request: Request) -> Response:
            if not authorised(request):  # its body is never read: the connection is closed after the answer
                return error(401, "missing or wrong bearer token", close=True)
            if server.in_flight >= cfg.max_in_flight:
                return error(503, f"the server has {server.in_flight} requests in flight, its limit; retry later",
                             close=True, retry_after=1)

            async def process() -> dict:
                raw = await read_body(request)
                if _is_binary(request.headers.get("content-type")):  # decoded in a thread, off the event loop
                    job = await asyncio.get_running_loop().run_in_executor(
                        None, lambda: server.parse(kind, parse_binary(raw, kind)))
                else:
                    job = server.parse(kind, parse_json(raw))
                return await server.handle(job)

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
            for key in ("errors", "rationales"):  # a judge's error may quote its request (and key)
                if isinstance(result.get(key), list):
                    result[key] = [server.redact.text(v) if isinstance(v, str) else v for v in result[key]]
            # details / info are the reward's own: NaN for a failed sample, numpy scalars... (strict JSON here)
            return JSONResponse(_jsonable(result))
        return handler

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def info(request: Request) -> Response:
        if not authorised(request):
            return error(401, "missing or wrong bearer token")
        return JSONResponse(server.info())

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
    :mod:`rewardkit._serve_net`). ``kw`` goes to ``uvicorn.Config`` (``host``, ``port``, ``log_level``...)."""
    from ._serve_net import uvicorn_config as _config

    return _config(app, cfg or app.state.rewardkit.cfg, **kw)


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

    from ._imports import require

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
    from ._imports import require

    uvicorn = require("uvicorn", "serve")
    uvicorn.Server(uvicorn_config(app, cfg)).run(sockets=[sock])


def bind_socket(host: str, port: int):
    """A TCP socket bound to ``host:port`` (``port=0``: a free one; read it with ``getsockname()``). Raises
    ``OSError`` when the address is taken: call it before loading a model."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
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


def app_from_env():
    """App factory for running under an external ASGI server (``uvicorn --factory`` / gunicorn workers):
    ``REWARDKIT_SERVE_REWARD`` (registry name), ``REWARDKIT_SERVE_CONFIG`` (YAML, optional),
    ``REWARDKIT_SERVE_DEVICES`` (comma-separated, one replica each; default ``cpu``) and
    ``REWARDKIT_SERVE_TOKEN`` (optional bearer token; set but empty is an error). The outer server owns the
    connection bounds: give uvicorn ``--limit-concurrency``, ``--timeout-keep-alive``, ``--backlog``
    (docs/serve.md, "Exposing the server")."""
    token = token_from_env()  # before loading anything
    name = os.environ.get("REWARDKIT_SERVE_REWARD")
    if not name:
        raise RuntimeError("set REWARDKIT_SERVE_REWARD to the reward's registry name")
    conf = os.environ.get("REWARDKIT_SERVE_CONFIG") or None
    devices = [d.strip() for d in os.environ.get("REWARDKIT_SERVE_DEVICES", "cpu").split(",") if d.strip()]
    rewards = load_replicas(name, conf, {}, devices)
    return create_app(rewards, ServerConfig(token=token))


def load_replicas(name: str, config: Any, overrides: dict[str, Any], devices: list[str]) -> list[Reward]:
    """One reward instance per device (``["cuda:0", "cuda:1"]``); ``device`` is passed only to rewards whose
    config has that option (e.g. OCR runs on the CPU and has none)."""
    from .registry import get_reward_class, load_reward

    has_device = "device" in {f.name for f in dataclasses.fields(get_reward_class(name).Config)}
    if len(devices) > 1 and not has_device:
        raise ValueError(f"reward {name!r} has no device option: run one replica")
    out = []
    for d in devices or [None]:
        kw = dict(overrides)
        if d is not None and has_device:
            kw["device"] = d
        out.append(load_reward(name, config, **kw))
    return out
