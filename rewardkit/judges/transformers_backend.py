"""Judge backend on a local transformers vision-language model (Qwen2-VL / Qwen2.5-VL / Qwen3-VL family).

Why this is not ``model.generate(**processor(...))`` per question: a judge reward asks the same image many
questions (EVR: 5 dimensions x K hypotheses + one verification per hypothesis). The naive loop re-runs the
vision tower and re-prefills the image + instruction prefix for every question. This backend

1. deduplicates images by content and runs the vision tower once per distinct image (and once per
   :meth:`~JudgeBackend.session` when a reward asks several batches of questions about the same images);
2. groups conversations by their shared leading tokens (everything up to the last image, extended to the
   longest common token prefix of the group), prefills each distinct prefix once and forks its KV cache
   (row index-select) for every continuation; rotary positions (3-D M-RoPE) are passed explicitly, never
   read from the model's mutable ``rope_deltas``;
3. decodes with its own loop (greedy or per-row seeded sampling) so that a row's sample does not depend
   on what else is in the batch.

Tensor layout of a continuation row: ``[left pad | prefix | suffix pad | suffix]``; the pads are masked
and the suffix positions continue from the prefix's last position.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ._prep import SegmentTokenizer, TemplateCache, lcp, positions
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


@dataclass
class _Img:
    grid_thw: Any  # LongTensor [3]
    n_tokens: int
    embeds: Any  # [n_tokens, hidden]
    deepstack: list | None  # Qwen3-VL: per deepstack layer [n_tokens, hidden]


@dataclass
class _Conv:
    ids: list[int]
    images: list[str]  # content hashes, in placeholder order
    image_end: int  # index after the last image token (0 when there is no image)
    digest: int  # stable per-content seed material


_lcp = lcp  # longest common token prefix (rewardkit.judges._prep)


class TransformersJudge(JudgeBackend):
    """A judge on any local ``AutoModelForImageTextToText`` checkpoint of the Qwen-VL family.

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
    """

    kind = "transformers"

    def __init__(self, model: Any, processor: Any = None, *, device: Any = None, dtype: Any = None,
                 max_rows: int = 64, max_prefixes: int = 16, packed_scoring: bool = False, pack_tokens: int = 512,
                 trust_remote_code: bool = False, attn_implementation: str | None = None,
                 prefix_cache_mb: float = 2048.0) -> None:
        if isinstance(model, str):
            from ..models.vlm import load_vlm

            self.model_id = model
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
        self.model = model.eval()
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
        self._lock = threading.RLock()
        self._session_images: dict[str, _Img] | None = None
        #: session prefix cache: (prefix ids, image keys) -> unpadded per-prefix KV (see _prefix_state)
        self._session_prefixes: dict[tuple, dict[str, Any]] | None = None
        self.prefix_cache_bytes = int(prefix_cache_mb * 2 ** 20)
        self._cached_bytes = 0
        # the chat template run once per conversation shape, each text piece tokenized once (judges._prep)
        self._templates = TemplateCache(self._render)
        self._segments = SegmentTokenizer(self.tokenizer)

    # ------------------------------------------------------------------ protocol
    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": str(self.model_id), "dtype": str(self.model.dtype).replace("torch.", "")}

    def to(self, device: Any) -> "TransformersJudge":
        with self._lock:
            self.model.to(device)
        return self

    @property
    def device(self):
        return next(self.model.parameters()).device

    @contextmanager
    def session(self) -> Iterator["TransformersJudge"]:
        """Within the block, each distinct image is encoded once across all calls (features are kept)."""
        with self._lock:
            outer = self._session_images is not None
            if not outer:
                self._session_images = {}
                self._session_prefixes = {} if self.prefix_cache_bytes > 0 and self._sliceable() else None
                self._cached_bytes = 0
            try:
                yield self
            finally:
                if not outer:
                    self._session_images = None
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
            convs, images = self._prepare(conversations)
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
            return out

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
        bad = ~torch.isfinite(out).all(1)
        out[bad] = float("nan")
        if reasons is not None:
            reasons[:] = ["the judge model's logits are not finite" if bool(b) else None for b in bad]
        return out

    def _next_token_scores(self, conversations: Sequence[Conversation], choices: Sequence[str], fn):
        """``fn(float32 next-token logits [R, V], choice ids) -> [R, C]`` for every conversation -> ``[B, C]``."""
        import torch

        ids = self.choice_token_ids(choices)
        if not conversations:
            return torch.zeros(0, len(ids))
        with self._lock, torch.inference_mode():
            convs, images = self._prepare(conversations)
            probs = torch.zeros(len(convs), len(ids))
            if self.packed_scoring and self._attn_impl() in ("sdpa", "eager"):
                for members, logits in self._packed_logits(convs, images):
                    probs[members] = fn(logits.float(), ids).cpu()
                return probs
            rows = [(c, 0) for c in range(len(convs))]
            for chunk, run in self._row_chunks(convs, images, rows):
                logits, _, _ = run()  # [R, V]
                probs[[c for c, _ in chunk]] = fn(logits.float(), ids).cpu()
            return probs

    def choice_token_ids(self, choices: Sequence[str]) -> list[int]:
        """Token id of each choice; :class:`ChoiceError` when one is not exactly one token."""
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

    def _prepare(self, conversations: Sequence[Conversation]) -> tuple[list[_Conv], dict[str, _Img]]:
        """Token ids with image placeholders expanded, plus the encoded features of every distinct image."""
        from ..media import _to_pil, image_hash

        texts, conv_imgs = [], []
        pending: dict[str, Any] = {}
        seen: dict[int, str] = {}  # id(image object) -> content hash: the same object is hashed once per call
        for conv in conversations:
            if not isinstance(conv, (list, tuple)) or not conv:
                raise ValueError("a conversation is a non-empty list of messages")
            texts.append(self._templates.render(conv))
            keys = []
            for im in conversation_images(conv):
                h = seen.get(id(im))
                if h is None:
                    pil = _to_pil(im)
                    h = seen[id(im)] = image_hash(pil)
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
            h = hashlib.blake2b(digest_size=8)
            h.update(array("q", ids).tobytes())
            h.update("".join(keys).encode())
            convs.append(_Conv(ids=ids, images=keys, image_end=end, digest=int.from_bytes(h.digest(), "little")))
        return convs, feats

    def _encode_images(self, pending: dict[str, Any]) -> dict[str, _Img]:
        """Features of every image in ``pending`` (hash -> PIL), running the vision tower only on new ones."""
        cache = self._session_images if self._session_images is not None else {}
        missing = [h for h in pending if h not in cache]
        for s in range(0, len(missing), 16):  # bounded vision batches
            part = missing[s:s + 16]
            enc = self.processor.image_processor(images=[pending[h] for h in part], return_tensors="pt")
            pv = enc["pixel_values"].to(self.device)
            thw = enc["image_grid_thw"].to(self.device)
            out = self.model.model.get_image_features(pv, thw, return_dict=True)
            deep = getattr(out, "deepstack_features", None)
            for i, h in enumerate(part):
                cache[h] = _Img(grid_thw=thw[i], n_tokens=int(thw[i].prod()) // self.merge ** 2,
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
            cut = min(_lcp(seqs), min(len(s) for s in seqs) - 1)
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
        """Yield ``(rows_chunk, run)``; ``run()`` prefills/forks and returns the first next-token logits."""
        prefixes, split, prefix_of = self._plan(convs)
        rows_by_prefix: dict[int, list[tuple[int, int]]] = {}
        for r in rows:
            rows_by_prefix.setdefault(prefix_of[r[0]], []).append(r)
        order = sorted(rows_by_prefix)
        for s in range(0, len(order), self.max_prefixes):
            pids = order[s:s + self.max_prefixes]
            state = self._prefix_state([prefixes[p] for p in pids], feats)
            local = {p: j for j, p in enumerate(pids)}
            prow = [r for p in pids for r in rows_by_prefix[p]]
            step = max_rows or self.max_rows
            for t in range(0, len(prow), step):
                chunk = prow[t:t + step]
                suffixes = [convs[c].ids[split[c]:] for c, _ in chunk]
                which = [local[prefix_of[c]] for c, _ in chunk]
                yield chunk, (lambda extra=0, st=state, w=which, sf=suffixes: self._continue(st, w, sf, extra))

    def _attn_impl(self) -> str | None:
        cfg = self.model.config
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return getattr(text, "_attn_implementation", None) or getattr(cfg, "_attn_implementation", None)

    def _packed_logits(self, convs: list[_Conv], feats: dict[str, _Img]):
        """Next-token logits of every conversation, suffixes packed per prefix ("tree" attention).

        Suffixes that share a prefix go into rows of up to ``pack_tokens`` tokens after a single copy of the prefix KV cache; a 4-D
        mask lets each suffix token see the prefix and the earlier tokens of its own suffix only, and each
        suffix's positions restart at the prefix's next position. Yields ``(conversation indices, logits [m, V])``.
        """
        prefixes, split, prefix_of = self._plan(convs)
        members: dict[int, list[int]] = {}
        for c in range(len(convs)):
            members.setdefault(prefix_of[c], []).append(c)
        order = sorted(members)
        for s in range(0, len(order), self.max_prefixes):
            pids = order[s:s + self.max_prefixes]
            state = self._prefix_state([prefixes[p] for p in pids], feats)
            rows: list[tuple[int, list[int]]] = []  # (local prefix index, conversations packed in the row)
            for j, p in enumerate(pids):
                cur: list[int] = []
                n_tok = 0
                for c in members[p]:
                    L = len(convs[c].ids) - split[c]
                    if cur and n_tok + L > self.pack_tokens:
                        rows.append((j, cur))
                        cur, n_tok = [], 0
                    cur.append(c)
                    n_tok += L
                rows.append((j, cur))
            for t in range(0, len(rows), self.max_prefixes):
                chunk = rows[t:t + self.max_prefixes]
                suffixes = [[convs[c].ids[split[c]:] for c in cs] for _, cs in chunk]
                logits = self._forward_packed(state, [j for j, _ in chunk], suffixes)
                yield [c for _, cs in chunk for c in cs], logits

    def _forward_packed(self, state: dict[str, Any], which: list[int], suffixes: list[list[list[int]]]):
        """Rows of packed suffixes over forked prefixes -> logits ``[sum of suffixes, V]`` at each suffix end."""
        import torch

        dev = self.device
        R = len(which)
        T = max(sum(len(x) for x in sf) for sf in suffixes)
        ids = torch.full((R, T), self.pad_id, dtype=torch.long)
        seg = torch.full((R, T), -1, dtype=torch.long)
        pos = torch.zeros((R, T), dtype=torch.long)
        next_pos = state["next_pos"].tolist()
        rr, tt = [], []
        for r, (p, sf) in enumerate(zip(which, suffixes)):
            t = T - sum(len(x) for x in sf)  # left padding
            for j, x in enumerate(sf):
                L = len(x)
                ids[r, t:t + L] = torch.tensor(x)
                seg[r, t:t + L] = j
                pos[r, t:t + L] = torch.arange(next_pos[p], next_pos[p] + L)
                t += L
                rr.append(r)
                tt.append(t - 1)
        if (ids == self.image_token_id).any():
            raise ValueError("image tokens in a continuation: conversations with shared images must share the text before them")
        real = seg >= 0
        same = (seg[:, :, None] == seg[:, None, :]) & real[:, :, None]
        own = same & torch.ones(T, T, dtype=torch.bool).tril()
        own |= torch.eye(T, dtype=torch.bool)  # a pad query sees itself: no fully masked row, no NaN
        idx = torch.tensor(which, dtype=torch.long, device=dev)
        pmask = state["mask"].index_select(0, idx).bool().cpu()
        allow = torch.cat([pmask[:, None, :] & real[:, :, None], own], dim=-1)[:, None].to(dev)  # [R, 1, T, Lp+T]
        if self._attn_impl() == "eager":
            dtype = self.model.dtype
            mask = torch.zeros(allow.shape, dtype=dtype, device=dev).masked_fill(~allow, torch.finfo(dtype).min)
        else:
            mask = allow
        cache = self._fork(state["cache"], idx)
        out = self.model.model(input_ids=ids.to(dev), attention_mask=mask,
                               position_ids=pos.to(dev)[None].expand(3, R, T), use_cache=True,
                               **_cache_arg(self.model.model, cache))
        self.stats["prefill_tokens"] += int(real.sum())
        hidden = out.last_hidden_state[torch.tensor(rr, device=dev), torch.tensor(tt, device=dev)]
        return self.model.lm_head(hidden)

    def _prefill(self, prefixes: list[tuple[list[int], list[str]]], feats: dict[str, _Img]) -> dict[str, Any]:
        """One batched forward over left-padded prefixes. Returns the cache and per-row position bookkeeping."""
        import torch

        dev = self.device
        L = max(len(p) for p, _ in prefixes)
        P = len(prefixes)
        ids, mask = _left_padded([p for p, _ in prefixes], L, self.pad_id, dev)
        order = [h for _, keys in prefixes for h in keys]  # placeholder order, row-major
        mm_types = (ids == self.image_token_id).int()
        grid = torch.stack([feats[h].grid_thw for h in order]).to(dev) if order else None
        pos, deltas = self.model.model.get_rope_index(ids, mm_types, image_grid_thw=grid, attention_mask=mask)
        kwargs: dict[str, Any] = {}
        if order:
            fk: dict[str, Any] = {"pooler_output": tuple(feats[h].embeds for h in order)}
            if feats[order[0]].deepstack is not None:
                n_layers = len(feats[order[0]].deepstack)
                fk["deepstack_features"] = [tuple(feats[h].deepstack[li] for h in order) for li in range(n_layers)]
            kwargs["mm_encoder_outputs"] = {"image": self._feature_cls(**fk)}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **kwargs)
        valid = mask.sum(-1)
        self.stats["prefixes"] += P
        self.stats["prefill_tokens"] += int(valid.sum())
        # next text position after row j's prefix: its valid length shifted by the M-RoPE delta
        return {"cache": _cache_of(out), "ids": ids, "mask": mask, "next_pos": valid + deltas.reshape(-1).to(dev),
                "pos": pos}

    # ------------------------------------------------------------------ session prefix cache
    def _sliceable(self) -> bool:
        """Full-attention KV only: a cached prefix's first n positions are then exactly the KV a fresh prefill
        of those n tokens gives (hybrid linear-attention caches are not sliceable)."""
        cfg = self.model.config
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        types = getattr(text, "layer_types", None)
        return not types or all(t == "full_attention" for t in types)

    def _prefix_state(self, prefixes: list[tuple[list[int], list[str]]], feats: dict[str, _Img]) -> dict[str, Any]:
        """A batched prefix state like :meth:`_prefill`'s, reusing the session's cached prefixes.

        Per prefix: an exact hit is used as is; else the cached prefix with the longest shared token prefix
        that holds all of this prefix's images (same images, same order) and ends on a text token is sliced
        to the shared part and only the remaining text is run (positions continue from the shared part);
        else it is prefilled. New prefixes are kept (bounded, oldest dropped first).
        """
        cache = self._session_prefixes
        if cache is None:
            return self._prefill(prefixes, feats)
        import torch

        entries: list[dict[str, Any] | None] = [None] * len(prefixes)
        fresh: list[int] = []
        ext: list[tuple[int, dict[str, Any], int]] = []
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
                ext.append((j, parent, n))
        if fresh:
            st = self._prefill([prefixes[j] for j in fresh], feats)
            for r, j in enumerate(fresh):
                valid = st["mask"][r].bool()
                kv = [(layer.keys[r][:, valid], layer.values[r][:, valid]) for layer in st["cache"].layers]
                entries[j] = self._keep(*prefixes[j], {"kv": kv, "pos": st["pos"][:, r, valid],
                                                       "next": int(st["next_pos"][r])})
        if ext:
            parents = [self._slice(p, n) for _, p, n in ext]
            st = self._assemble(parents)
            rems = [prefixes[j][0][n:] for j, _, n in ext]
            _, out_cache, (mask, _) = self._continue(st, list(range(len(ext))), rems)
            for r, ((j, _, n), par, rem) in enumerate(zip(ext, parents, rems)):
                valid = mask[r].bool()
                kv = [(layer.keys[r][:, valid], layer.values[r][:, valid]) for layer in out_cache.layers]
                tail = torch.arange(par["next"], par["next"] + len(rem), device=par["pos"].device)
                entries[j] = self._keep(*prefixes[j], {"kv": kv, "pos": torch.cat([par["pos"], tail.expand(3, -1)], 1),
                                                       "next": par["next"] + len(rem)})
                self.stats["prefix_reused_tokens"] += n
        return self._assemble(entries)

    def _best_parent(self, ids: list[int], keys: list[str]) -> tuple[dict[str, Any] | None, int]:
        img = self.image_token_id
        img_end = max((i + 1 for i, t in enumerate(ids) if t == img), default=0)
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

    def _fork(self, cache: Any, idx: Any, max_len: int | None = None) -> Any:
        """A new cache holding rows ``idx`` of ``cache`` (never reuse a cache a forward has extended).

        ``max_len`` set: a preallocated ``StaticCache`` of that length (decoding then writes in place instead of
        concatenating the whole cache at every step); otherwise a ``DynamicCache``.
        """
        from transformers import DynamicCache, StaticCache

        data = []
        for layer in cache.layers:
            n = int(layer.get_seq_length())
            data.append((layer.keys[:, :, :n].index_select(0, idx), layer.values[:, :, :n].index_select(0, idx)))
        if max_len is None:
            return DynamicCache(ddp_cache_data=data, config=self.model.config)
        new = StaticCache(config=self.model.config, max_cache_len=max_len)
        for layer, (k, v) in zip(new.layers, data):
            layer.update(k, v)
        return new

    def _continue(self, state: dict[str, Any], which: list[int], suffixes: list[list[int]], extra: int = 0):
        """Forward the suffixes over forked prefix caches -> (last logits [R, V], cache, decode state).

        ``extra`` > 0: room for that many generated tokens (static cache; the returned mask already covers
        them: causality hides the slots not yet written).
        """
        import torch

        dev = self.device
        idx = torch.tensor(which, dtype=torch.long, device=dev)
        R, S = len(suffixes), max(len(s) for s in suffixes)
        sids, smask = _left_padded(suffixes, S, self.pad_id, dev)
        full_mask = torch.cat([state["mask"].index_select(0, idx), smask], dim=1)
        start = state["next_pos"].index_select(0, idx)
        spos = (start[:, None] + smask.cumsum(-1) - 1).clamp(min=0)
        if self.image_token_id in sids:
            raise ValueError("image tokens in a continuation: conversations with shared images must share the text before them")
        if extra > 0:
            full_mask = torch.cat([full_mask, torch.ones((R, extra), dtype=full_mask.dtype, device=dev)], dim=1)
            cache = self._fork(state["cache"], idx, max_len=full_mask.shape[1])
        else:
            cache = self._fork(state["cache"], idx)
        out = self.model(input_ids=sids, attention_mask=full_mask, position_ids=spos[None].expand(3, R, S),
                         use_cache=True, logits_to_keep=1, **_cache_arg(self.model, cache))
        self.stats["prefill_tokens"] += int(smask.sum())
        return out.logits[:, -1], _cache_of(out), (full_mask, spos[:, -1])

    # ------------------------------------------------------------------ decoding
    def _decode(self, run, convs: list[_Conv], n: int, *, temperature: float, max_new_tokens: int,
                stop: list[str], seed: int | None) -> list[str]:
        """Decode ``n`` continuations per conversation -> ``len(convs) * n`` texts (conversation-major)."""
        import torch

        extra = max(max_new_tokens - 1, 0)
        logits, cache, (mask, last_pos) = run(extra)
        dev = logits.device
        if n > 1:  # fork every row n times (sample k of conversation c is row c * n + k)
            rep = torch.arange(len(convs), device=dev).repeat_interleave(n)
            logits, mask, last_pos = logits[rep], mask[rep], last_pos[rep]
            cache = self._fork(cache, rep, max_len=mask.shape[1] if extra else None)
        R = logits.shape[0]
        sample_idx = [k for _ in convs for k in range(n)]
        convs = [c for c in convs for _ in range(n)]
        gens = None
        if temperature > 0 and seed is not None:
            # one generator per row, seeded by (seed, conversation content, sample index): a row's sample
            # does not depend on what else is in the batch (chunked == whole batch)
            gens = []
            for c, k in zip(convs, sample_idx):
                g = torch.Generator(device=dev)
                g.manual_seed((seed * 1_000_003 + c.digest * 31 + k) % (2 ** 63))
                gens.append(g)
        eos = torch.tensor(self.eos_ids or [-1], device=dev)
        tokens: list[list[int]] = [[] for _ in range(R)]
        done = torch.zeros(R, dtype=torch.bool, device=dev)
        for step in range(max_new_tokens):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                if gens is None:
                    nxt = torch.multinomial(probs, 1).squeeze(1)
                else:
                    nxt = torch.cat([torch.multinomial(probs[r], 1, generator=gens[r]) for r in range(R)])
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            is_eos = torch.isin(nxt, eos) & ~done
            done = done | is_eos
            done_l = done.tolist()  # one transfer per step, not one per row
            for r, t in enumerate(nxt.tolist()):
                if not done_l[r]:
                    tokens[r].append(t)
            if stop:
                hit = [r for r in range(R) if not done_l[r]
                       and any(s in self.tokenizer.decode(tokens[r][-32:]) for s in stop)]
                if hit:
                    done[hit] = True
            self.stats["decode_tokens"] += int((~done).sum())
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            if not extra:
                mask = torch.cat([mask, torch.ones((R, 1), dtype=mask.dtype, device=dev)], dim=1)
            last_pos = last_pos + 1
            out = self.model(input_ids=nxt[:, None], attention_mask=mask,
                             position_ids=last_pos.view(1, R, 1).expand(3, R, 1), use_cache=True,
                             logits_to_keep=1, **_cache_arg(self.model, cache))
            logits, cache = out.logits[:, -1], _cache_of(out)
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
        if stop:
            texts = [_cut_at_stop(t, stop) for t in texts]
        return texts


def _left_padded(rows: list[list[int]], width: int, pad: int, device: Any):
    """``(ids, mask)`` ``[len(rows), width]`` int64 on ``device``, each row left-padded: one tensor each, built
    from Python lists (not one small tensor per row)."""
    import torch

    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids.to(device), mask.to(device)


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


def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
    return text[:cut]
