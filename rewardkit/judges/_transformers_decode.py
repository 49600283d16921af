"""The decoding loop of the transformers judge: greedy or per-row seeded sampling over forked prefix caches,
so that a row's sample does not depend on what else is in the batch. :class:`DecodeMixin` reads the judge's
``model``, ``tokenizer``, ``eos_ids``, ``pad_id`` and ``stats`` and forks with its ``_fork``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._transformers_cache import _additive_mask, _cache_arg, _cache_of

if TYPE_CHECKING:
    from ._transformers_types import _Conv

__all__ = ["DecodeMixin"]


class DecodeMixin:
    """Decoding of :class:`TransformersJudge`."""

    # ------------------------------------------------------------------ decoding
    def _decode(self, run, convs: list[_Conv], n: int, *, temperature: float, max_new_tokens: int,
                stop: list[str], seed: int | None) -> list[str]:
        """Decode ``n`` continuations per conversation -> ``len(convs) * n`` texts (conversation-major)."""
        import torch

        extra = max(max_new_tokens - 1, 0)
        logits, cache, (mask, last_pos, _) = run(extra)
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
                g.manual_seed((seed * 1_000_003 + c.seed_digest() * 31 + k) % (2 ** 63))
                gens.append(g)
        eos = torch.tensor(self.eos_ids or [-1], device=dev)
        attn = None
        first = mask.shape[1] - extra  # cache column of the first decoded token (static cache)
        if extra and self._additive_masks():
            # the additive mask of one query, opened by one column per step (instead of building it from the
            # 2-D mask in every step's forward)
            attn = _additive_mask(mask, first - 1, 1, self.model.dtype)
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
            if attn is not None:
                attn[:, :, :, first + step] = 0.0
            out = self.model(input_ids=nxt[:, None], attention_mask=mask if attn is None else attn,
                             position_ids=last_pos.view(1, R, 1).expand(3, R, 1), use_cache=True,
                             logits_to_keep=1, **_cache_arg(self.model, cache))
            logits, cache = out.logits[:, -1], _cache_of(out)
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
        if stop:
            texts = [_cut_at_stop(t, stop) for t in texts]
        return texts



def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
    return text[:cut]

