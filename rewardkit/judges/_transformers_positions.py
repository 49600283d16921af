"""Rotary positions of the transformers judge's prefixes (:class:`PositionsMixin`, a mixin of
:class:`~rewardkit.judges.transformers_backend.TransformersJudge`): the batch's M-RoPE positions computed by
:func:`rewardkit.models.rope.mrope_position_ids`, and each prefix row's kept per layout, so that a question about
an image of a size met before costs a look-up (issue 41). It reads the judge's ``model``, ``image_token_id``,
``merge``, ``device``, ``_pos_cache`` and ``_pos_cache_on``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._transformers_types import _Img

__all__ = ["PositionsMixin"]

#: the most row layouts kept (then the cache starts again)
_MAX_LAYOUTS = 1024


class PositionsMixin:
    """Prefix positions of :class:`TransformersJudge`."""

    def _prefix_positions(self, prefixes: list[tuple[list[int], list[str]]], feats: dict[str, _Img], L: int):
        """``([3, P, L] positions, [P] next positions)`` of the prefixes left-padded to ``L``, each row taken from
        a cache of unpadded row positions keyed by the row's layout (length, and start and grid of each image
        run), or None (a row this does not cover: the batch is then computed as before).

        A row's M-RoPE positions depend on nothing else (padding only shifts them into later columns and puts 0
        in its own), so a layout met before (the same question about an image of the same size) costs a look-up.
        A layout is checked against the ids (each image run is exactly its placeholder tokens and there are no
        others) and computed on a miss by :meth:`_rope_positions` on the row alone (``mrope_position_ids``:
        equal to the model's ``get_rope_index``)."""
        import numpy as np
        import torch

        if not self._pos_cache_on:
            return None
        img = self.image_token_id
        rows = []
        for ids, keys in prefixes:
            layout: list[Any] = [len(ids)]
            at = n_img = 0
            for h in keys:
                f = feats[h]
                if f.thw is None:
                    return None
                try:
                    s = ids.index(img, at)
                except ValueError:
                    return None
                n = f.n_tokens
                if ids[s:s + n] != [img] * n:
                    return None
                layout.append((s, f.thw))
                at, n_img = s + n, n_img + n
            if not keys or ids.count(img) != n_img:
                return None
            key = tuple(layout)
            hit = self._pos_cache.get(key)
            if hit is None:
                row = torch.tensor([ids], dtype=torch.long) == img
                grid = torch.tensor([feats[h].thw for h in keys], dtype=torch.long)
                pos = self._rope_positions(row.int(), None, grid)
                if pos is None:
                    return None
                arr = pos[:, 0].cpu().numpy().copy()
                hit = (arr, int(arr.max()) + 1)
                if len(self._pos_cache) >= _MAX_LAYOUTS:
                    self._pos_cache.clear()
                self._pos_cache[key] = hit
            rows.append(hit)
        out = np.zeros((3, len(rows), L), dtype=np.int64)
        for r, (arr, _) in enumerate(rows):
            out[:, r, L - arr.shape[1]:] = arr
        dev = self.device
        return torch.from_numpy(out).to(dev), torch.tensor([nx for _, nx in rows], dtype=torch.long).to(dev)

    def _rope_positions(self, mm_types: Any, mask: Any, grid: Any):
        """``[3, P, L]`` M-RoPE positions of left-padded prefixes with images, computed by
        :func:`rewardkit.models.rope.mrope_position_ids` (equal to ``get_rope_index`` for still images of the
        Qwen-VL models it is verified on, ``tests/models/test_rope.py``), or None: the model computes them."""
        from ..models.rope import VERIFIED_MODEL_TYPES, mrope_position_ids

        if grid is None or getattr(self.model.config, "model_type", None) not in VERIFIED_MODEL_TYPES:
            return None
        return mrope_position_ids(mm_types, mask, grid, self.merge)
