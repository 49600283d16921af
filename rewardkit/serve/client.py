"""``RemoteReward``: a reward served by ``rewardkit serve``, used like any local :class:`~rewardkit.Reward`.

    >>> reward = RemoteReward(url="http://127.0.0.1:8000")          # or load_reward("remote", url=...)
    >>> out = reward(images, "a corgi astronaut")                    # the same call, the same RewardOutput

Inputs are validated and normalised locally by the base class (bad samples fail or go NaN before anything
is sent); the canonical RGB pixels travel as raw uint8 (``encoding="raw"``, no compression cost) or PNG.
A float ``[B, 3, H, W]`` tensor sent to a reward with a tensor path (``supports_tensor_input`` in ``/info``)
travels as it is, float32 / float16 / bfloat16 bytes, so served scores equal in-process scores bit for bit.
The reward's metadata (name, tasks, dimensions, scale) is read from the server's ``/info``.

``timeout`` bounds each HTTP request as a whole (connect, upload, scoring, download), not each socket read;
the thread doing the request stops with it (a server dripping its answer cannot keep it reading);
connection errors, 429, 502, 503 and 504 are retried ``max_retries`` times with exponential backoff (a
``Retry-After`` header is honoured, capped at ``max_backoff``), and so is a 500 that is not the server's own
JSON error (it comes from a proxy in front of it, e.g. Ray Serve's when a replica died mid-request: scoring is
idempotent, so sending it again is safe); other 4xx / 5xx answers raise at once with the server's message.
A response that is not the documented shape raises: no score is ever made up.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import RewardkitError
from ..reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput

__all__ = ["RemoteReward", "RemoteRewardConfig", "RemoteRewardError"]

_RETRY_STATUS = frozenset({429, 502, 503, 504})


class RemoteRewardError(RewardkitError, RuntimeError):
    """The reward server could not be reached, refused the request or answered something malformed."""


class _Deadline(Exception):
    """A pool thread's request ran past the call's deadline (it stops reading; the call reports a timeout)."""


@dataclass
class RemoteRewardConfig(RewardConfig):
    #: the server, or several replicas of one served reward: a list or a comma-separated string. Requests go
    #: round-robin over them, and a request that fails on one (connection error, 429/502/503/504, a proxy's 500,
    #: timeout) is retried on the next; every replica must answer /info at start and serve the same reward and options
    url: Any = "http://127.0.0.1:8000"
    #: bearer token; default: the ``REWARDKIT_SERVE_TOKEN`` environment variable
    token: str | None = None
    #: seconds for one whole HTTP request (connect + upload + scoring + download)
    timeout: float = 120.0
    max_retries: int = 3
    max_backoff: float = 30.0
    #: "raw" (uint8 pixels, fastest on a LAN) or "png" (lossless, smaller on slow links)
    encoding: str = "raw"
    #: request body: "binary" (a small JSON header + the images' bytes, no base64; used when the server's
    #: /info lists it) or "json" (every image base64 in the JSON body)
    wire: str = "binary"
    #: images per request (the base class chunks larger calls)
    batch_size: int = 64
    max_response_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        parse_urls(self.url)  # refuses an empty or malformed list here, before any connection
        if self.encoding not in ("raw", "png"):
            raise ValueError(f"encoding must be 'raw' or 'png', got {self.encoding!r}")
        if self.wire not in ("binary", "json"):
            raise ValueError(f"wire must be 'binary' or 'json', got {self.wire!r}")
        if not (isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")


def parse_urls(url: Any) -> list[str]:
    """``url`` as a list of base URLs (a string, a comma-separated string or a sequence of strings)."""
    items = url.split(",") if isinstance(url, str) else list(url) if isinstance(url, (list, tuple)) else None
    if items is None or not all(isinstance(u, str) for u in items):
        raise ValueError(f"url must be a URL, a comma-separated string of URLs or a list of URLs, got {url!r}")
    urls = [u.strip().rstrip("/") for u in items if u.strip()]
    if not urls:
        raise ValueError(f"url names no server: {url!r}")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"url {u!r} must start with http:// or https://")
    if len(set(urls)) != len(urls):
        raise ValueError(f"url lists a server twice: {url!r}")
    return urls


# /info fields every replica of one served reward must agree on (the replicas' devices may differ)
_SAME_ON_EVERY_REPLICA = ("reward", "class", "tasks", "dimensions", "higher_is_better", "score_range", "uses_prompt",
                          "scores_empty_prompt", "batch_relative", "compare_is_symmetric", "supports_tensor_input")


def _replica_view(info: dict[str, Any]) -> dict[str, Any]:
    view = {k: info.get(k) for k in _SAME_ON_EVERY_REPLICA}
    config = dict(info.get("config") or {})
    config.pop("device", None)
    view["config"] = config
    return view


# The deadline of the request the current thread is making: (monotonic deadline, stop event), or None.
_CALL = threading.local()


class _DeadlineStream:
    """A network stream whose reads and writes end at the current request's deadline (or when the caller gives
    up): each operation's timeout is cut to the time left, and past it :class:`_Deadline` is raised. httpx's own
    read timeout restarts with every byte, so without this a server dripping its status line and headers
    holds the thread inside ``client.stream(...)`` for as long as it drips."""

    def __init__(self, stream: Any):
        self._stream = stream

    @staticmethod
    def _left(timeout: float | None, slack: float = 0.0) -> float | None:
        call = getattr(_CALL, "value", None)
        if call is None:
            return timeout
        deadline, stop = call
        left = deadline - time.monotonic()
        if left <= slack or stop.is_set():
            raise _Deadline()
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        import httpcore

        try:
            return self._stream.read(max_bytes, self._left(timeout))
        except httpcore.ReadTimeout:
            self._left(None, slack=0.05)  # raises _Deadline when the deadline is what cut the read short
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        import httpcore

        try:
            return self._stream.write(buffer, self._left(timeout))
        except httpcore.WriteTimeout:
            self._left(None, slack=0.05)
            raise

    def start_tls(self, *args: Any, **kwargs: Any) -> Any:
        return _DeadlineStream(self._stream.start_tls(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # close, get_extra_info
        return getattr(self._stream, name)


class _DeadlineBackend:
    """httpcore's network backend with every stream a :class:`_DeadlineStream`."""

    def __init__(self, backend: Any):
        self._backend = backend

    def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
        return _DeadlineStream(self._backend.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        return _DeadlineStream(self._backend.connect_unix_socket(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # sleep
        return getattr(self._backend, name)


def _bounded_transport(httpx: Any) -> Any:
    """An ``httpx.HTTPTransport`` whose connections honour the calling thread's request deadline."""
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:  # another httpx / httpcore layout: say so (the call still returns at its deadline)
        import warnings

        warnings.warn("this httpx / httpcore version does not expose its network backend: a RemoteReward pool "
                      "thread may outlive a timed-out call while the server drips its answer", RuntimeWarning)
        return transport
    pool._network_backend = _DeadlineBackend(backend)
    return transport


def image_bytes(im: Any, encoding: str) -> tuple[dict, bytes]:
    """A canonical RGB PIL image, or a float ``[3, H, W]`` tensor (the tensor path), -> (descriptor, bytes)
    of the binary body (:mod:`rewardkit.serve.binary`). Floats travel losslessly: little-endian bytes of their
    own dtype."""
    if isinstance(im, torch.Tensor):
        t = im.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
        elif t.dtype in (torch.float32, torch.float16):
            raw = t.numpy().astype("<f4" if t.dtype == torch.float32 else "<f2").tobytes()
        else:  # float64 and others: float32 is what every tensor path computes in at most
            t = t.float()
            raw = t.numpy().astype("<f4").tobytes()
        return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}, raw
    if encoding == "png":
        buf = io.BytesIO()
        im.save(buf, format="PNG", compress_level=1)
        raw = buf.getvalue()
        return {"encoded": len(raw)}, raw
    arr = np.asarray(im, dtype=np.uint8)
    return {"shape": list(arr.shape), "dtype": "uint8"}, arr.tobytes()


def encode_image(im: Any, encoding: str) -> Any:
    """A canonical RGB PIL image, or a float ``[3, H, W]`` tensor (the tensor path), -> its JSON wire form (see
    :mod:`rewardkit.serve.wire`): the bytes of :func:`image_bytes`, base64-encoded."""
    desc, raw = image_bytes(im, encoding)
    if "encoded" in desc:
        return base64.b64encode(raw).decode("ascii")
    return {"data": base64.b64encode(raw).decode("ascii"), **desc}


class RemoteReward(Reward):
    """A reward served over HTTP by ``rewardkit serve``, called like an in-process one (docs/serve.md)."""

    name = "remote"
    tasks = frozenset({"t2i", "edit", "multi_ref"})  # replaced by the server's on first contact
    thread_safe = True  # one pooled HTTP client, safe across threads; the server batches concurrent calls
    Config = RemoteRewardConfig
    extras = ("serve",)

    def __init__(self, config: Any = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._http = None
        self._http_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._tls = threading.local()
        self._token = self.config.token or os.environ.get("REWARDKIT_SERVE_TOKEN") or None
        self.urls = parse_urls(self.config.url)
        self._next = 0  # round-robin position over self.urls
        info = self.server_info()
        if len(self.urls) > 1:
            self._check_replicas(info)
        self.remote_name = info["reward"]
        self.tasks = frozenset(info["tasks"])
        self.dimensions = tuple(info["dimensions"])
        self.higher_is_better = bool(info["higher_is_better"])
        self.score_range = None if info["score_range"] is None else tuple(info["score_range"])
        self.uses_prompt = bool(info["uses_prompt"])
        # the served reward's empty-prompt rule, so the client does not refuse what the server would score
        self.scores_empty_prompt = bool(info.get("scores_empty_prompt", False))
        self.batch_relative = bool(info["batch_relative"])
        self.compare_is_symmetric = bool(info.get("compare_is_symmetric", False))
        self._tensor_input = bool(info.get("supports_tensor_input", False))
        # the binary body when asked for and the server takes it (an older server: JSON)
        self._binary = self.config.wire == "binary" and "binary" in (info.get("wire_formats") or ())
        self.default_batch_size = self.config.batch_size

    @property
    def supports_tensor_input(self) -> bool:
        """The served reward's: float ``[B, 3, H, W]`` tensors are then sent as floats, not rounded to uint8."""
        return getattr(self, "_tensor_input", False)

    # ------------------------------------------------------------------ HTTP
    def _client(self):
        from .._imports import require

        httpx = require("httpx", "serve")
        with self._http_lock:
            if self._http is None:
                headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
                # Per-operation timeouts are the whole budget; the whole-request deadline is enforced in _request.
                self._http = httpx.Client(headers=headers,
                                          timeout=httpx.Timeout(self.config.timeout),
                                          transport=_bounded_transport(httpx))
                self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="rewardkit-remote")
            return self._http

    def _check_replicas(self, first: dict[str, Any]) -> None:
        """Every replica answers /info and serves the same reward with the same options (else a call's scores
        would depend on which replica took it)."""
        want = _replica_view(first)
        for url in self.urls[1:]:
            other = self._request("GET", "/info", base=url)
            got = _replica_view(other) if isinstance(other, dict) else None
            if got != want:
                diff = sorted(k for k in want if got is None or got.get(k) != want[k])
                raise RemoteRewardError(f"{url} does not serve the same reward as {self.urls[0]} (differs in: "
                                        f"{', '.join(diff)}); replicas must be started with the same reward and "
                                        "options")

    def _pick(self) -> int:
        with self._http_lock:
            i = self._next
            self._next = (i + 1) % len(self.urls)
        return i

    def _once(self, method: str, path: str, body: Any, deadline: float,
              stop: threading.Event) -> tuple[int, dict[str, str], bytes]:
        """One HTTP exchange, in a pool thread. Every socket operation is bounded by the time left until
        ``deadline``, and the response is read only until then (or until the caller gives up: ``stop``), so
        the thread ends with the call even when the server drips its answer one byte at a time."""
        from .binary import CONTENT_TYPE

        client = self._client()
        binary = isinstance(body, bytes)
        content = body if binary or body is None else json.dumps(body, allow_nan=False).encode()
        left = max(deadline - time.monotonic(), 0.001)
        ctype = CONTENT_TYPE if binary else "application/json"
        _CALL.value = (deadline, stop)  # every socket read and write of this thread stops at the deadline
        try:
            return self._exchange(client, method, path, content, left, deadline, stop, ctype)
        finally:
            _CALL.value = None

    def _exchange(self, client: Any, method: str, path: str, content: bytes | None, left: float,
                  deadline: float, stop: threading.Event,
                  ctype: str = "application/json") -> tuple[int, dict[str, str], bytes]:
        import httpx

        with client.stream(method, path, content=content, timeout=httpx.Timeout(left),
                           headers={"Content-Type": ctype} if content is not None else None) as r:
            data, size = [], 0
            for chunk in r.iter_bytes():
                if stop.is_set() or time.monotonic() > deadline:
                    raise _Deadline()
                size += len(chunk)
                if size > self.config.max_response_bytes:
                    raise RemoteRewardError(f"response over {self.config.max_response_bytes:,} bytes")
                data.append(chunk)
            return r.status_code, dict(r.headers), b"".join(data)

    def _request(self, method: str, path: str, body: Any = None, base: str | None = None) -> Any:
        """One logical request with whole-request timeouts and bounded retries; returns the parsed JSON. With
        several replicas, requests go round-robin and each retry goes to the next replica (``base``: this one)."""
        import httpx

        self._client()
        last = None
        start = self._pick() if base is None else 0
        for attempt in range(self.config.max_retries + 1):
            url = base or self.urls[(start + attempt) % len(self.urls)]
            stop = threading.Event()
            fut = self._pool.submit(self._once, method, url + path, body, time.monotonic() + self.config.timeout,
                                    stop)
            try:
                status, headers, data = fut.result(timeout=self.config.timeout)
            except (FutureTimeout, _Deadline):
                stop.set()  # the pool thread stops reading at its next chunk
                fut.cancel()
                last = f"{url}: no complete answer within {self.config.timeout:g} s"
                retry_after = None
            except (httpx.TransportError, ConnectionError) as exc:
                last = f"{url}: {type(exc).__name__}: {exc}"
                retry_after = None
            else:
                if status == 200:
                    try:
                        return json.loads(data)
                    except (UnicodeDecodeError, json.JSONDecodeError):
                        raise RemoteRewardError(f"{method} {path}: the server's answer is not JSON") from None
                message = _error_message(data)
                if status not in _RETRY_STATUS and not _proxy_failure(status, data):
                    raise RemoteRewardError(f"{method} {path}: HTTP {status}: {message}")
                last = f"{url}: HTTP {status}: {message}"
                retry_after = _retry_after(headers)
            if attempt == self.config.max_retries:
                break
            if base is None and (attempt + 1) % len(self.urls):
                continue  # a replica not tried yet for this request takes the retry at once
            delay = min(self.config.max_backoff, retry_after if retry_after is not None
                        else 0.25 * 2 ** attempt * (1 + 0.25 * random.random()))
            time.sleep(delay)
        raise RemoteRewardError(f"{method} {path} on {base or ', '.join(self.urls)} failed after "
                                f"{self.config.max_retries + 1} attempts: {last}")

    def server_info(self) -> dict[str, Any]:
        """The first server's /info (with several replicas, ``_check_replicas`` compares the others to it)."""
        info = self._request("GET", "/info", base=self.urls[0])
        required = ("reward", "tasks", "dimensions", "higher_is_better", "score_range", "uses_prompt",
                    "batch_relative")
        if not isinstance(info, dict) or any(k not in info for k in required):
            raise RemoteRewardError(f"{self.urls[0]}/info is not a rewardkit server's answer")
        return info

    # ------------------------------------------------------------------ Reward
    def _body(self, images: dict[str, Any], batch: RewardBatch) -> dict[str, Any] | bytes:
        """The request body for ``images`` (``{"images": ...}`` or ``images_a`` / ``images_b``; a tensor: its
        rows) with ``batch``'s prompts, sources and metadata: binary bytes or a JSON object."""
        from .binary import pack_body

        enc = self.config.encoding
        fields: dict[str, Any] = {"prompt": list(batch.prompts) if self.uses_prompt else None}
        if any(batch.metadata):
            fields["metadata"] = [m or None for m in batch.metadata]
        if self._binary:
            srcs = None if batch.sources is None else \
                [[image_bytes(s, enc) for s in entry] for entry in batch.sources]
            return pack_body(fields, {k: [image_bytes(x, enc) for x in v] for k, v in images.items()}, srcs)
        body = {k: [encode_image(x, enc) for x in v] for k, v in images.items()}
        body.update(fields)
        if batch.sources is not None:
            body["sources"] = [[encode_image(s, enc) for s in srcs] for srcs in batch.sources]
        return body

    def _payload(self, batch: RewardBatch) -> dict[str, Any] | bytes:
        return self._body({"images": batch.images}, batch)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        res = self._request("POST", "/score", self._payload(batch))
        return _output_from_json(res, len(batch), self.dimensions)

    def compare(self, images_a: Any, images_b: Any, prompt: str | Sequence[str] | None = None, *,
                sources: Sequence[Any] | None = None, metadata: Sequence[dict[str, Any] | None] | None = None,
                batch_size: int | None = None, on_error: str = "raise") -> PairwiseOutput:
        """The server's ``compare`` (a judge's native pairwise question where it has one). Inputs are
        validated locally first, exactly as a local reward's ``__call__`` does."""
        from .. import media

        a, b = media.split_batch(images_a), media.split_batch(images_b)
        if len(a) != len(b):
            from ..errors import RewardInputError

            raise RewardInputError(f"compare got {len(a)} images_a but {len(b)} images_b")
        n = len(a)
        # Normalise both sides through the base class's input checks (errors named per sample, on_error
        # honoured), capturing the canonical batches instead of scoring them; then send the pairs valid on
        # both sides in one /compare request.
        errors: list[str | None] = [None] * n
        canon = {}
        for side, imgs in (("a", a), ("b", b)):
            captured: list[RewardBatch] = []
            self._tls.capture = captured
            try:
                out = Reward.__call__(self, imgs, prompt, sources=sources, metadata=metadata,
                                      batch_size=max(n, 1), on_error=on_error)
            finally:
                self._tls.capture = None
            canon[side] = captured[0] if captured else RewardBatch(images=[], prompts=[])
            for i in range(n):
                if not bool(out.valid[i]) and errors[i] is None:
                    errors[i] = f"{side}: {out.errors[i]}"
        ok = [i for i in range(n) if errors[i] is None]
        prob = torch.full((n,), float("nan"))
        valid = torch.zeros(n, dtype=torch.bool)
        rats = None
        info: dict[str, Any] = {}
        if ok:
            pos_a = {idx: j for j, idx in enumerate(canon["a"].indices)}
            pos_b = {idx: j for j, idx in enumerate(canon["b"].indices)}
            ba, bb = canon["a"].select([pos_a[i] for i in ok]), canon["b"].select([pos_b[i] for i in ok])
            res = self._request("POST", "/compare", self._body({"images_a": ba.images, "images_b": bb.images}, ba))
            pair = _pair_from_json(res, len(ok))
            idx = torch.tensor(ok)
            prob[idx] = pair.prob_a
            valid[idx] = pair.valid
            for j, i in enumerate(ok):
                errors[i] = pair.errors[j]
            if pair.rationales is not None:
                rats = [None] * n
                for j, i in enumerate(ok):
                    rats[i] = pair.rationales[j]
            info = pair.info
        return PairwiseOutput(prob_a=prob, valid=valid, errors=errors, rationales=rats, info=info)

    def _run(self, sub: RewardBatch) -> RewardOutput:
        captured = getattr(self._tls, "capture", None)
        if captured is not None:  # compare() normalising its inputs (this thread): keep the batch, send nothing
            captured.append(sub)
            return RewardOutput(scores=torch.zeros(len(sub)))
        return super()._run(sub)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for k in ("_http", "_http_lock", "_pool", "_tls"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._http, self._pool, self._http_lock, self._tls = None, None, threading.Lock(), threading.local()

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    @classmethod
    def tiny(cls, workdir: str) -> "RemoteReward":
        """A client of a tiny CLIP reward served in a background thread on 127.0.0.1 (an ephemeral port)."""
        from ..registry import load_reward
        from .server import ServerConfig, serve_in_thread
        from ..testing import save_tiny_checkpoint

        path = save_tiny_checkpoint("clip", os.path.join(workdir, "remote-tiny-clip"))
        handle = serve_in_thread(load_reward("clipscore", model=str(path)), ServerConfig(max_wait_ms=2.0))
        return cls(url=handle.url, timeout=60.0)


def _error_message(data: bytes) -> str:
    try:
        obj = json.loads(data)
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            return obj["error"][:2000]
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    return data[:200].decode("utf-8", "replace")


def _proxy_failure(status: int, data: bytes) -> bool:
    """A 500 without the server's JSON ``{"error": ...}``: the request failed in a proxy in front of the server
    (Ray Serve answers a request whose replica died with a plain-text 500), not in the reward; worth a retry."""
    if status != 500:
        return False
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True
    return not (isinstance(obj, dict) and isinstance(obj.get("error"), str))


def _retry_after(headers: dict[str, str]) -> float | None:
    value = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    try:
        v = float(value) if value is not None else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) and v >= 0 else None


def _floats(values: Any, n: int, what: str) -> torch.Tensor:
    if not isinstance(values, list) or len(values) != n:
        raise RemoteRewardError(f"malformed answer: '{what}' is not a list of {n} values")
    out = []
    for v in values:
        if v is None:
            out.append(float("nan"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
        else:
            raise RemoteRewardError(f"malformed answer: '{what}' holds {v!r}")
    return torch.tensor(out, dtype=torch.float32)


def _common(res: Any, n: int) -> tuple[torch.Tensor, list[str | None], list[str | None] | None]:
    if not isinstance(res, dict):
        raise RemoteRewardError("malformed answer: not a JSON object")
    valid = res.get("valid")
    if not isinstance(valid, list) or len(valid) != n or not all(isinstance(v, bool) for v in valid):
        raise RemoteRewardError(f"malformed answer: 'valid' is not a list of {n} booleans")
    errors = res.get("errors")
    if not isinstance(errors, list) or len(errors) != n or not all(e is None or isinstance(e, str) for e in errors):
        raise RemoteRewardError(f"malformed answer: 'errors' is not a list of {n} strings / nulls")
    rats = res.get("rationales")
    if rats is not None and (not isinstance(rats, list) or len(rats) != n):
        raise RemoteRewardError("malformed answer: 'rationales'")
    return torch.tensor(valid, dtype=torch.bool), errors, rats


def _output_from_json(res: Any, n: int, dimensions: Sequence[str]) -> RewardOutput:
    valid, errors, rats = _common(res, n)
    scores = _floats(res.get("scores"), n, "scores")
    dims_raw = res.get("dimensions") or {}
    if not isinstance(dims_raw, dict):
        raise RemoteRewardError("malformed answer: 'dimensions' is not an object")
    dims = {str(k): _floats(v, n, f"dimensions.{k}") for k, v in dims_raw.items()}
    # A sample the server marked valid must carry a finite score (RewardOutput turns NaN into invalid).
    errors = [e if (not v or math.isfinite(float(s))) else "server marked a NaN score valid"
              for e, v, s in zip(errors, valid.tolist(), scores.tolist())]
    details = res.get("details")
    if details is not None and (not isinstance(details, list) or len(details) != n):
        raise RemoteRewardError("malformed answer: 'details'")
    info = res.get("info") if isinstance(res.get("info"), dict) else {}
    return RewardOutput(scores=scores, valid=valid, errors=errors, dimensions=dims, rationales=rats,
                        info=dict(info), details=details)


def _pair_from_json(res: Any, n: int) -> PairwiseOutput:
    valid, errors, rats = _common(res, n)
    prob = _floats(res.get("prob_a"), n, "prob_a")
    fin = prob[torch.isfinite(prob)]
    if bool(((fin < 0) | (fin > 1)).any()):
        raise RemoteRewardError("malformed answer: 'prob_a' outside [0, 1]")
    info = res.get("info") if isinstance(res.get("info"), dict) else {}
    return PairwiseOutput(prob_a=prob, valid=valid, errors=errors, rationales=rats, info=dict(info))
