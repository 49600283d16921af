"""KV-cache plumbing of the transformers judge (:class:`~rewardkit.judges.transformers_backend.TransformersJudge`).

The session prefix cache (a later call reuses the KV of an earlier call's prefix, sliced to the shared part),
the left-padded batch state built from unpadded per-prefix entries, forking a cache's rows for continuations,
and the cache keyword of the model's ``forward`` across transformers 5.x versions. :class:`PrefixCacheMixin`
holds the judge's methods for it; it reads the judge's ``model``, ``image_token_id``, ``stats`` and
``_session_prefixes`` and calls its ``_prefill`` / ``_continue``.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Sequence

from ._prep import lcp as _lcp
from ._prep import positions

if TYPE_CHECKING:
    from ._transformers_types import _Img

__all__ = ["PrefixCacheMixin", "unsupported_attention"]

#: the largest reused CPU attention-mask buffer (:meth:`PrefixCacheMixin._mask_buffer`)
_MASK_BUFFER_BYTES = 64 * 2 ** 20


def unsupported_attention(config: Any) -> str | None:
    """Why the transformers judge cannot run this model's text attention exactly, or None (full attention in
    every layer).

    Read from the text config's ``layer_types``, the list transformers itself builds its per-layer masks and
    cache layers from: Qwen2-VL / Qwen2.5-VL's config sets it from ``use_sliding_window``, ``sliding_window``
    and ``max_window_layers`` (layer ``i`` is ``"sliding_attention"`` when the window is on and
    ``i >= max_window_layers``), so ``use_sliding_window: true`` with ``max_window_layers >= num_hidden_layers``
    windows no layer and is accepted. A windowed layer would lose its window in the ready 4-D masks the judge
    passes (transformers hands a 4-D mask to every layer unchanged; sdpa and eager take the window only from
    the mask) and its cache would keep only the window, so prefix slices and forks would not be a fresh
    prefill's; a linear-attention layer (hybrid models such as Qwen3.5) keeps a recurrent state that cannot be
    sliced or forked by keys / values.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = list(getattr(text, "layer_types", None) or [])
    other = [t for t in types if t != "full_attention"]
    if not other:
        return None
    fields = {k: getattr(text, k, None) for k in ("use_sliding_window", "sliding_window", "max_window_layers",
                                                   "num_hidden_layers")}
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if windowed:
        set_ = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        return (f"its text config uses sliding-window attention in {len(windowed)} of {len(types)} layers "
                f"(text_config.layer_types has 'sliding_attention' from layer {windowed[0]}; {set_}). The judge's "
                "shared-prefix KV caches and ready 4-D attention masks would drop or cut the window, giving "
                "answers that differ from the model's own forward. Use a config without a window "
                "(use_sliding_window: false, or max_window_layers >= num_hidden_layers, and no "
                "'sliding_attention' in layer_types; when every prompt plus its answer is at most sliding_window "
                "tokens the window masks nothing, so the answers are the same), or the vllm / openai backend")
    kinds = sorted(set(other))
    return (f"its text config has {', '.join(map(repr, kinds))} layers (text_config.layer_types = {types}): "
            "a hybrid model whose non-full-attention layers keep state the judge cannot slice or fork by "
            "keys / values. Use the vllm or openai backend")


