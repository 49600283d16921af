"""Prompt preparation for the transformers judge without per-question template and tokenizer work.

A judge reward asks many questions that differ only in a few texts (EVR: one rubric per dimension, one claim
per hypothesis, the same system message, images and instruction everywhere). Rendering the chat template and
tokenizing the whole prompt per question costs more than the model on small models. Here:

- :class:`TemplateCache` renders a conversation *shape* (roles, content item types, whether the last message is
  continued) once with sentinel texts and splices each conversation's texts in. A shape is checked once
  against a direct rendering with probe texts; a template that transforms its texts (strips, escapes, branches
  on them) fails the check and that shape is rendered directly every time.
- :class:`SegmentTokenizer` tokenizes the pieces of a prompt between special tokens separately and caches each
  distinct piece: Hugging Face tokenizers split added special tokens out first and tokenize the text between
  them independently, so the concatenation is the tokenizer's own result. Only special tokens that do not strip
  or normalise their surroundings are split on; the first batch is checked against the tokenizer, and any
  difference turns the cache off for good.
- :func:`lcp` finds the longest common prefix of token lists with C-level slice comparisons.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

__all__ = ["TemplateCache", "SegmentTokenizer", "lcp", "positions"]

_SENTINEL = "\uE000rk{}\uE000"
_PROBES = ("  a probe {x} <b>\n text ", "second\tprobe ", "<think>\nx\n</think>\n\ny")
_CACHE_LIMIT = 8192


def lcp(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of ``seqs`` (lists or tuples of ints, mixed)."""
    first = seqs[0] if isinstance(seqs[0], list) else list(seqs[0])
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        s = s if isinstance(s, list) else list(s)  # a list never equals a tuple
        if n == 0:
            break
        if s[:n] == first[:n]:
            continue
        lo, hi = 0, n  # s[:lo] == first[:lo]; s[:hi] != first[:hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s[lo:mid] == first[lo:mid]:
                lo = mid
            else:
                hi = mid
        n = lo
    return n


def positions(ids: list[int], token: int) -> list[int]:
    """Indices of ``token`` in ``ids`` (searched in C)."""
    out, i = [], -1
    try:
        while True:
            i = ids.index(token, i + 1)
            out.append(i)
    except ValueError:
        return out


class TemplateCache:
    """``render(conv)`` equal to ``render_direct(conv)`` with the template run once per conversation shape."""

    def __init__(self, render_direct: Callable[[Sequence[dict]], str]):
        self.render_direct = render_direct
        self._parts: dict[tuple, tuple[str, ...] | None] = {}

    @staticmethod
    def _shape(conv: Sequence[dict]) -> tuple[tuple, list[str], Callable[[list[str]], list[dict]]] | None:
        """(shape key, the conversation's texts in order, a function building the conversation with other texts)
        or None for a conversation this does not handle (then it is rendered directly)."""
        key: list[Any] = []
        texts: list[str] = []
        for msg in conv:
            if not isinstance(msg, dict) or set(msg) - {"role", "content"} or not isinstance(msg.get("role"), str):
                return None
            content = msg.get("content")
            if isinstance(content, str):
                key.append((msg["role"], "str"))
                texts.append(content)
            elif isinstance(content, list):
                items = []
                for item in content:
                    if not isinstance(item, dict):
                        return None
                    if item.get("type") == "text" and set(item) == {"type", "text"} and isinstance(item["text"], str):
                        items.append("text")
                        texts.append(item["text"])
                    elif (item.get("type") == "image" or "image" in item) and set(item) <= {"type", "image"}:
                        items.append("image:" + ("t" if "type" in item else "") + ("i" if "image" in item else ""))
                    else:
                        return None
                key.append((msg["role"], tuple(items)))
            else:
                return None

        def build(new: list[str]) -> list[dict]:
            it = iter(new)
            out = []
            for msg in conv:
                content = msg["content"]
                if isinstance(content, str):
                    out.append({"role": msg["role"], "content": next(it)})
                else:
                    out.append({"role": msg["role"], "content": [
                        {"type": "text", "text": next(it)} if c.get("type") == "text" and set(c) == {"type", "text"}
                        else c for c in content]})
            return out

        return tuple(key), texts, build

    def render(self, conv: Sequence[dict]) -> str:
        shape = self._shape(conv)
        # empty texts: a template may branch on them (the probes are never empty)
        if shape is None or any("\uE000" in t or not t.strip() for t in shape[1]):
            return self.render_direct(conv)
        key, texts, build = shape
        parts = self._parts.get(key, False)
        if parts is False:
            parts = self._learn(len(texts), build)
            if len(self._parts) > 1024:
                self._parts.clear()
            self._parts[key] = parts
        if parts is None:
            return self.render_direct(conv)
        out = [parts[0]]
        for t, p in zip(texts, parts[1:]):
            out.append(t)
            out.append(p)
        return "".join(out)

    def _learn(self, n: int, build) -> tuple[str, ...] | None:
        whole = self.render_direct(build([_SENTINEL.format(i) for i in range(n)]))
        pieces = re.split("\uE000rk(\\d+)\uE000", whole)
        # pieces: text, index, text, index, ...: every slot exactly once, in order
        if [int(x) for x in pieces[1::2]] != list(range(n)):
            return None
        parts = tuple(pieces[0::2])
        for probe in _PROBES:
            texts = [f"{probe}{i}" for i in range(n)]
            direct = self.render_direct(build(texts))
            spliced = parts[0] + "".join(t + p for t, p in zip(texts, parts[1:]))
            if spliced != direct:
                return None
        return parts


class SegmentTokenizer:
    """``encode(texts)`` equal to ``tokenizer(texts, add_special_tokens=False)["input_ids"]``, tokenizing each
    distinct piece between special tokens once (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}
        self._ok: bool | None = None  # None: not yet checked against the tokenizer
        self._split = self._splitter(tokenizer)

    @staticmethod
    def _splitter(tok: Any) -> tuple[re.Pattern, dict[str, int]] | None:
        try:
            decoder = tok.added_tokens_decoder  # id -> AddedToken
        except AttributeError:
            return None
        specials: dict[str, int] = {}
        for tid, at in decoder.items():
            if not getattr(at, "special", False):
                continue
            if getattr(at, "lstrip", False) or getattr(at, "rstrip", False) or getattr(at, "single_word", False) \
                    or getattr(at, "normalized", False):
                continue
            specials[str(at.content)] = int(tid)
        if not specials:
            return None
        # longest first, so that a special token containing another is matched whole
        pattern = re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
        return pattern, specials

    def _direct(self, texts: list[str]) -> list[list[int]]:
        return [list(x) for x in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self._split is None or self._ok is False or not texts:
            return self._direct(texts)
        pattern, specials = self._split
        cache = self._cache
        pieces_of = [pattern.split(t) for t in texts]
        todo = {p for pieces in pieces_of for p in pieces[0::2] if p and p not in cache}
        if len(cache) + len(todo) > _CACHE_LIMIT:
            cache.clear()
            todo = {p for pieces in pieces_of for p in pieces[0::2] if p}
        if todo:
            todo = sorted(todo)
            for p, ids in zip(todo, self._direct(todo)):
                cache[p] = ids
        out = []
        for pieces in pieces_of:
            ids: list[int] = []
            for i, p in enumerate(pieces):
                if i % 2:
                    ids.append(specials[p])
                elif p:
                    ids.extend(cache[p])
            out.append(ids)
        if self._ok is None:
            self._ok = out == self._direct(texts)
            if not self._ok:
                return self._direct(texts)
        return out
