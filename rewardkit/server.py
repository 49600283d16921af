"""``rewardkit serve``: an HTTP reward server on Starlette + uvicorn, with dynamic batching.

Endpoints (JSON in, JSON out; no pickle anywhere):

- ``POST /score``    ``{"images": [IMG, ...], "prompt": str | [str], "sources": [[IMG, ...], ...] | null,
  "metadata": [{...}, ...] | null}`` -> the fields of :meth:`RewardOutput.to_dict` (NaN -> null).
- ``POST /compare``  ``{"images_a": [...], "images_b": [...], "prompt": ..., "sources": ..., "metadata": ...}``
  -> the fields of :meth:`PairwiseOutput.to_dict`.
- ``GET /health``    ``{"status": "ok"}``;  ``GET /info``: reward, config, metadata, limits, versions.

``IMG`` is a base64 string of an encoded file (PNG / JPEG / WebP ...; decoded by :mod:`rewardkit.media` with
its decompression-bomb guard) or ``{"data": base64, "shape": [H, W, 3], "dtype": "uint8"}`` for raw pixels.

A sample that cannot be decoded or scored comes back NaN with ``valid=false`` and a reason (the server always
scores with ``on_error="nan"``); a request that is malformed as a whole gets a 4xx with ``{"error": ...}``.

**Dynamic batching.** Each model replica has a queue and one worker. The worker takes the oldest request,
then every compatible request already waiting (up to ``max_batch`` images; a request of another kind, e.g.
with metadata when the first has none, keeps its place in line for the next batch), waits at most
``max_wait_ms`` for more while the batch is not full, and scores all of them in one reward call; outputs are split back per
request. Rewards whose scores depend on the other samples of a call (``batch_relative``, e.g. z-scored
composites) are never merged across requests. Several replicas (e.g. one per GPU) share one endpoint; a
request goes to the replica with the fewest queued images.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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

import numpy as np

from .reward import PairwiseOutput, Reward, RewardOutput, config_dict

__all__ = ["ServerConfig", "RewardServer", "create_app", "app_from_env", "load_replicas", "serve_in_thread",
           "ServerHandle", "decode_image",
           "LOOPBACK_HOSTS"]

log = logging.getLogger("rewardkit.server")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass
class ServerConfig:
    """Limits and batching of a reward server.

    Attributes:
        max_batch: most images scored in one model call (merged across requests).
        max_wait_ms: how long a non-full batch waits for more requests (0: take only what is queued).
        max_body_bytes: largest request body accepted (413 above).
        max_images: most images in one request (each of ``images_a`` / ``images_b`` for /compare).
        timeout: seconds a request may take from arrival to response (504 after; the model call it joined
            still completes for the other requests of its batch).
        token: bearer token required on every endpoint but /health (None: no authentication).
    """

    max_batch: int = 32
    max_wait_ms: float = 5.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_images: int = 256
    timeout: float = 120.0
    token: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_body_bytes", "max_images"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("max_wait_ms", "timeout"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (name == "timeout" and v == 0):
                raise ValueError(f"{name} must be a finite number {'> 0' if name == 'timeout' else '>= 0'}, got {v!r}")
        if self.token is not None and not self.token:
            raise ValueError("token must be a non-empty string or None")


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ---------------------------------------------------------------------------------------------- decoding
def decode_image(obj: Any, where: str) -> Any:
    """One wire image -> what :mod:`rewardkit.media` accepts (bytes or an ``[H, W, C]`` uint8 array).

    Raises :class:`HTTPError` (400) for a malformed entry; pixel-level problems (corrupt files, bombs) are
    left to the reward call, which reports them per sample.
    """
    from . import media

    if isinstance(obj, str):
        try:
            return base64.b64decode(obj, validate=True)
        except (binascii.Error, ValueError):
            raise HTTPError(400, f"{where}: not valid base64") from None
    if isinstance(obj, dict):
        unknown = set(obj) - {"data", "shape", "dtype"}
        if unknown:
            raise HTTPError(400, f"{where}: unknown keys {sorted(unknown)} (expected data, shape, dtype)")
        if obj.get("dtype", "uint8") != "uint8":
            raise HTTPError(400, f"{where}: dtype must be 'uint8', got {obj.get('dtype')!r}")
        shape = obj.get("shape")
        if (not isinstance(shape, list) or len(shape) not in (2, 3)
                or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)
                or (len(shape) == 3 and shape[2] not in (1, 3, 4))):
            raise HTTPError(400, f"{where}: shape must be [H, W] or [H, W, C] with C in 1, 3, 4; got {shape!r}")
        if shape[0] * shape[1] > media.get_max_pixels():
            raise HTTPError(413, f"{where}: {shape[1]}x{shape[0]} pixels is over the limit of "
                                 f"{media.get_max_pixels():,}")
        if not isinstance(obj.get("data"), str):
            raise HTTPError(400, f"{where}: 'data' must be a base64 string")
        try:
            raw = base64.b64decode(obj["data"], validate=True)
        except (binascii.Error, ValueError):
            raise HTTPError(400, f"{where}: 'data' is not valid base64") from None
        if len(raw) != math.prod(shape):
            raise HTTPError(400, f"{where}: {len(raw)} bytes do not match shape {shape} ({math.prod(shape)} bytes)")
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    raise HTTPError(400, f"{where}: an image is a base64 string or {{'data', 'shape', 'dtype'}}, "
                         f"got {type(obj).__name__}")


def _image_list(body: dict, key: str, limit: int, required: bool = True) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list) or (required and not value):
        raise HTTPError(400, f"'{key}' must be a non-empty list of images")
    if len(value) > limit:
        raise HTTPError(413, f"'{key}' has {len(value)} images; this server takes at most {limit} per request")
    return [decode_image(x, f"{key}[{i}]") for i, x in enumerate(value)]


def _prompts(body: dict, n: int, uses_prompt: bool) -> list[Any]:
    prompt = body.get("prompt")
    if prompt is None and not uses_prompt:
        return [None] * n
    if isinstance(prompt, str):
        return [prompt] * n
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        if len(prompt) != n:
            raise HTTPError(400, f"got {n} images but {len(prompt)} prompts (send one string to broadcast)")
        return list(prompt)
    raise HTTPError(400, "'prompt' must be a string or a list of strings")


def _sources(body: dict, n: int, limit: int) -> list[list[Any]] | None:
    value = body.get("sources")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        raise HTTPError(400, f"'sources' must be a list with one list of images per sample ({n})")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, list):
            raise HTTPError(400, f"sources[{i}] must be a list of images")
        if len(entry) > limit:
            raise HTTPError(413, f"sources[{i}] has {len(entry)} images; at most {limit}")
        out.append([decode_image(x, f"sources[{i}][{j}]") for j, x in enumerate(entry)])
    return out


def _metadata(body: dict, n: int) -> list[dict] | None:
    value = body.get("metadata")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n or not all(m is None or isinstance(m, dict) for m in value):
        raise HTTPError(400, f"'metadata' must be a list of {n} objects (or null entries)")
    return [m or {} for m in value]


# ---------------------------------------------------------------------------------------------- batching
@dataclass
class _Job:
    kind: str                      # "score" | "compare"
    images: list[Any]              # score: B images; compare: images_a + images_b (2B)
    prompts: list[Any]             # B
    sources: list[list[Any]] | None
    metadata: list[dict] | None
    future: asyncio.Future = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def n(self) -> int:
        return len(self.prompts)

    @property
    def cost(self) -> int:  # images through the model
        return len(self.images)

    def key(self) -> tuple:
        return (self.kind, self.sources is not None, self.metadata is not None)


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
            jobs, cost = [first], first.cost
            deadline = loop.time() + self.cfg.max_wait_ms / 1000.0
            # every compatible job already waiting joins (jobs passed over before, then the queue); one of another
            # kind, or one that would overflow the batch, keeps its place in line for the next batch
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
                if cost + job.cost > self.cfg.max_batch:
                    skipped.append(job)  # the batch is as full as it gets: score it now
                    break
                jobs.append(job)
                cost += job.cost
            if mergeable:
                self._held.extend(skipped + waiting)  # in arrival order, ahead of the queue
            jobs = [j for j in jobs if not j.future.done()]  # timed out or disconnected while queued
            self.queued_images -= cost
            if not jobs:
                continue
            groups = [jobs]
            try:
                results = await loop.run_in_executor(self._executor, self._run, jobs)
            except Exception:
                # Per-sample problems come back as NaN; an exception is a call-level failure. When requests
                # were merged, score each alone so one request's failure does not fail its neighbours.
                log.exception("reward call failed")
                results, groups = None, [[j] for j in jobs] if len(jobs) > 1 else [jobs]
            if results is not None:
                self._deliver(jobs, results)
                continue
            for group in groups:
                try:
                    self._deliver(group, await loop.run_in_executor(self._executor, self._run, group))
                except Exception as exc:
                    for j in group:
                        if not j.future.done():
                            j.future.set_exception(exc)

    def _deliver(self, jobs: list[_Job], results: list[dict]) -> None:
        self.batches += 1
        self.merged_requests += len(jobs)
        for j, r in zip(jobs, results):
            if not j.future.done():
                j.future.set_result(r)

    def _run(self, jobs: list[_Job]) -> list[dict]:
        """Runs in the replica's thread: one reward call for every job, split back per job."""
        kind = jobs[0].kind
        prompts = [p for j in jobs for p in j.prompts]
        sources = None if jobs[0].sources is None else [s for j in jobs for s in j.sources]
        metadata = None if jobs[0].metadata is None else [m for j in jobs for m in j.metadata]
        if kind == "score":
            out = self.reward([x for j in jobs for x in j.images], prompts, sources=sources, metadata=metadata,
                              on_error="nan")
            return _split_score(out, [j.n for j in jobs])
        a = [x for j in jobs for x in j.images[:j.n]]
        b = [x for j in jobs for x in j.images[j.n:]]
        pair = self.reward.compare(a, b, prompts, sources=sources, metadata=metadata, on_error="nan")
        return _split_pair(pair, [j.n for j in jobs])


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

    async def startup(self) -> None:
        for r in self.replicas:
            r.start()

    async def shutdown(self) -> None:
        for r in self.replicas:
            await r.stop()

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
        return {
            "reward": rw.name, "class": type(rw).__name__, "config": _jsonable(config_dict(rw)),
            "tasks": sorted(rw.tasks), "dimensions": list(rw.dimensions), "higher_is_better": rw.higher_is_better,
            "score_range": None if rw.score_range is None else list(rw.score_range),
            "uses_prompt": rw.uses_prompt, "batch_relative": bool(getattr(rw, "batch_relative", False)),
            "compare_is_symmetric": rw.compare_is_symmetric,
            "replicas": [str(r.reward.device) for r in self.replicas],
            "limits": {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "token"},
            "auth": self.cfg.token is not None, "versions": versions,
            "stats": {"requests": self.requests, "batches": sum(r.batches for r in self.replicas),
                      "merged_requests": sum(r.merged_requests for r in self.replicas)},
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
            images = _image_list(body, "images", lim)
            n = len(images)
        else:
            a, b = _image_list(body, "images_a", lim), _image_list(body, "images_b", lim)
            if len(a) != len(b):
                raise HTTPError(400, f"got {len(a)} images_a but {len(b)} images_b")
            images, n = a + b, len(a)
        sources = _sources(body, n, lim)
        if sources is not None and not self.reward.accepts_sources:
            raise HTTPError(400, f"reward {self.reward.name!r} does not take sources")
        if sources is None and self.reward.requires_sources:
            raise HTTPError(400, f"reward {self.reward.name!r} scores edits and needs 'sources'")
        return _Job(kind, images, _prompts(body, n, self.reward.uses_prompt), sources, _metadata(body, n))

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


def _jsonable(obj: Any) -> Any:
    """Config values as strict JSON: non-finite floats -> None, tuples -> lists, anything else -> str."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def create_app(rewards: Reward | list[Reward], cfg: ServerConfig | None = None):
    """A Starlette ASGI app serving ``rewards`` (one instance, or one per device). Run it with uvicorn,
    or mount it in any ASGI server."""
    from ._imports import require

    require("starlette", "serve")
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    server = RewardServer(rewards if isinstance(rewards, list) else [rewards], cfg)
    cfg = server.cfg

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def authorised(request: Request) -> bool:
        if cfg.token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), cfg.token.encode())

    async def read_json(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HTTPError(400, "bad Content-Length")
            if int(length) > cfg.max_body_bytes:
                raise HTTPError(413, f"body of {int(length):,} bytes is over the limit of {cfg.max_body_bytes:,}")
        chunks, size = [], 0
        async for chunk in request.stream():  # also bounds chunked bodies, which carry no length
            size += len(chunk)
            if size > cfg.max_body_bytes:
                raise HTTPError(413, f"body is over the limit of {cfg.max_body_bytes:,} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HTTPError(400, f"the body is not valid JSON: {exc}") from None

    def endpoint(kind: str):
        async def handler(request: Request) -> Response:
            if not authorised(request):
                return error(401, "missing or wrong bearer token")
            async def process() -> dict:
                return await server.handle(server.parse(kind, await read_json(request)))

            try:  # the timeout covers the whole request: reading the body, queueing, scoring
                result = await asyncio.wait_for(process(), cfg.timeout)
            except asyncio.TimeoutError:
                return error(504, f"the request took longer than the server's timeout of {cfg.timeout:g} s")
            except HTTPError as exc:
                return error(exc.status, exc.message)
            except ClientDisconnect:
                return Response(status_code=499)
            except Exception as exc:  # a bug or a failing model: a message, never a dropped connection
                log.exception("request failed")
                return error(500, f"{type(exc).__name__}: {exc}")
            return JSONResponse(result)
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


class ServerHandle:
    """A server running in a background thread (tests, notebooks): ``.url`` and ``.stop()``."""

    def __init__(self, server, thread, url: str):
        self._server, self._thread, self.url = server, thread, url

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)


def serve_in_thread(rewards: Reward | list[Reward], cfg: ServerConfig | None = None, *, host: str = "127.0.0.1",
                    port: int = 0, startup_timeout: float = 30.0) -> ServerHandle:
    """Start uvicorn serving ``rewards`` in a daemon thread (``port=0``: an ephemeral port); returns once it
    accepts connections."""
    import socket
    import threading

    from ._imports import require

    uvicorn = require("uvicorn", "serve")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(rewards, cfg), log_level="warning", lifespan="on"))
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


def app_from_env():
    """App factory for running under an external ASGI server (``uvicorn --factory`` / gunicorn workers):
    ``REWARDKIT_SERVE_REWARD`` (registry name), ``REWARDKIT_SERVE_CONFIG`` (YAML, optional),
    ``REWARDKIT_SERVE_DEVICES`` (comma-separated, one replica each; default ``cpu``) and
    ``REWARDKIT_SERVE_TOKEN`` (optional bearer token)."""
    from .registry import load_reward

    name = os.environ.get("REWARDKIT_SERVE_REWARD")
    if not name:
        raise RuntimeError("set REWARDKIT_SERVE_REWARD to the reward's registry name")
    conf = os.environ.get("REWARDKIT_SERVE_CONFIG") or None
    devices = [d.strip() for d in os.environ.get("REWARDKIT_SERVE_DEVICES", "cpu").split(",") if d.strip()]
    rewards = load_replicas(name, conf, {}, devices)
    return create_app(rewards, ServerConfig(token=os.environ.get("REWARDKIT_SERVE_TOKEN") or None))


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