class PrefixCacheMixin:
    """The session prefix cache and cache forking of :class:`TransformersJudge`."""

    # ------------------------------------------------------------------ session prefix cache
    # (Full-attention KV only, which the constructor guarantees (:func:`unsupported_attention`): a cached
    # prefix's first n positions are then exactly the KV a fresh prefill of those n tokens gives.)
    def _prefix_state(self, prefixes: list[tuple[list[int], list[str]]], feats: dict[str, _Img]) -> dict[str, Any]:
        """A batched prefix state like :meth:`_prefill`'s, reusing the session's cached prefixes.

        Per prefix: an exact hit is used as is; else the cached prefix with the longest shared token prefix
        that holds all of this prefix's images (same images, same order) and ends on a text token is sliced
        to the shared part and only the remaining text is run (positions continue from the shared part).
        Prefixes with no such parent share their common stem when they have one (:meth:`_shared_stem`: e.g.
        the system message and reference images of every candidate of an edit): the stem is prefilled once and
        each prefix runs only its own remainder, images included; the rest are prefilled. New prefixes (and a
        stem) are kept (bounded, oldest dropped first).
        """
        cache = self._session_prefixes
        if cache is None:
            return self._prefill(prefixes, feats)
        import torch

        entries: list[dict[str, Any] | None] = [None] * len(prefixes)
        fresh: list[int] = []
        ext: list[tuple[int, dict[str, Any], int, int]] = []  # (prefix, parent, shared tokens, shared images)
        for j, (ids, keys) in enumerate(prefixes):
            hit = cache.get((tuple(ids), tuple(keys)))
            if hit is not None:
                entries[j] = hit
                self.stats["prefix_hits"] += 1
                continue
            parent, n = self._best_parent(ids, keys)
            if parent is None:
                fresh.append(j)
            elif n == len(ids):
                entries[j] = self._keep(ids, keys, self._slice(parent, n))
                self.stats["prefix_reused_tokens"] += n
            else:
                ext.append((j, parent, n, len(keys)))  # the parent holds all of this prefix's images
                self.stats["prefix_reused_tokens"] += n
        stem = self._shared_stem([prefixes[j] for j in fresh], feats) if len(fresh) > 1 else None
        if stem is not None:
            root = cache.get((tuple(stem[0]), tuple(stem[1])))  # kept by an earlier call of the session
            if root is None:
                st = self._prefill([stem], feats)
                kv = [(layer.keys[0].clone(), layer.values[0].clone()) for layer in st["cache"].layers]
                root = self._keep(*stem, {"kv": kv, "pos": st["pos"][:, 0], "next": int(st["next_pos"][0])})
            else:
                self.stats["prefix_hits"] += 1
                self.stats["prefix_reused_tokens"] += len(stem[0])
            n = len(stem[0])
            for j in fresh:
                if len(prefixes[j][0]) == n:
                    entries[j] = self._keep(*prefixes[j], self._slice(root, n))
                else:
                    ext.append((j, root, n, len(stem[1])))
            self.stats["prefix_reused_tokens"] += n * (len(fresh) - 1)  # prefilled once instead of len(fresh) times
            fresh = []
        if fresh:
            st = self._prefill([prefixes[j] for j in fresh], feats)
            L = st["mask"].shape[1]
            next_pos = st["next_pos"].tolist()
            for r, j in enumerate(fresh):
                a = L - len(prefixes[j][0])  # a prefilled row is left-padded: its tokens are the last columns
                kv = [(layer.keys[r, :, a:].clone(), layer.values[r, :, a:].clone()) for layer in st["cache"].layers]
                entries[j] = self._keep(*prefixes[j], {"kv": kv, "pos": st["pos"][:, r, a:], "next": next_pos[r]})
            if len(fresh) == len(prefixes):
                # nothing came from the cache: the prefill's own batch is the state (the same rows in the same
                # order and columns; _assemble would copy it back with zeros in the masked padding)
                return st
        if ext:
            parents = [self._slice(p, n) for _, p, n, _ in ext]
            st = self._assemble(parents)
            rems = [prefixes[j][0][n:] for j, _, n, _ in ext]
            _, out_cache, (mask, _, pos) = self._continue(st, list(range(len(ext))), rems,
                                                         images=[prefixes[j][1][k:] for j, _, _, k in ext],
                                                         feats=feats)
            S = pos.shape[2]
            for r, ((j, _, n, _), par, rem) in enumerate(zip(ext, parents, rems)):
                valid = mask[r].bool()
                kv = [(layer.keys[r][:, valid], layer.values[r][:, valid]) for layer in out_cache.layers]
                tail = pos[:, r, S - len(rem):].to(par["pos"].device)
                entries[j] = self._keep(*prefixes[j], {"kv": kv, "pos": torch.cat([par["pos"], tail], 1),
                                                       "next": int(tail.max()) + 1})
        return self._assemble(entries)

    def _shared_stem(self, prefixes: list[tuple[list[int], list[str]]],
                     feats: dict[str, _Img]) -> tuple[list[int], list[str]] | None:
        """``(ids, image keys)`` of the longest token prefix that all ``prefixes`` share, ends on a text token
        and holds the same images in all of them, or None when it is under 32 tokens or the model's M-RoPE
        positions are not computed here (:meth:`_rope_positions`: a remainder with images needs them)."""
        from ..models.rope import VERIFIED_MODEL_TYPES

        if getattr(self.model.config, "model_type", None) not in VERIFIED_MODEL_TYPES:
            return None
        img = self.image_token_id
        first, keys0 = prefixes[0]
        n = _lcp([ids for ids, _ in prefixes])
        # where each image of the first prefix lies: its placeholder tokens, in order (feats: tokens per image)
        at = positions(first, img)
        if len(at) != sum(feats[key].n_tokens for key in keys0):
            return None
        spans, k = [], 0
        for key in keys0:
            spans.append((at[k], at[k] + feats[key].n_tokens))
            k += feats[key].n_tokens
        for q, (a, _) in enumerate(spans):
            if a >= n:
                break
            if any(keys[q] != keys0[q] for _, keys in prefixes[1:]):  # same token count, other pixels
                n = a  # stop before it
                break
        while n > 0 and first[n - 1] == img:  # cut on a text token: its next position is known
            n -= 1
        if n < 32:
            return None
        return list(first[:n]), list(keys0[:sum(1 for _, b in spans if b <= n)])

    def _best_parent(self, ids: list[int], keys: list[str]) -> tuple[dict[str, Any] | None, int]:
        if not self._session_prefixes:
            return None, 0
        img = self.image_token_id
        img_end = len(ids) - ids[::-1].index(img) if img in ids else 0  # after the last image token
        best, best_n = None, 0
        for (cids, ckeys), e in self._session_prefixes.items():
            if tuple(ckeys[:len(keys)]) != tuple(keys):
                continue
            n = _lcp([cids, ids])
            while n > 0 and ids[n - 1] == img:  # cut on a text token: its next position is known
                n -= 1
            if n > best_n and n >= max(img_end, 1) and (keys or n >= 32):
                best, best_n = e, n
        return best, best_n

    def _slice(self, e: dict[str, Any], n: int) -> dict[str, Any]:
        """The first ``n`` positions of a cached prefix (``n`` ends on a text token)."""
        pos = e["pos"][:, :n]
        return {"kv": [(k[:, :n], v[:, :n]) for k, v in e["kv"]], "pos": pos, "next": int(pos[0, -1]) + 1}

    def _keep(self, ids: list[int], keys: list[str], entry: dict[str, Any]) -> dict[str, Any]:
        cache = self._session_prefixes
        key = (tuple(ids), tuple(keys))
        entry["bytes"] = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in entry["kv"])
        if key in cache:
            self._cached_bytes -= cache.pop(key)["bytes"]
        cache[key] = entry
        self._cached_bytes += entry["bytes"]
        while self._cached_bytes > self.prefix_cache_bytes and cache:
            self._cached_bytes -= cache.pop(next(iter(cache)))["bytes"]
        return entry

    def _assemble(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Left-padded batch state (cache, mask, next_pos) from unpadded per-prefix entries."""
        import torch
        from transformers import DynamicCache

        dev = self.device
        P, L = len(entries), max(e["pos"].shape[1] for e in entries)
        mask = torch.zeros((P, L), dtype=torch.long, device=dev)
        data = []
        for li in range(len(entries[0]["kv"])):
            k0 = entries[0]["kv"][li][0]
            K = k0.new_zeros((P, k0.shape[0], L, k0.shape[2]))
            V = k0.new_zeros((P, k0.shape[0], L, entries[0]["kv"][li][1].shape[2]))
            for r, e in enumerate(entries):
                k, v = e["kv"][li]
                K[r, :, L - k.shape[1]:] = k
                V[r, :, L - v.shape[1]:] = v
            data.append((K, V))
        for r, e in enumerate(entries):
            mask[r, L - e["pos"].shape[1]:] = 1
        nxt = torch.tensor([e["next"] for e in entries], dtype=torch.long, device=dev)
        return {"cache": DynamicCache(ddp_cache_data=data, config=self.model.config), "mask": mask, "next_pos": nxt}

    def _additive_masks(self) -> bool:
        """Whether continuations and decode steps get a ready 4-D additive mask (:func:`_additive_mask`): sdpa
        attention (every layer is full attention: the constructor refuses windowed models, whose window a 4-D
        mask, passed unchanged to every layer, would drop)."""
        return self._attn_impl() == "sdpa"

    def _mask_buffer(self, numel: int, dtype: Any) -> Any:
        """A reused flat CPU buffer for a continuation's 4-D attention mask, or None (on an accelerator, or above
        ``_MASK_BUFFER_BYTES``). A fresh tensor of tens of MiB costs the kernel's zero-filled pages at every
        call on CPU (with the tiny EVR benchmark model more than building the mask itself); on a GPU the
        caching allocator already reuses memory."""
        import torch

        if self.device.type != "cpu" or numel * torch.empty((), dtype=dtype).element_size() > _MASK_BUFFER_BYTES:
            return None
        buf = self._mask_buf
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = self._mask_buf = torch.empty(numel, dtype=dtype)
        return buf

    def _fork(self, cache: Any, idx: Any, max_len: int | None = None) -> Any:
        """A new cache holding rows ``idx`` of ``cache`` (never reuse a cache a forward has extended); ``idx`` None:
        all rows in order.

        ``max_len`` set: a preallocated ``StaticCache`` of that length (decoding then writes in place instead of
        concatenating the whole cache at every step); otherwise a ``DynamicCache``. Either is filled through its
        layers' ``update``, which writes the rows into its own storage (``DynamicLayer``: ``torch.cat`` onto an
        empty tensor; ``StaticLayer``: a copy into its buffer), so all rows need no selection (a copy) first: the
        forward that extends the new cache never writes into ``cache``'s tensors
        (``tests/judges/test_fast_paths.py`` checks it)."""
        from transformers import DynamicCache, StaticCache

        data = []
        for layer in cache.layers:
            n = int(layer.get_seq_length())
            k, v = layer.keys[:, :, :n], layer.values[:, :, :n]
            data.append((k, v) if idx is None else (k.index_select(0, idx), v.index_select(0, idx)))
        if max_len is None:
            return DynamicCache(ddp_cache_data=data, config=self.model.config)
        new = StaticCache(config=self.model.config, max_cache_len=max_len)
        for layer, (k, v) in zip(new.layers, data):
            layer.update(k, v)
        return new



def _left_padded(rows: Sequence[Sequence[int]], width: int, pad: int, device: Any):
    """``(ids, mask)`` ``[len(rows), width]`` int64 on ``device``, each row left-padded. The ids are written row
    by row into one flat ``array`` buffer (C-level slice copies, no Python int per element) that the tensor then
    shares: about a quarter of the time of ``torch.tensor`` on nested Python lists
    (``benchmarks/judge_efficiency.py`` pads about 200 rows per EVR call)."""
    import torch

    R = len(rows)
    lens = [len(r) for r in rows]
    if R and max(lens) > width:
        raise ValueError(f"a row of {max(lens)} ids does not fit in width {width}")
    buf = array("q", [pad]) * (R * width)
    mbuf = array("q", [0]) * (R * width)  # the mask the same way (no tensor operations for it either)
    one = array("q", [1])
    for i, r in enumerate(rows):
        if r:
            buf[(i + 1) * width - len(r):(i + 1) * width] = array("q", r)
            mbuf[(i + 1) * width - len(r):(i + 1) * width] = one * len(r)
    if R * width:
        ids = torch.frombuffer(buf, dtype=torch.long).view(R, width)
        mask = torch.frombuffer(mbuf, dtype=torch.long).view(R, width)
    else:  # frombuffer refuses an empty buffer
        ids = torch.zeros((R, width), dtype=torch.long)
        mask = torch.zeros((R, width), dtype=torch.long)
    return ids.to(device), mask.to(device)


def length_buckets(lengths: Sequence[int], forward_tokens: float) -> list[list[int]]:
    """The rows of a batch of prefixes of ``lengths`` split into buckets, one padded forward each, so that the
    cost ``sum over buckets of (forward_tokens + rows * longest length)`` is least (exact, over the lengths
    sorted: a bucket is a run of consecutive distinct lengths). ``forward_tokens``: what one more forward costs,
    in prefill tokens (0: one bucket per distinct length; a large value: one bucket). Buckets in order of
    length, rows in their original order within a bucket."""
    by: dict[int, list[int]] = {}
    for r, n in enumerate(lengths):
        by.setdefault(int(n), []).append(r)
    sizes = sorted(by)
    counts = [len(by[n]) for n in sizes]
    U = len(sizes)
    best = [0.0] + [float("inf")] * U  # best[j]: least cost of the first j distinct lengths
    cut = [0] * (U + 1)
    for j in range(1, U + 1):
        rows = 0
        for i in range(j, 0, -1):  # bucket = distinct lengths i-1 .. j-1, padded to sizes[j - 1]
            rows += counts[i - 1]
            c = best[i - 1] + forward_tokens + rows * sizes[j - 1]
            if c < best[j]:
                best[j], cut[j] = c, i - 1
    out, j = [], U
    while j > 0:
        i = cut[j]
        out.append(sorted(r for n in sizes[i:j] for r in by[n]))
        j = i
    return out[::-1]


def _stack_states(parts: list[tuple[list[int], dict[str, Any]]], n_rows: int, config: Any) -> dict[str, Any]:
    """One left-padded batch state of ``n_rows`` prefixes from the states of buckets of them, each prefilled in
    its own forward (:meth:`TransformersJudge._prefill`): ``parts`` is ``[(rows of the batch, bucket state)]``.
    Row ``r`` holds its bucket's keys / values, ids, mask and positions in its last columns, zeros in the
    masked columns before them (positions of padding are never read: only a row's own columns are)."""
    import torch
    from transformers import DynamicCache

    L = max(st["mask"].shape[1] for _, st in parts)
    first = parts[0][1]
    dev = first["ids"].device
    ids = torch.zeros((n_rows, L), dtype=first["ids"].dtype, device=dev)
    mask = torch.zeros((n_rows, L), dtype=first["mask"].dtype, device=dev)
    pos = torch.zeros((first["pos"].shape[0], n_rows, L), dtype=first["pos"].dtype, device=dev)
    next_pos = torch.zeros(n_rows, dtype=first["next_pos"].dtype, device=dev)
    layers = first["cache"].layers
    kv = [(k.new_zeros((n_rows, *k.shape[1:2], L, k.shape[3])), v.new_zeros((n_rows, *v.shape[1:2], L, v.shape[3])))
          for k, v in ((layer.keys, layer.values) for layer in layers)]
    for rows, st in parts:
        n = st["mask"].shape[1]
        idx = torch.tensor(rows, dtype=torch.long, device=dev)
        ids[idx, L - n:] = st["ids"]
        mask[idx, L - n:] = st["mask"]
        pos[:, idx, L - n:] = st["pos"]
        next_pos[idx] = st["next_pos"]
        for (K, V), layer in zip(kv, st["cache"].layers):
            K[idx, :, L - n:] = layer.keys[:, :, :n]
            V[idx, :, L - n:] = layer.values[:, :, :n]
    return {"cache": DynamicCache(ddp_cache_data=kv, config=config), "ids": ids, "mask": mask, "next_pos": next_pos,
            "pos": pos}


def _additive_mask(mask: Any, offset: int, n_queries: int, dtype: Any, out: Any = None):
    """The 4-D additive attention mask ``[R, 1, n_queries, W]`` (0: attend, -inf: not) of ``n_queries`` queries
    in columns ``offset ..`` of a batch whose 2-D key mask is ``mask`` ``[R, W]``: query i sees the unmasked keys
    up to its own column. The same mask transformers builds as booleans from the 2-D mask (``sdpa_mask``:
    padding and causality) and torch's SDPA turns into this float form (``where(~mask, -inf, 0)``) on every
    call; built here from a key row and a causal block in one broadcast add.

    Only for queries that each see at least one key (continuations after a prefix): a fully masked row would
    give NaN where the boolean form gives it to the kernel's own handling. ``out``: a flat buffer of at least
    ``R * n_queries * W`` elements of ``dtype`` to write it into (see :meth:`PrefixCacheMixin._mask_buffer`)."""
    import torch

    R, W = mask.shape
    inf = float("-inf")
    keys = torch.zeros((R, W), dtype=dtype, device=mask.device).masked_fill_(mask == 0, inf)
    cols = torch.arange(W, device=mask.device)
    rows = torch.arange(offset, offset + n_queries, device=mask.device)
    causal = torch.zeros((n_queries, W), dtype=dtype, device=mask.device).masked_fill_(cols[None, :] > rows[:, None],
                                                                                      inf)
    if out is None:
        return keys[:, None, None, :] + causal[None, None]
    return torch.add(keys[:, None, None, :], causal[None, None], out=out[:R * n_queries * W].view(R, 1, n_queries, W))


_CACHE_KW: dict[type, str] = {}


def _cache_arg(module: Any, cache: Any) -> dict[str, Any]:
    """The KV-cache keyword of ``module.forward``: ``cache`` (transformers >= 5.24) or ``past_key_values``
    (earlier 5.x, e.g. the 5.20 that vLLM 0.33 pins)."""
    cls = type(module)
    if cls not in _CACHE_KW:
        import inspect

        _CACHE_KW[cls] = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    return {_CACHE_KW[cls]: cache}


def _cache_of(out: Any) -> Any:
    """The KV cache a forward returned, under either name (see :func:`_cache_arg`)."""
    cache = out.get("cache") if hasattr(out, "get") else getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values

