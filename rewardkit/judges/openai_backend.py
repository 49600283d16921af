"""Judge backend on any OpenAI-compatible chat-completions endpoint (``vllm serve``, sglang, hosted APIs).

Images are sent inline as base64 PNG data URLs, in conversation order. Requests run on a thread pool
(``concurrency`` at a time) over one ``httpx.Client``; 429, 5xx, timeouts and connection errors are retried
with exponential backoff (``Retry-After`` honoured), other 4xx fail at once with the server's message.

``choice_probs`` asks for one token with log-probabilities and renormalises over the choices:

- on a **vLLM** server (detected from its ``/version`` endpoint, or ``server="vllm"``), the choices' exact
  token ids come from its ``/tokenize`` endpoint and are requested with ``logprob_token_ids`` (answers keyed
  by id through ``return_tokens_as_token_ids``): every choice's probability is exact whatever its rank; a
  row where the server reports no log-probability for a choice is NaN;
- elsewhere, from the ``top_logprobs`` alternatives, matched by the exact token text (``"Yes"`` is never
  read from ``" Yes"``). A choice absent from the top list gets probability 0 (its true log-prob is below
  the smallest listed one: the error is bounded by that value, see ``describe()["top_logprobs"]``); a row
  where no choice is listed is NaN.

A server that returns no log-probabilities raises :class:`JudgeServerError` saying so.

Sampling: every field is sent explicitly (``temperature``, ``top_p=1``, no penalties; on vLLM also
``top_k=-1``, ``min_p=0``, ``repetition_penalty=1``), because ``vllm serve`` fills omitted fields from the
checkpoint's ``generation_config`` (some Qwen-VL configs set ``top_k=1``, which makes every sample
identical). Start vLLM with ``--generation-config vllm`` as well. Greedy requests (temperature 0) with
``n > 1`` ask for one completion and replicate it: vLLM refuses ``n > 1`` at temperature 0.

Prefix reuse is the server's job (vLLM: ``--enable-prefix-caching``, on by default in recent versions).
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .base import ChoiceError, Conversation, JudgeBackend

__all__ = ["OpenAIJudge", "JudgeServerError", "to_openai_messages"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


class JudgeServerError(RuntimeError):
    """The judge server failed (after retries), answered garbage, or lacks a needed feature."""


def _image_url(im: Any) -> str:
    from ..media import _to_pil

    buf = io.BytesIO()
    _to_pil(im).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def to_openai_messages(conv: Conversation, cache: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """HF-style messages with embedded PIL images -> OpenAI chat messages (images as data URLs)."""
    out = []
    for msg in conv:
        content = msg.get("content")
        if isinstance(content, str) or content is None:
            out.append({"role": msg["role"], "content": content or ""})
            continue
        parts = []
        for c in content:
            if isinstance(c, dict) and (c.get("type") == "image" or "image" in c):
                im = c["image"]
                key = id(im)
                if cache is not None and key in cache:
                    url = cache[key]
                else:
                    url = _image_url(im)
                    if cache is not None:
                        cache[key] = url
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif isinstance(c, dict) and c.get("type") == "text":
                parts.append({"type": "text", "text": c["text"]})
            else:
                raise ValueError(f"unsupported content item {c!r}")
        out.append({"role": msg["role"], "content": parts})
    return out


class OpenAIJudge(JudgeBackend):
    """A judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name (required).
        api_key: bearer token; default ``$OPENAI_API_KEY`` (or none).
        concurrency: requests in flight at once.
        timeout: seconds per request.
        max_retries: retries after the first attempt for retryable failures.
        backoff: first backoff in seconds (doubled each retry, with jitter; capped at 30 s).
        top_logprobs: alternatives requested for ``choice_probs`` (servers cap it, often at 20).
        check_tokens: ask the server's ``/tokenize`` endpoint (vLLM, sglang) that each choice is one token;
            skipped silently when the server has no such endpoint.
        server: ``"auto"`` (ask ``/version``: a vLLM server answers it), ``"vllm"`` or ``"openai"`` (any
            other OpenAI-compatible API: only standard fields are sent).
    """

    kind = "openai"

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 concurrency: int = 8, timeout: float = 120.0, max_retries: int = 4, backoff: float = 0.5,
                 top_logprobs: int = 20, check_tokens: bool = True, extra_body: dict[str, Any] | None = None,
                 server: str = "auto") -> None:
        from .._imports import require

        httpx = require("httpx", "judge")
        if not model:
            raise ValueError("the openai judge backend needs model=<served model name>")
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("concurrency >= 1, max_retries >= 0 and timeout > 0 are required")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency, self.timeout, self.max_retries, self.backoff = concurrency, timeout, max_retries, backoff
        self.top_logprobs, self.check_tokens = int(top_logprobs), check_tokens
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._httpx = httpx
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers,
                                    limits=httpx.Limits(max_connections=concurrency))
        if server not in ("auto", "vllm", "openai"):
            raise ValueError(f"server must be 'auto', 'vllm' or 'openai', got {server!r}")
        self._server = server
        self._checked: dict[tuple[str, ...], list[int] | None] = {}
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {"requests": 0, "retries": 0}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "base_url": self.base_url, "model": self.model, "top_logprobs": self.top_logprobs,
                "server": self._server}

    @property
    def is_vllm(self) -> bool:
        """True for a vLLM server (``server="vllm"``, or ``"auto"`` and ``GET /version`` answers a version)."""
        if self._server == "auto":
            kind = "openai"
            try:
                resp = self._client.get(self.base_url.rsplit("/v1", 1)[0] + "/version")
                if resp.status_code == 200 and isinstance(resp.json(), dict) and "version" in resp.json():
                    kind = "vllm"
            except (self._httpx.HTTPError, ValueError):
                pass
            self._server = kind
        return self._server == "vllm"

    def _sampling_fields(self, temperature: float) -> dict[str, Any]:
        """Every field that changes sampling, explicitly: servers fill omitted ones from their own defaults
        (``vllm serve``: the checkpoint's generation_config)."""
        body = {"temperature": temperature, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        if self.is_vllm:
            body.update(top_k=-1, min_p=0.0, repetition_penalty=1.0)
        return body

    def close(self) -> None:
        self._client.close()

    def __getstate__(self):
        raise TypeError("OpenAIJudge holds an HTTP client and cannot be pickled; pass the spec string instead")

    # ------------------------------------------------------------------ HTTP
    def _post(self, path: str, body: dict[str, Any], *, root: bool = False) -> dict[str, Any]:
        url = (self.base_url.rsplit("/v1", 1)[0] if root else self.base_url) + path
        httpx = self._httpx
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
            try:
                with self._lock:
                    self.stats["requests"] += 1
                resp = self._client.post(url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                self._sleep(attempt, None)
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                self._sleep(attempt, resp.headers.get("retry-after"))
                continue
            if resp.status_code >= 400:
                msg = resp.text[:500]
                if "logprob" in msg.lower():
                    raise JudgeServerError(f"{url} rejected a log-probability request (HTTP {resp.status_code}): "
                                           f"{msg}. choice_probs needs a server with logprobs support "
                                           "(vLLM: --max-logprobs >= top_logprobs)")
                raise JudgeServerError(f"{url} answered HTTP {resp.status_code}: {msg}")
            try:
                data = resp.json()
                if not isinstance(data, dict) or not isinstance(data.get("choices", []), list):
                    raise ValueError("not a completion object")
                return data
            except (ValueError, json.JSONDecodeError) as exc:
                last = f"unreadable response ({exc}): {resp.text[:300]!r}"
                self._sleep(attempt, None)
                continue
        raise JudgeServerError(f"{url} failed after {self.max_retries + 1} attempts; last error: {last}")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        if attempt >= self.max_retries:
            return
        delay = min(30.0, self.backoff * (2 ** attempt)) * (0.5 + random.random() / 2)
        if retry_after:
            try:
                delay = max(delay, min(60.0, float(retry_after)))
            except ValueError:
                pass
        time.sleep(delay)

    def _map(self, fn, items: list) -> list:
        if len(items) <= 1 or self.concurrency == 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    # ------------------------------------------------------------------ protocol
    def generate(self, conversations: Sequence[Conversation], *, n: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 256, stop: Sequence[str] | None = None,
                 seed: int | None = None) -> list[list[str]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        cache: dict[int, str] = {}
        msgs = [to_openai_messages(c, cache) for c in conversations]

        greedy = temperature < _GREEDY_EPS
        sampling = self._sampling_fields(0.0 if greedy else temperature)
        want = 1 if greedy else n  # vLLM refuses n > 1 at temperature 0; greedy gives one answer anyway

        def one(m):
            texts: list[str] = []
            for _ in range(want):  # servers that ignore n return fewer choices: ask again for the rest
                body = {"model": self.model, "messages": m, "n": want - len(texts), **sampling,
                        "max_tokens": max_new_tokens, **self.extra_body}
                if stop:
                    body["stop"] = list(stop)
                if seed is not None and not greedy:
                    body["seed"] = seed + len(texts)
                data = self._post("/chat/completions", body)
                try:
                    got = [c["message"]["content"] or "" for c in data["choices"]]
                except (KeyError, TypeError) as exc:
                    raise JudgeServerError(f"completion without message content: {json.dumps(data)[:300]}") from exc
                if not got:
                    raise JudgeServerError(f"completion with no choices: {json.dumps(data)[:300]}")
                texts += got
                if len(texts) >= want:
                    break
            return texts[:want] * n if greedy else texts[:n]

        return self._map(one, msgs)

    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        import torch

        if not choices or len(set(choices)) != len(choices):
            raise ChoiceError(f"choices must be distinct and non-empty, got {list(choices)}")
        ids = self._check_single_tokens(tuple(choices))
        exact_ids = ids is not None and self.is_vllm
        sampling = self._sampling_fields(0.0)
        cache: dict[int, str] = {}
        msgs = [to_openai_messages(c, cache) for c in conversations]

        def one(m):
            body = {"model": self.model, "messages": m, "max_tokens": 1, **sampling,
                    "logprobs": True, "top_logprobs": self.top_logprobs, **self.extra_body}
            if exact_ids:  # vLLM: the exact log-prob of each choice id, keyed by id in the answer
                body.update(top_logprobs=len(ids), logprob_token_ids=list(ids), return_tokens_as_token_ids=True)
            data = self._post("/chat/completions", body)
            try:
                lp = data["choices"][0].get("logprobs")
                content = None if lp is None else lp.get("content")
                if not content:
                    raise JudgeServerError(
                        f"{self.base_url} returned no log-probabilities: the server (or model) does not support "
                        "logprobs/top_logprobs, which choice_probs needs")
                top = content[0].get("top_logprobs") or []
                table: dict[str, float] = {}
                for alt in top:  # exact token text (or "token_id:N"): never merge " Yes" into "Yes"
                    table.setdefault(str(alt["token"]), float(alt["logprob"]))
            except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
                raise JudgeServerError(f"unreadable logprobs in {json.dumps(data)[:300]}") from exc
            if exact_ids:
                row = [table.get(f"token_id:{t}") for t in ids]
                return row if all(x is not None for x in row) else [None] * len(ids)  # missing: NaN row
            return [table.get(c) for c in choices]

        rows = self._map(one, msgs)
        out = torch.full((len(rows), len(choices)), float("nan"))
        for i, row in enumerate(rows):
            present = [x for x in row if x is not None]
            if not present:
                continue  # none of the choices among the top alternatives: NaN row (the caller marks it invalid)
            lps = torch.tensor([x if x is not None else float("-inf") for x in row], dtype=torch.float64)
            out[i] = torch.softmax(lps, dim=0).float()
        return out

    def _check_single_tokens(self, choices: tuple[str, ...]) -> list[int] | None:
        """Each choice's token id per the server's ``/tokenize`` (vLLM, sglang); :class:`ChoiceError` when a
        choice is not one token; None when the server has no such endpoint (or ``check_tokens=False``)."""
        if not self.check_tokens:
            return None
        if choices in self._checked:
            return self._checked[choices]
        bad, ids = [], []
        for c in choices:
            try:
                resp = self._client.post(self.base_url.rsplit("/v1", 1)[0] + "/tokenize",
                                         json={"model": self.model, "prompt": c, "add_special_tokens": False})
            except self._httpx.HTTPError:
                ids = None
                break
            if resp.status_code != 200:
                ids = None
                break  # no tokenize endpoint: cannot check
            try:
                toks = resp.json().get("tokens")
            except (ValueError, AttributeError):
                ids = None
                break
            if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
                ids = None
                break
            if len(toks) != 1:
                bad.append((c, len(toks)))
            else:
                ids.append(toks[0])
        if bad:
            raise ChoiceError(f"choices {bad} are not single tokens for {self.model} (per the server's /tokenize)")
        if ids is not None and len(set(ids)) != len(ids):
            raise ChoiceError(f"choices {list(choices)} map to repeated token ids {ids}")
        self._checked[choices] = ids
        return ids
