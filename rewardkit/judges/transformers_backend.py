"""Judge backend on a local transformers vision-language model (Qwen2-VL / Qwen2.5-VL / Qwen3-VL family).

Why this is not ``model.generate(**processor(...))`` per question: a judge reward asks the same image many
questions (EVR: 5 dimensions x K hypotheses + one verification per hypothesis). The naive loop re-runs the
vision tower and re-prefills the image + instruction prefix for every question. This backend

1. deduplicates images by content (exact keys from a cheap fingerprint, :mod:`._image_keys`) and runs the
   vision tower once per distinct image (and once per :meth:`~JudgeBackend.session` when a reward asks several
   batches of questions about the same images);
2. groups conversations by their shared leading tokens (everything up to the last image, extended to the
   longest common token prefix of the group), prefills each distinct prefix once and forks its KV cache
   (row index-select) for every continuation; rotary positions (3-D M-RoPE) are passed explicitly, never
   read from the model's mutable ``rope_deltas``;
3. decodes with its own loop (greedy or per-row seeded sampling) so that a row's sample does not depend
   on what else is in the batch.

Tensor layout of a continuation row: ``[left pad | prefix | suffix pad | suffix]``; the pads are masked
and the suffix positions continue from the prefix's last position.

This module holds the judge's protocol, prompt preparation, prefix planning, prefill and continuation; the
session prefix cache and cache forking are in ``_transformers_cache.py``, the decoding loop in
``_transformers_decode.py``, packed scoring in ``_transformers_packed.py`` and prefix positions in
``_transformers_positions.py`` (mixins of the one class); the data types they share with it (``_Img``,
``_Conv``) in ``_transformers_types.py``, the image content keys in ``_image_keys.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from ._image_keys import ImageKeys
from ._pixels import JudgePixels
from ._prep import SegmentTokenizer, TemplateCache, lcp, positions
from ._transformers_cache import (PrefixCacheMixin, _additive_mask, _cache_arg, _cache_of, _left_padded,
                                  _stack_states, length_buckets, unsupported_attention)
from ._transformers_decode import DecodeMixin
from ._transformers_packed import PackedScoringMixin
from ._transformers_positions import PositionsMixin
from ._transformers_types import _Conv, _Img
from .base import ChoiceError, Conversation, JudgeBackend, check_choices, check_temperature, continues_final_message

__all__ = ["TransformersJudge"]


def _is_image_item(item: Any) -> bool:
    return isinstance(item, dict) and (item.get("type") == "image" or "image" in item)


def conversation_images(conv: Conversation) -> list[Any]:
    """The images of a conversation, in order of appearance."""
    out = []
    for msg in conv:
        content = msg.get("content")
        if isinstance(content, list):
            out += [c.get("image") for c in content if _is_image_item(c)]
    return out


def _repeat_key(conv: Conversation) -> tuple | None:
    """A key equal for two conversations whose messages hold the same keys and values in the same order, images
    being the same objects (by identity); None when a value is not hashable. Equal keys: the same prompt."""
    out = []
    for msg in conv:
        if type(msg) is not dict:
            return None
        fields = []
        for k, v in msg.items():
            if k == "content" and type(v) is list:
                items = []
                for item in v:
                    if type(item) is not dict:
                        return None
                    items.append(tuple((ik, ("id", id(iv)) if ik == "image" else iv) for ik, iv in item.items()))
                v = tuple(items)
            fields.append((k, v))
        out.append(tuple(fields))
    key = tuple(out)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _unique(convs: list[_Conv]) -> tuple[list[_Conv], list[int] | None]:
    """``(distinct conversations, index of each conversation among them)``; the index is None when all are
    distinct. Equal token ids and images: the model sees the same input, so it is run once and the answer copied."""
    seen: dict[tuple, list[int]] = {}  # (length, last ids, image keys) -> candidates; equality is checked in full
    uniq: list[_Conv] = []
    back: list[int] = []
    for c in convs:
        key = (len(c.ids), tuple(c.ids[-8:]), tuple(c.images))
        for u in seen.get(key, ()):
            if uniq[u].ids == c.ids and uniq[u].images == c.images:
                back.append(u)
                break
        else:
            seen.setdefault(key, []).append(len(uniq))
            back.append(len(uniq))
            uniq.append(c)
    return uniq, (back if len(uniq) < len(convs) else None)


def _config_only(path: str, trust_remote_code: bool) -> Any:
    """The checkpoint's config alone (a small JSON file), or None when it cannot be read that way (the model is
    then checked after loading)."""
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - load_vlm reports the real problem
        return None


def _forward_tokens(config: Any) -> float:
    """What one more language-model forward costs on CPU, in prefill tokens (see ``prefill_forward_tokens``)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    return 4.2e6 / hidden ** 2 if hidden > 0 else float("inf")


