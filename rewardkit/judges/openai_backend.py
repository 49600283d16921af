"""Judge backend on any OpenAI-compatible chat-completions endpoint (``vllm serve``, sglang, hosted APIs).

Images are sent inline as base64 PNG data URLs, in conversation order. Requests run on a thread pool
(``concurrency`` at a time) over one ``httpx.Client``; 429, 5xx, timeouts and connection errors are retried
with exponential backoff (``Retry-After`` honoured, capped at 60 s), other 4xx fail at once with the server's
message.

``timeout`` bounds each whole HTTP request (connect, send, headers and body), not each socket read: every
read gets only the time left before the request's deadline, so a server that drips one byte at a time
cannot hold a call past ``timeout``. Response bodies larger than ``max_response_bytes`` (after content
decoding; default 8 MiB) are refused at once (not retried).

``choice_probs`` asks for one token with log-probabilities and renormalises over the choices
(:func:`read_choice_logprobs`):

- on a **vLLM** server (detected from its ``/version`` endpoint, or ``server="vllm"``), the choices' exact
  token ids come from its ``/tokenize`` endpoint and are requested with ``logprob_token_ids`` (answers keyed
  by id through ``return_tokens_as_token_ids``): every choice's probability is exact whatever its rank; a
  row where the server reports no usable log-probability for a choice is NaN;
- elsewhere, from the ``top_logprobs`` alternatives, matched by the exact token text (``"Yes"`` is never
  read from ``" Yes"``). A choice absent from the top list gets probability 0 (its true log-prob is below
  the smallest listed one: the error is bounded by that value, see ``describe()["top_logprobs"]``).

``raw_choice_probs`` (full-vocabulary probabilities, not renormalised; VQAScore's default) reads the same
response strictly (:func:`read_raw_logprobs`): exact on a vLLM server; elsewhere a choice absent from the top
alternatives has an unknown probability and its row is NaN + reason (never 0, never the bound), and any
malformed, duplicated, NaN / positive, or over-unity (summing above 1) log-probability is NaN + reason. A
response without any log-probabilities (the server or model does not support them) fails the request, as in
``choice_probs``.

A row where no choice is listed, where a listed choice's log-prob is NaN / +inf / positive (off-scale), or
where every listed choice is ``-inf`` is NaN (no usable probability: the rewards report that question
unanswered). A server that returns no log-probabilities at all, or a malformed log-prob structure, raises
:class:`JudgeServerError` saying so.

Sampling: every field is sent explicitly (``temperature``, ``top_p=1``, no penalties; on vLLM also
``top_k=-1``, ``min_p=0``, ``repetition_penalty=1``), because ``vllm serve`` fills omitted fields from the
checkpoint's ``generation_config`` (some Qwen-VL configs set ``top_k=1``, which makes every sample
identical). Start vLLM with ``--generation-config vllm`` as well. Greedy requests (temperature 0) with
``n > 1`` ask for one completion and replicate it: vLLM refuses ``n > 1`` at temperature 0.

Prefix reuse is the server's job (vLLM: ``--enable-prefix-caching``, on by default in recent versions).

The wire format (messages out, log-probability readers) is in :mod:`rewardkit.judges.openai_wire` and the
request deadline in :mod:`rewardkit.judges._http_deadline`; their public names are importable from here.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .base import ChoiceError, Conversation, JudgeBackend, check_choices, check_temperature, continues_final_message
from ._http_deadline import _deadline_transport, _local
# the wire format (messages out, log-probabilities in) lives beside the backend; its names stay importable here
from .openai_wire import (_NO_LOGPROBS, JudgeServerError, _image_url, implausible_logprobs,  # noqa: F401
                          read_choice_logprobs, read_raw_logprobs, to_openai_messages)

__all__ = ["OpenAIJudge", "JudgeServerError", "to_openai_messages", "read_choice_logprobs", "read_raw_logprobs"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


class _TooLarge(Exception):
    pass


class OpenAIJudge(JudgeBackend):
    """A judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name (required).
        api_key: bearer token; default ``$OPENAI_API_KEY`` (or none).
        concurrency: requests in flight at once.
        timeout: seconds one HTTP request may take in all (connect + send + headers + body), not per read.
        max_retries: retries after the first attempt for retryable failures (each attempt gets ``timeout``).
        max_response_bytes: largest response body accepted (decoded), default 8 MiB; a larger one fails at once.
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
                 max_response_bytes: int = 8 * 1024 * 1024, server: str = "auto") -> None:
        from .._imports import require

        httpx = require("httpx", "judge")
        if not model:
            raise ValueError("the openai judge backend needs model=<served model name>")
        if concurrency < 1 or max_retries < 0 or not timeout > 0 or not max_response_bytes >= 1:
            raise ValueError("concurrency >= 1, max_retries >= 0, timeout > 0 and max_response_bytes >= 1 are required")
        self.max_response_bytes = int(max_response_bytes)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency, self.timeout, self.max_retries, self.backoff = concurrency, timeout, max_retries, backoff
        self.top_logprobs, self.check_tokens = int(top_logprobs), check_tokens
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._httpx = httpx
        limits = httpx.Limits(max_connections=concurrency)
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers, limits=limits,
                                    transport=_deadline_transport(httpx, limits))
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
            try:  # bounded like every request: the deadline (timeout) and max_response_bytes
                status, _, raw = self._send(self.base_url.rsplit("/v1", 1)[0] + "/version", None, method="GET")
                data = json.loads(raw) if status == 200 else None
                if isinstance(data, dict) and "version" in data:
                    kind = "vllm"
            except (self._httpx.HTTPError, _TooLarge, ValueError, RecursionError):
                pass
            self._server = kind
        return self._server == "vllm"

    def _sampling_fields(self, temperature: float) -> dict[str, Any]:
        """Every field that changes sampling, explicitly: servers fill omitted ones from their own defaults
        (``vllm serve``: the checkpoint's generation_config)."""
        body = {"temperature": temperature, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        if self.is_vllm:
            body.update(top_k=-1, min_p=0.0, repetition_penalty=1.0, skip_special_tokens=True)
        return body

    def _template_fields(self, conv: Conversation) -> dict[str, Any]:
        """A conversation ending in an assistant message is continued, as the local backends do: vLLM's
        ``continue_final_message=True`` (with ``add_generation_prompt=False``, which vLLM requires with it).
        A server without that field would start a new assistant turn instead: refused."""
        if not continues_final_message(conv):
            return {}
        if not self.is_vllm and "continue_final_message" not in self.extra_body:
            raise ValueError("this conversation ends in an assistant message, to be continued; only a vLLM server "
                             "(continue_final_message) does that over the OpenAI API. Use server='vllm', or pass "
                             "extra_body={'continue_final_message': True, 'add_generation_prompt': False} for a "
                             "server that supports it")
        return {"continue_final_message": True, "add_generation_prompt": False}

    def close(self) -> None:
        self._client.close()

    def __getstate__(self):
        raise TypeError("OpenAIJudge holds an HTTP client and cannot be pickled; pass the spec string instead")

    # ------------------------------------------------------------------ HTTP
    def _send(self, url: str, body: dict[str, Any] | None, *, method: str = "POST") -> tuple[int, Any, bytes]:
        """One request (a POST of ``body``, or a GET) bounded by ``timeout`` in all and by ``max_response_bytes``:
        (status, headers, body)."""
        httpx = self._httpx
        deadline = time.monotonic() + self.timeout
        _local.deadline = deadline
        try:
            with self._client.stream(method, url, **({} if body is None else {"json": body})) as resp:
                size = resp.headers.get("content-length", "")
                if size.strip().isdigit() and int(size) > self.max_response_bytes:
                    raise _TooLarge(f"Content-Length {int(size)}")
                buf = bytearray()
                for chunk in resp.iter_bytes():
                    buf += chunk
                    if len(buf) > self.max_response_bytes:
                        raise _TooLarge(f"more than {len(buf)} bytes")
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the request's total timeout elapsed")
                return resp.status_code, resp.headers, bytes(buf)
        finally:
            _local.deadline = None

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
                status, headers, raw = self._send(url, body)
            except _TooLarge as exc:
                raise JudgeServerError(f"{url} sent a response body over max_response_bytes="
                                       f"{self.max_response_bytes} ({exc}); refused") from None
            except httpx.RequestError as exc:  # timeouts, connection / protocol / content-decoding errors
                kind = "Timeout" if isinstance(exc, httpx.TimeoutException) else type(exc).__name__
                last = f"{kind} ({type(exc).__name__}, timeout={self.timeout:g}s per request): {exc}"
                self._sleep(attempt, None)
                continue
            text = raw[:500].decode("utf-8", errors="replace")
            if status in _RETRY_STATUS:
                last = f"HTTP {status}: {text[:300]}"
                self._sleep(attempt, headers.get("retry-after"))
                continue
            if status >= 400:
                if "logprob" in text.lower():
                    raise JudgeServerError(f"{url} rejected a log-probability request (HTTP {status}): "
                                           f"{text}. choice_probs needs a server with logprobs support "
                                           "(vLLM: --max-logprobs >= top_logprobs)")
                raise JudgeServerError(f"{url} answered HTTP {status}: {text}")
            try:
                data = json.loads(raw)
                if not isinstance(data, dict) or not isinstance(data.get("choices", []), list):
                    raise ValueError("not a completion object")
                return data
            except (ValueError, RecursionError) as exc:
                last = f"unreadable response ({exc}): {text[:300]!r}"
                self._sleep(attempt, None)
                continue
        raise JudgeServerError(f"{url} failed after {self.max_retries + 1} attempts; last error: {last}")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        if attempt >= self.max_retries:
            return
        delay = min(30.0, self.backoff * (2 ** attempt)) * (0.5 + random.random() / 2)
        if retry_after:
            try:
                wait = float(retry_after)
            except ValueError:
                wait = math.nan
            if math.isfinite(wait) and wait >= 0:  # ("nan" / "inf" / negative / a date: ignored)
                delay = max(delay, min(60.0, wait))
        time.sleep(delay)

    def _map(self, fn, items: list, row_errors: list | None = None) -> list:
        """``fn`` over ``items`` on the thread pool. With ``row_errors`` (a list), a request that fails
        (``JudgeServerError`` after its retries) gives None and its message in ``row_errors[i]`` instead of
        failing the others; when every request fails, the first error is raised (nothing was answered)."""
        run = fn
        if row_errors is not None:
            def run(x):
                try:
                    return fn(x), None
                except JudgeServerError as exc:
                    return None, str(exc)
        if len(items) <= 1 or self.concurrency == 1:
            out = [run(x) for x in items]
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
                out = list(pool.map(run, items))
        if row_errors is None:
            return out
        errs = [e for _, e in out]
        if errs and all(e is not None for e in errs):
            raise JudgeServerError(errs[0])
        row_errors[:] = errs
        return [r for r, _ in out]

    # ------------------------------------------------------------------ protocol
    #: ``generate`` / ``choice_probs`` accept ``row_errors=[]``: one failing request then fails only its row
    isolates_rows = True

    def generate(self, conversations: Sequence[Conversation], *, n: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 256, stop: Sequence[str] | None = None,
                 seed: int | None = None, row_errors: list | None = None) -> list[list[str]]:
        """As the protocol; with ``row_errors`` (a list, filled with one entry per conversation) a request
        that fails after its retries gives ``[]`` and its error message instead of raising."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_temperature(temperature)
        cache: dict[int, str] = {}
        msgs = [(to_openai_messages(c, cache), self._template_fields(c)) for c in conversations]

        greedy = temperature < _GREEDY_EPS
        sampling = self._sampling_fields(0.0 if greedy else temperature)
        want = 1 if greedy else n  # vLLM refuses n > 1 at temperature 0; greedy gives one answer anyway

        def one(item):
            m, template = item
            texts: list[str] = []
            for _ in range(want):  # servers that ignore n return fewer choices: ask again for the rest
                body = {"model": self.model, "messages": m, "n": want - len(texts), **sampling,
                        "max_tokens": max_new_tokens, **template, **self.extra_body}
                if stop:
                    body["stop"] = list(stop)
                if seed is not None and not greedy:
                    body["seed"] = seed + len(texts)
                data = self._post("/chat/completions", body)
                try:
                    got = [c["message"]["content"] or "" for c in data["choices"]]
                except (KeyError, TypeError) as exc:
                    raise JudgeServerError(f"completion without message content: {json.dumps(data)[:300]}") from exc
                if not all(isinstance(g, str) for g in got):
                    raise JudgeServerError(f"completion content is not text: {json.dumps(data)[:300]}")
                if not got:
                    raise JudgeServerError(f"completion with no choices: {json.dumps(data)[:300]}")
                texts += got
                if len(texts) >= want:
                    break
            return texts[:want] * n if greedy else texts[:n]

        return [r if r is not None else [] for r in self._map(one, msgs, row_errors)]

    def _logprob_requests(self, conversations: Sequence[Conversation], choices: Sequence[str], read, row_errors):
        """One ``max_tokens=1`` request per conversation asking for the choices' log-probabilities (on a vLLM
        server the exact log-prob of each choice id, keyed by id in the answer); ``read(data, choices,
        token_ids=...)`` turns each response into a row. Returns the rows (None where a request failed)."""
        check_choices(choices)
        ids = self._check_single_tokens(tuple(choices))
        exact_ids = ids is not None and self.is_vllm
        sampling = self._sampling_fields(0.0)
        cache: dict[int, str] = {}
        msgs = [(to_openai_messages(c, cache), self._template_fields(c)) for c in conversations]

        def one(item):
            m, template = item
            body = {"model": self.model, "messages": m, "max_tokens": 1, **sampling, **template,
                    "logprobs": True, "top_logprobs": self.top_logprobs, **self.extra_body}
            if exact_ids:
                body.update(top_logprobs=len(ids), logprob_token_ids=list(ids), return_tokens_as_token_ids=True)
            return read(self._post("/chat/completions", body), choices, token_ids=ids if exact_ids else None)

        return self._map(one, msgs, row_errors)

    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str], *,
                     row_errors: list | None = None):
        """As the protocol; with ``row_errors`` (a list, filled with one entry per conversation) a request
        that fails after its retries gives a NaN row and its error message instead of raising."""
        import torch

        def read(data, choices, token_ids):
            try:
                return read_choice_logprobs(data, choices, token_ids=token_ids)
            except JudgeServerError as exc:
                raise JudgeServerError(f"{self.base_url}: {exc}") from None

        rows = self._logprob_requests(conversations, choices, read, row_errors)
        out = torch.full((len(rows), len(choices)), float("nan"))
        for i, row in enumerate(rows):
            if row is None:
                continue  # no usable probability: NaN row (the rewards report the question unanswered)
            out[i] = torch.softmax(torch.tensor(row, dtype=torch.float64), dim=0).float()
        return out

    def raw_choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str], *,
                         reasons: list | None = None, row_errors: list | None = None):
        """Full-vocabulary probabilities (see :meth:`JudgeBackend.raw_choice_probs`), read strictly by
        :func:`read_raw_logprobs`: exact on a vLLM server (``logprob_token_ids``); elsewhere a choice outside the
        server's ``top_logprobs`` alternatives is NaN + reason (its value is unknown). ``reasons`` gets one entry
        per conversation; ``row_errors`` as in :meth:`choice_probs` (failed requests)."""
        import torch

        def read(data, choices, token_ids):
            row, reason = read_raw_logprobs(data, choices, token_ids=token_ids)
            if reason == _NO_LOGPROBS:  # a server without logprobs support fails the call (as choice_probs does):
                raise JudgeServerError(f"{self.base_url}: {reason}")  # never an answer a score cache keeps
            return row, reason

        rows = self._logprob_requests(conversations, choices, read, row_errors)
        out = torch.full((len(rows), len(choices)), float("nan"))
        why: list[str | None] = []
        for i, r in enumerate(rows):
            if r is None:  # the request failed (row_errors holds its message)
                why.append(row_errors[i] if row_errors and i < len(row_errors) else "the judge call failed")
                continue
            row, reason = r
            why.append(None if row is None else reason)
            if row is None:
                why[-1] = f"{self.base_url}: {reason}"
                continue
            out[i] = torch.exp(torch.tensor(row, dtype=torch.float64)).float()
        if reasons is not None:
            reasons[:] = why
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
            try:  # bounded like every request (total timeout, body cap); any failure: cannot check
                status, _, raw = self._send(self.base_url.rsplit("/v1", 1)[0] + "/tokenize",
                                            {"model": self.model, "prompt": c, "add_special_tokens": False})
            except (self._httpx.HTTPError, _TooLarge):
                ids = None
                break
            if status != 200:
                ids = None
                break  # no tokenize endpoint: cannot check
            try:
                data = json.loads(raw)
                toks = data.get("tokens") if isinstance(data, dict) else None
            except (ValueError, RecursionError):
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
