"""What :class:`~rewardkit.judges.openai_backend.OpenAIJudge` sends and reads over the wire: conversations as
OpenAI chat messages (images inline as base64 PNG data URLs) and the chat-completion response's log-probabilities
(:func:`read_choice_logprobs`, :func:`read_raw_logprobs`; see :mod:`rewardkit.judges.openai_backend` for how each
is used). Pure functions; every public name is importable from :mod:`rewardkit.judges.openai_backend` too.
"""

from __future__ import annotations

import base64
import io
import json
import math
from typing import Any, Sequence

from .base import Conversation
from .policy import JudgeError

__all__ = ["JudgeServerError", "to_openai_messages", "read_choice_logprobs", "read_raw_logprobs",
           "implausible_logprobs"]


_MAX_LOGPROB = 1e-4  # a log-probability above this (rounding aside) is off-scale
# read_raw_logprobs' reason for a response without any log-probabilities: the server's capability, not an answer
_NO_LOGPROBS = "the server returned no log-probabilities (it or the model does not support logprobs)"


class JudgeServerError(JudgeError):
    """The judge server failed (after retries), answered garbage, or lacks a needed feature."""


def implausible_logprobs(alts: Sequence[tuple[str, float]], keys: Sequence[str]) -> str | None:
    """Why a response's top alternatives ``[(token, log-prob), ...]`` cannot be one next-token distribution, or
    None. The one rule of both readers (:func:`read_choice_logprobs`, :func:`read_raw_logprobs`): a NaN or
    positive log-probability; a choice's token (``keys``) listed twice with different values (distinct tokens
    may share a text, e.g. byte pieces shown as U+FFFD: harmless unless it is a choice's); probabilities of the
    distinct (token, value) entries summing above 1 (e.g. Yes and No at -0.05 each: 1.9)."""
    seen: dict[str, float] = {}
    entries: set[tuple[str, float]] = set()
    for tok, v in alts:
        if not (v <= _MAX_LOGPROB):  # NaN-safe: NaN and positive values are off-scale
            return f"off-scale log-probability {v!r} for {tok!r}"
        v = min(v, 0.0)
        if tok in keys and tok in seen and seen[tok] != v:
            return f"token {tok!r} listed twice with different log-probabilities"
        seen.setdefault(tok, v)
        entries.add((tok, v))
    total = math.fsum(math.exp(v) for _, v in entries)
    if total > 1.0 + 1e-2:  # (a tolerance for servers that round log-probabilities)
        return f"the listed log-probabilities sum to probability {total:.4f} > 1: not full-vocabulary values"
    return None


def read_choice_logprobs(data: Any, choices: Sequence[str], *,
                         token_ids: Sequence[int] | None = None) -> list[float] | None:
    """The log-probabilities of ``choices`` in one chat-completion response with ``top_logprobs``.

    Alternatives are matched by their exact token text (``" Yes"`` is not ``"Yes"``); with ``token_ids`` (a
    vLLM server asked with ``logprob_token_ids`` and ``return_tokens_as_token_ids``) by ``"token_id:<id>"``,
    and every choice must then be present. Returns one value per choice (``-inf`` for a choice absent from
    the top alternatives), or None when the response has no usable probability for the choices (none listed,
    all ``-inf``, an exact id missing, or alternatives that are no distribution: :func:`implausible_logprobs`,
    the rule the raw reader applies too). Raises
    :class:`JudgeServerError` when the response has no log-probs at all or they are malformed (not a list of
    ``{"token": str, "logprob": number}``).
    """
    def bad(why: str) -> JudgeServerError:
        return JudgeServerError(f"unreadable logprobs ({why}) in {json.dumps(data, default=str)[:300]}")

    ch = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        raise bad("no choices")
    lp = ch[0].get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if lp is None or content is None or content == []:
        raise JudgeServerError("the server returned no log-probabilities: it (or the model) does not support "
                               "logprobs/top_logprobs, which choice_probs needs")
    if not isinstance(content, list) or not isinstance(content[0], dict):
        raise bad("content is not a list of token entries")
    top = content[0].get("top_logprobs")
    if top is None:
        top = []
    if not isinstance(top, list):
        raise bad("top_logprobs is not a list")
    alts: list[tuple[str, float]] = []
    for alt in top:
        if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
            raise bad("an alternative without a string token")
        v = alt.get("logprob")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(f"logprob {v!r} is not a number")
        alts.append((alt["token"], float(v)))
    keys = [f"token_id:{t}" for t in token_ids] if token_ids is not None else list(choices)
    if implausible_logprobs(alts, keys) is not None:
        return None  # not a next-token distribution (off-scale, a choice listed twice, sum above 1): no guess
    table: dict[str, float] = {}
    for tok, v in alts:
        table.setdefault(tok, v)  # exact text: never merge " Yes" into "Yes"
    row = [table.get(k) for k in keys]
    if token_ids is not None and any(x is None for x in row):
        return None  # the server gave no value for a choice it was asked about: no guess
    present = [x for x in row if x is not None]
    if not present:
        return None
    if all(x == -math.inf for x in present):
        return None
    return [min(x, 0.0) if x is not None else -math.inf for x in row]