def _refuse_attention(config: Any, name: str) -> None:
    """A TypeError when the model's text attention is not full attention in every layer
    (:func:`~rewardkit.judges._transformers_cache.unsupported_attention`)."""
    why = None if config is None else unsupported_attention(config)
    if why is not None:
        raise TypeError(f"{name} is not supported by the transformers judge backend: {why}")


class TransformersJudge(PrefixCacheMixin, DecodeMixin, PackedScoringMixin, PositionsMixin, JudgeBackend):
    """A judge on any local ``AutoModelForImageTextToText`` checkpoint of the Qwen-VL family.

    The text model must use full attention in every layer: a checkpoint whose config windows some layers
    (``use_sliding_window`` with ``max_window_layers`` below ``num_hidden_layers``, or ``"sliding_attention"``
    in ``layer_types``) or has linear-attention layers is refused with a ``TypeError`` before its weights are
    loaded (see ``docs/judges.md``).

    Args:
        model: a checkpoint path / hub id, or an already loaded model (then pass ``processor``).
        processor: the processor when ``model`` is a loaded model.
        device, dtype: where / how to load a checkpoint (default: cuda when available, float32).
        max_rows: continuation rows processed at once (each row holds a copy of its prefix's KV cache:
            lower it for big models and long prefixes).
        max_prefixes: distinct prefixes prefilled at once (and packed rows scored at once).
        packed_scoring: ``choice_probs`` packs the suffixes of a prefix into rows of up to ``pack_tokens``
            tokens after a single copy of the prefix cache, with a 4-D block mask (sdpa / eager attention).
            Saves the per-question prefix copies (memory) at the price of dense attention over each packed
            block; off by default because on CPU with small models it measured slower (see docs/judges.md).
        trust_remote_code: passed to ``from_pretrained`` (off by default).
        prefix_cache_mb: memory budget (MiB, on the model's device) for the prefix KV a :meth:`session` keeps
            for later calls (0: keep none; oldest prefixes are dropped first). A later
            call whose prefix shares all its images and a text-boundary token prefix with a kept one reuses
            that KV (sliced to the shared part) and prefills only the rest: EVR's verification questions after
            its evaluation questions, PARROT's projection after the rationale of the same pair.
        patch_embed: the vision patch embedding (:mod:`rewardkit.models.patch_embed`): ``"linear"`` (one matrix
            product, transformers' own fused forward; within float rounding of the Conv3d, and spared the Conv3d's
            slow cuDNN paths on some GPUs in bf16) or ``"conv"`` (the stock Conv3d). None (default): ``"linear"``
            for a checkpoint this judge loads, a model passed in is left as it is.
    """

    kind = "transformers"

    def __init__(self, model: Any, processor: Any = None, *, device: Any = None, dtype: Any = None,
                 max_rows: int = 64, max_prefixes: int = 16, packed_scoring: bool = False, pack_tokens: int = 512,
                 trust_remote_code: bool = False, attn_implementation: str | None = None,
                 prefix_cache_mb: float = 2048.0, patch_embed: str | None = None) -> None:
        from ..models.patch_embed import check_patch_embed, set_patch_embed

        if patch_embed is not None:
            check_patch_embed(patch_embed)  # before any weights load
        if isinstance(model, str):
            patch_embed = patch_embed or "linear"
            from ..models.vlm import load_vlm

            self.model_id = model
            _refuse_attention(_config_only(model, trust_remote_code), model)  # before loading the weights
            model, processor = load_vlm(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                                        attn_implementation=attn_implementation)
        else:
            if processor is None:
                raise ValueError("pass the processor together with a loaded model")
            self.model_id = getattr(model.config, "_name_or_path", "") or type(model).__name__
        if max_rows < 1 or max_prefixes < 1:
            raise ValueError("max_rows and max_prefixes must be >= 1")
        inner = getattr(model, "model", None)
        if not (hasattr(inner, "get_rope_index") and hasattr(inner, "get_image_features")
                and hasattr(getattr(model, "config", None), "image_token_id")):
            raise TypeError(f"{type(model).__name__} is not supported by the transformers judge backend: it needs a "
                            "Qwen-VL-family model with M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); use the vllm or "
                            "openai backend for other architectures")
        _refuse_attention(model.config, type(model).__name__)
        self.model = model.eval()
        # the vision tower's per-image / per-window SDPA loop as one call per chunk length (bit for bit the same;
        # a tower on eager or FlashAttention is left as it is): rewardkit.models.vision_attention
        from ..models.vision_attention import set_vision_attention

        set_vision_attention(model, "grouped")
        if patch_embed is not None:
            set_patch_embed(model, patch_embed)
        self.processor = processor
        self.tokenizer = processor.tokenizer
        cfg = model.config
        self.image_token_id = int(cfg.image_token_id)
        self.merge = int(cfg.vision_config.spatial_merge_size)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))
        self.max_rows, self.max_prefixes = int(max_rows), int(max_prefixes)
        self.packed_scoring, self.pack_tokens = bool(packed_scoring), int(pack_tokens)
        #: counters since construction: images_encoded (through the vision tower), prefill_tokens (prompt
        #: tokens run through the language model), decode_tokens, prefixes.
        self.stats: Counter = Counter()
        self._param = None  # the model's first parameter (device, _float_dtype)
        self._choice_ids: dict[tuple, list[int] | ChoiceError] = {}  # choices -> token ids (choice_token_ids)
        #: a prefix row's layout -> (its M-RoPE positions [3, n] (numpy), next position) (_prefix_positions)
        self._pos_cache: dict[tuple, tuple[Any, int]] = {}
        self._pos_cache_on = True
        self._lock = threading.RLock()
        self._session_images: dict[str, _Img] | None = None
        self._session_keys: ImageKeys | None = None  # the session's image content keys (_image_keys)
        #: session prefix cache: (prefix ids, image keys) -> unpadded per-prefix KV (see _prefix_state)
        self._session_prefixes: dict[tuple, dict[str, Any]] | None = None
        self.prefix_cache_bytes = int(prefix_cache_mb * 2 ** 20)
        self._cached_bytes = 0
        self._mask_buf = None  # reused CPU attention-mask buffer (_transformers_cache.PrefixCacheMixin._mask_buffer)
        # the chat template run once per conversation shape, each text piece tokenized once (judges._prep)
        self._templates = TemplateCache(self._render)
        self._segments = SegmentTokenizer(self.tokenizer)
        # the image processor's pixel_values / image_grid_thw built for the batch at once, bit for bit (_pixels)
        self.pixels = JudgePixels(processor.image_processor)
        #: prefixes of different lengths prefilled in buckets of similar length on CPU (see _prefill), a forward
        #: costing as much as this many prefill tokens (measured on a 2-core CPU: ~65 at hidden size 256, 4
        #: layers; taken as 4.2e6 / hidden_size**2: ~4000 at the tiny test models' 32, under 1 at 7B's 3584)
        self.group_prefill = True
        self.prefill_forward_tokens = _forward_tokens(cfg)

    # ------------------------------------------------------------------ protocol
    def describe(self) -> dict[str, Any]:
        dtype = str(self._float_dtype()).replace("torch.", "")
        return {"kind": self.kind, "model": str(self.model_id), "dtype": dtype}

    def to(self, device: Any) -> "TransformersJudge":
        with self._lock:
            self.model.to(device)
            self._param = None
        return self

    @property
    def device(self):
        """The device of the model's first parameter (where the inputs go). The parameter is found once (walking
        the modules for it cost more than the rest of a small continuation's bookkeeping): ``Module.to`` and
        :meth:`to` move a parameter in place, the same object, so its ``device`` follows the model."""
        p = self._param
        if p is None:
            p = self._param = next(self.model.parameters())
        return p.device

    def _float_dtype(self):
        """``self.model.dtype`` (the first floating-point parameter's dtype) without walking the modules."""
        p = self._param if self._param is not None else next(self.model.parameters())
        return p.dtype if p.is_floating_point() else self.model.dtype

    @contextmanager
    def session(self) -> Iterator["TransformersJudge"]:
        """Within the block, each distinct image is encoded once across all calls (features are kept)."""
        with self._lock:
            outer = self._session_images is not None
            if not outer:
                self._session_images = {}
                self._session_keys = ImageKeys()
                self._session_prefixes = {} if self.prefix_cache_bytes > 0 else None
                self._cached_bytes = 0
            try:
                yield self
            finally:
                if not outer:
                    self._session_images = None
                    self._session_keys = None
                    self._session_prefixes = None

    def generate(self, conversations: Sequence[Conversation], *, n: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 256, stop: Sequence[str] | None = None,
                 seed: int | None = None) -> list[list[str]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_temperature(temperature)
        if not conversations:
            return []
        if temperature == 0 and n > 1:  # greedy: the n samples are one text; decode each conversation once
            once = self.generate(conversations, n=1, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
            return [texts * n for texts in once]
        import torch

        with self._lock, torch.inference_mode():
            # seeded sampling seeds each row from its content: the full content hashes of its images
            convs, images = self._prepare(conversations, digests=temperature > 0 and seed is not None)
            back = None
            if temperature == 0 or seed is not None:
                # a repeated conversation decodes to the same texts (greedy, or sampled with the per-row seed
                # of its content): decode it once; unseeded samples stay independent
                convs, back = _unique(convs)
            out: list[list[str]] = [[""] * n for _ in convs]
            rows = [(c, 0) for c in range(len(convs))]
            # each conversation's suffix is prefilled once, then its cache row is repeated for the n samples
            per_chunk = max(1, self.max_rows // n)
            for chunk, run in self._row_chunks(convs, images, rows, max_rows=per_chunk):
                texts = self._decode(run, [convs[c] for c, _ in chunk], n,
                                     temperature=temperature, max_new_tokens=max_new_tokens,
                                     stop=list(stop or []), seed=seed)
                for j, (c, _) in enumerate(chunk):
                    out[c] = texts[j * n:(j + 1) * n]
            return out if back is None else [list(out[u]) for u in back]

    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        import torch

        # renormalised over the choices: softmax of the choice logits
        return self._next_token_scores(conversations, choices, lambda logits, ids: torch.softmax(logits[:, ids], -1))

    def raw_choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str], *,
                         reasons: list | None = None):
        """Exact full-vocabulary probabilities (see :meth:`JudgeBackend.raw_choice_probs`): ``softmax`` over the
        whole vocabulary of the first answer position's logits (float32), read at each choice token. Same
        prefix reuse and one vision encode per image as :meth:`choice_probs`. A row is NaN only when the model's
        logits are not finite (``reasons`` says so)."""
        import torch

        out = self._next_token_scores(conversations, choices,
                                      lambda logits, ids: torch.log_softmax(logits, -1)[:, ids].exp()).clone()
        bad = (~torch.isfinite(out).all(1)).tolist()
        if any(bad):
            out[torch.tensor(bad)] = float("nan")
        if reasons is not None:
            reasons[:] = ["the judge model's logits are not finite" if b else None for b in bad]
        return out

    def _next_token_scores(self, conversations: Sequence[Conversation], choices: Sequence[str], fn):
        """``fn(float32 next-token logits [R, V], choice ids) -> [R, C]`` for every conversation -> ``[B, C]``."""
        import torch

        ids = self.choice_token_ids(choices)
        if not conversations:
            return torch.zeros(0, len(ids))
        with self._lock, torch.inference_mode():
            convs, images = self._prepare(conversations)
            convs, back = _unique(convs)  # a repeated question is asked once (EVR: K equal greedy claims)
            probs = torch.zeros(len(convs), len(ids))
            if self.packed_scoring and self._attn_impl() in ("sdpa", "eager"):
                for members, logits in self._packed_logits(convs, images):
                    probs[members] = fn(logits.float(), ids).cpu()
            else:
                rows = [(c, 0) for c in range(len(convs))]
                for chunk, run in self._row_chunks(convs, images, rows):
                    logits, _, _ = run()  # [R, V]
                    probs[[c for c, _ in chunk]] = fn(logits.float(), ids).cpu()
            return probs if back is None else probs[torch.tensor(back, dtype=torch.long)]

    def choice_token_ids(self, choices: Sequence[str]) -> list[int]:
        """Token id of each choice; :class:`ChoiceError` when one is not exactly one token. Kept per choices (the
        tokenizer does not change): a judge reward asks the same labels at every call."""
        key = tuple(choices) if isinstance(choices, (list, tuple)) and all(type(c) is str for c in choices) else None
        got = self._choice_ids.get(key) if key is not None else None
        if got is None:
            try:
                got = self._choice_token_ids(choices)
            except ChoiceError as exc:
                got = exc
            if key is not None:
                if len(self._choice_ids) >= 256:
                    self._choice_ids.clear()
                self._choice_ids[key] = got
        if isinstance(got, ChoiceError):
            raise ChoiceError(str(got))
        return list(got)

    def _choice_token_ids(self, choices: Sequence[str]) -> list[int]:
        check_choices(choices)
        out = []
        for c in choices:
            ids = self.tokenizer.encode(c, add_special_tokens=False)
            if len(ids) != 1:
                raise ChoiceError(f"choice {c!r} is {len(ids)} tokens for this tokenizer ({ids}); "
                                  "choice_probs needs single-token answers")
            out.append(ids[0])
        if len(set(out)) != len(out):
            raise ChoiceError(f"choices {list(choices)} map to repeated token ids {out}")
        return out

    # ------------------------------------------------------------------ preparation
    def _render(self, conv: Conversation) -> str:
        cont = continues_final_message(conv)
        return self.processor.apply_chat_template(list(conv), tokenize=False, add_generation_prompt=not cont,
                                                  continue_final_message=cont)

    def _prepare(self, conversations: Sequence[Conversation],
                 digests: bool = False) -> tuple[list[_Conv], dict[str, _Img]]:
        """Token ids with image placeholders expanded, plus the encoded features of every distinct image.
        ``digests``: also each conversation's images' full content hashes (``_Conv.image_digests``)."""
        from ..media import _to_pil

        texts, conv_imgs = [], []
        pending: dict[str, Any] = {}
        image_keys = self._session_keys if self._session_keys is not None else ImageKeys()
        seen: dict[int, str] = {}  # id(image object) -> content key: the same object is keyed once per call
        first: dict[tuple, int] = {}  # a repeated conversation (same texts, same image objects) is prepared once
        which: list[int] = []
        for conv in conversations:
            if not isinstance(conv, (list, tuple)) or not conv:
                raise ValueError("a conversation is a non-empty list of messages")
            key = _repeat_key(conv)
            if key is not None:
                j = first.setdefault(key, len(texts))
                which.append(j)
                if j < len(texts):
                    continue
            else:
                which.append(len(texts))
            texts.append(self._templates.render(conv))
            keys = []
            for im in conversation_images(conv):
                h = seen.get(id(im))
                if h is None:
                    pil = _to_pil(im)
                    h = seen[id(im)] = image_keys.key(pil)
                    pending.setdefault(h, pil)
                keys.append(h)
            conv_imgs.append(keys)
        feats = self._encode_images(pending)
        convs = []
        img = self.image_token_id
        for raw, keys in zip(self._segments.encode(texts), conv_imgs):
            pads = positions(raw, img)
            if len(pads) != len(keys):
                raise ValueError(f"the chat template emitted {len(pads)} image placeholders for {len(keys)} images")
            ids: list[int] = []
            prev = end = 0
            for p, key in zip(pads, keys):  # expand each placeholder to the image's number of merged patches
                ids.extend(raw[prev:p])
                ids.extend([img] * feats[key].n_tokens)
                end, prev = len(ids), p + 1
            ids.extend(raw[prev:])
            convs.append(_Conv(ids=ids, images=keys, image_end=end,
                               image_digests=[image_keys.digest(k) for k in keys] if digests else None))
        return (convs if len(convs) == len(which) else [convs[j] for j in which]), feats

    def _encode_images(self, pending: dict[str, Any]) -> dict[str, _Img]:
        """Features of every image in ``pending`` (hash -> PIL), running the vision tower only on new ones."""
        cache = self._session_images if self._session_images is not None else {}
        missing = [h for h in pending if h not in cache]
        for s in range(0, len(missing), 16):  # bounded vision batches
            part = missing[s:s + 16]
            enc = self.pixels([pending[h] for h in part])
            pv = enc["pixel_values"].to(self.device)
            thw = enc["image_grid_thw"].to(self.device)
            out = self.model.model.get_image_features(pv, thw, return_dict=True)
            deep = getattr(out, "deepstack_features", None)
            grids = enc["image_grid_thw"].tolist()
            for i, h in enumerate(part):
                cache[h] = _Img(grid_thw=thw[i], n_tokens=int(thw[i].prod()) // self.merge ** 2, thw=tuple(grids[i]),
                                embeds=out.pooler_output[i],
                                deepstack=[d[i] for d in deep] if deep else None)
            self._feature_cls = type(out)
            self.stats["images_encoded"] += len(part)
        return {h: cache[h] for h in pending}

    # ------------------------------------------------------------------ prefix KV reuse
    def _plan(self, convs: list[_Conv]) -> tuple[list[tuple[list[int], list[str]]], dict[int, int], dict[int, int]]:
        """Shared prefixes: ``(prefixes [(ids, image keys)], split point per conversation, prefix per conversation)``.

        Conversations are grouped by the ids up to their last image; a group's prefix is its longest common
        token prefix (kept at least one token short of every member, so each row has a suffix to score).
        """
        groups: dict[tuple, list[int]] = {}
        for i, c in enumerate(convs):
            groups.setdefault((tuple(c.ids[:c.image_end]), tuple(c.images)), []).append(i)
        split: dict[int, int] = {}
        prefixes: list[tuple[list[int], list[str]]] = []
        prefix_of: dict[int, int] = {}
        for members in groups.values():
            seqs = [convs[i].ids for i in members]
            cut = min(lcp(seqs), min(len(s) for s in seqs) - 1)
            first = convs[members[0]]
            if cut < first.image_end:
                raise ValueError("a conversation ends inside its image block; nothing to answer")
            cut = max(cut, 1)
            pidx = len(prefixes)
            prefixes.append((first.ids[:cut], first.images))
            for i in members:
                split[i] = cut
                prefix_of[i] = pidx
        return prefixes, split, prefix_of

    def _row_chunks(self, convs: list[_Conv], feats: dict[str, _Img], rows: list[tuple[int, int]],
                    max_rows: int | None = None):
        """Yield ``(rows_chunk, run)``; ``run()`` prefills/forks and returns the first next-token logits. Within a
        group of prefixes the rows go in order of suffix length (a chunk is padded to its longest suffix)."""
        prefixes, split, prefix_of = self._plan(convs)
        rows_by_prefix: dict[int, list[tuple[int, int]]] = {}
        for r in rows:
            rows_by_prefix.setdefault(prefix_of[r[0]], []).append(r)
        order = sorted(rows_by_prefix)
        for s in range(0, len(order), self.max_prefixes):
            pids = order[s:s + self.max_prefixes]
            state = self._prefix_state([prefixes[p] for p in pids], feats)
            local = {p: j for j, p in enumerate(pids)}
            # rows of similar suffix length together: a chunk is padded to its longest suffix
            prow = sorted((r for p in pids for r in rows_by_prefix[p]),
                          key=lambda r: len(convs[r[0]].ids) - split[r[0]])
            step = max_rows or self.max_rows
            for t in range(0, len(prow), step):
                chunk = prow[t:t + step]
                suffixes = [convs[c].ids[split[c]:] for c, _ in chunk]
                which = [local[prefix_of[c]] for c, _ in chunk]
                yield chunk, (lambda extra=0, st=state, w=which, sf=suffixes: self._continue(st, w, sf, extra))

    def _prefill(self, prefixes: list[tuple[list[int], list[str]]], feats: dict[str, _Img]) -> dict[str, Any]:
        """The left-padded batch state of ``prefixes`` (cache, ids, mask, positions): on CPU the prefixes are
        split into buckets of similar length, one padded forward each (:func:`length_buckets`: the split that
        costs least when a forward costs ``prefill_forward_tokens`` tokens), laid out as one padded forward
        would (:func:`_stack_states`); else one padded forward (:meth:`_prefill_padded`).

        Why (issue 41): one padded forward computes every row to the longest prefix's length, so prefixes of
        mixed image sizes cost up to the longest one each; a forward per length pays the model's fixed cost of a
        forward instead. Each bucket is what it would be prefilled alone."""
        lengths = [len(p) for p, _ in prefixes]
        if not self.group_prefill or len(set(lengths)) < 2 or self.device.type != "cpu":
            return self._prefill_padded(prefixes, feats)
        buckets = length_buckets(lengths, self.prefill_forward_tokens)
        if len(buckets) == 1:
            return self._prefill_padded(prefixes, feats)
        parts = [(rows, self._prefill_padded([prefixes[j] for j in rows], feats)) for rows in buckets]
        return _stack_states(parts, len(prefixes), self.model.config)

    def _prefill_padded(self, prefixes: list[tuple[list[int], list[str]]], feats: dict[str, _Img]) -> dict[str, Any]:
        """One batched forward over left-padded prefixes. Returns the cache and per-row position bookkeeping."""
        import torch

        dev = self.device
        L = max(len(p) for p, _ in prefixes)
        P = len(prefixes)
        ids, mask = _left_padded([p for p, _ in prefixes], L, self.pad_id, dev)
        order = [h for _, keys in prefixes for h in keys]  # placeholder order, row-major
        got = self._prefix_positions(prefixes, feats, L)
        if got is not None:  # each row's positions as a verified computation gave them for its layout
            pos, next_pos = got
        else:
            mm_types = (ids == self.image_token_id).int()
            grid = torch.stack([feats[h].grid_thw for h in order]).to(dev) if order else None
            pos = self._rope_positions(mm_types, mask, grid)
            if pos is None:  # the model's own (a Python loop over rows and runs); next position from its deltas
                pos, deltas = self.model.model.get_rope_index(ids, mm_types, image_grid_thw=grid,
                                                              attention_mask=mask)
                next_pos = mask.sum(-1) + deltas.reshape(-1).to(dev)
            else:  # the same positions in a few vectorised operations; the next one follows the largest
                next_pos = pos.amax(dim=(0, 2)) + 1
        kwargs = self._encoder_outputs(order, feats)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **kwargs)
        self.stats["prefixes"] += P
        self.stats["prefill_tokens"] += sum(len(p) for p, _ in prefixes)  # the unmasked tokens
        return {"cache": _cache_of(out), "ids": ids, "mask": mask, "next_pos": next_pos, "pos": pos}

    def _encoder_outputs(self, order: list[str], feats: dict[str, _Img]) -> dict[str, Any]:
        """The ``mm_encoder_outputs`` keyword for the images ``order`` (content hashes, in placeholder order,
        row-major): their kept vision-tower features (and Qwen3-VL's deepstack features); empty without images."""
        if not order:
            return {}
        fk: dict[str, Any] = {"pooler_output": tuple(feats[h].embeds for h in order)}
        if feats[order[0]].deepstack is not None:
            n_layers = len(feats[order[0]].deepstack)
            fk["deepstack_features"] = [tuple(feats[h].deepstack[li] for h in order) for li in range(n_layers)]
        return {"mm_encoder_outputs": {"image": self._feature_cls(**fk)}}

    def _continue(self, state: dict[str, Any], which: list[int], suffixes: list[list[int]], extra: int = 0,
                  images: list[list[str]] | None = None, feats: dict[str, _Img] | None = None):
        """Forward the suffixes over forked prefix caches -> (last logits [R, V], cache, (mask, last positions
        [R], positions [3, R, S])).

        ``extra`` > 0: room for that many generated tokens (static cache; the returned mask already covers
        them: causality hides the slots not yet written). ``images`` / ``feats``: the image keys of each suffix
        (in placeholder order) and their features, for suffixes that hold images (a prefix extended past a
        shared stem, :meth:`_prefix_state`); their M-RoPE positions are the suffix's own, shifted to start at
        the prefix's next position (every prefix ends on a text token).
        """
        import torch

        dev = self.device
        R, S = len(suffixes), max(len(s) for s in suffixes)
        # every prefix row once, in order (one continuation per prefix, e.g. VQAScore): no row selection
        same = R == state["mask"].shape[0] and which == list(range(R))
        idx = None if same else torch.tensor(which, dtype=torch.long, device=dev)
        sids, smask = _left_padded(suffixes, S, self.pad_id, dev)
        full_mask = torch.cat([state["mask"] if same else state["mask"].index_select(0, idx), smask], dim=1)
        start = state["next_pos"] if same else state["next_pos"].index_select(0, idx)
        kwargs: dict[str, Any] = {}
        if any(self.image_token_id in s for s in suffixes):  # (searched in the lists: no tensor op)
            order = [h for keys in images or [] for h in keys]
            rel = None
            if order and feats is not None:
                grid = torch.stack([feats[h].grid_thw for h in order]).to(dev)
                rel = self._rope_positions((sids == self.image_token_id).int(), smask, grid)
            if rel is None:
                raise ValueError("image tokens in a continuation: conversations with shared images must share the "
                                 "text before them")
            pos = rel + start[None, :, None]
            kwargs = self._encoder_outputs(order, feats)
        else:
            pos = (start[:, None] + smask.cumsum(-1) - 1).clamp(min=0)[None].expand(3, R, S)
        if extra > 0:
            full_mask = torch.cat([full_mask, torch.ones((R, extra), dtype=full_mask.dtype, device=dev)], dim=1)
            cache = self._fork(state["cache"], idx, max_len=full_mask.shape[1])
        else:
            cache = self._fork(state["cache"], idx)
        attn = full_mask
        if self._additive_masks():  # the float mask SDPA would convert the boolean one to, built once
            W = full_mask.shape[1]
            attn = _additive_mask(full_mask, state["mask"].shape[1], S, self._float_dtype(),
                                  out=self._mask_buffer(R * S * W, self._float_dtype()))
        out = self.model(input_ids=sids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **kwargs, **_cache_arg(self.model, cache))
        self.stats["prefill_tokens"] += sum(len(s) for s in suffixes)  # the unmasked tokens
        return out.logits[:, -1], _cache_of(out), (full_mask, pos[0, :, -1], pos)
