"""Packed choice scoring of the transformers judge (``packed_scoring=True``): the suffixes of a prefix packed
into rows after a single copy of the prefix KV cache, with a 4-D block mask ("tree" attention).
:class:`PackedScoringMixin` uses the judge's ``_plan``, ``_prefix_state`` and ``_fork``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._transformers_cache import _cache_arg

if TYPE_CHECKING:
    from ._transformers_types import _Conv, _Img

__all__ = ["PackedScoringMixin"]


class PackedScoringMixin:
    """Packed scoring of :class:`TransformersJudge`."""

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