def read_raw_logprobs(data: Any, choices: Sequence[str], *,
                      token_ids: Sequence[int] | None = None) -> tuple[list[float] | None, str | None]:
    """Full-vocabulary log-probabilities of ``choices`` in one chat-completion response, strictly.

    Returns ``(one log-probability per choice, None)`` or ``(None, reason)``; never raises on the response's
    content. With ``token_ids`` (a vLLM server asked with ``logprob_token_ids``) each choice is read by id and
    must be present: its value is exact whatever its rank. Otherwise by exact token text among the
    ``top_logprobs`` alternatives: a choice that is not listed has an unknown probability (only bounded by the
    smallest listed one), which is a NaN + reason, never 0 or the bound. Refused as well: a response without
    log-probabilities, a malformed structure, a choice listed twice with different values, a NaN / positive
    log-probability (or ``-inf`` for a listed top alternative), and listed alternatives whose probabilities
    sum above 1 (they are then not full-vocabulary log-probabilities).
    """
    ch = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        return None, "unreadable logprobs (no choices)"
    lp = ch[0].get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if lp is None or content is None or content == []:
        return None, _NO_LOGPROBS
    if not isinstance(content, list) or not isinstance(content[0], dict):
        return None, "unreadable logprobs (content is not a list of token entries)"
    top = content[0].get("top_logprobs")
    if not isinstance(top, list) or not top:
        return None, "unreadable logprobs (no top_logprobs list)"
    if token_ids is not None:
        keys = [f"token_id:{t}" for t in token_ids]
    else:
        keys = list(choices)
    alts: list[tuple[str, float]] = []
    for alt in top:
        if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
            return None, "unreadable logprobs (an alternative without a string token)"
        v = alt.get("logprob")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, f"unreadable logprobs (logprob {v!r} of {alt['token']!r} is not a number)"
        alts.append((alt["token"], float(v)))
    reason = implausible_logprobs(alts, keys)
    if reason is not None:
        return None, reason
    table: dict[str, float] = {}
    for tok, v in alts:
        table.setdefault(tok, min(v, 0.0))
    row, missing = [], []
    for c, k in zip(choices, keys):
        if k not in table:
            missing.append(c)
        row.append(table.get(k))
    if missing:
        if token_ids is not None:
            return None, f"the server gave no log-probability for {missing} (asked for their exact ids)"
        floor = min(table.values())
        return None, (f"{missing} not among the server's top {len(table)} alternatives: the full-vocabulary "
                      f"probability is unknown (only known to be below {math.exp(floor):.3g})")
    if token_ids is None and any(v == -math.inf for v in row):
        return None, "a top alternative with log-probability -inf (unusable)"
    return row, None


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
