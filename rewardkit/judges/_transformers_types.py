"""The data types the transformers judge (:mod:`.transformers_backend`) shares with its mixins
(:mod:`._transformers_cache`, :mod:`._transformers_decode`, :mod:`._transformers_packed`): one encoded image's
features (:class:`_Img`) and one tokenized conversation (:class:`_Conv`). They live below all four modules so
that the mixins never import their host."""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Any

__all__: list[str] = []


@dataclass
class _Img:
    grid_thw: Any  # LongTensor [3]
    n_tokens: int
    embeds: Any  # [n_tokens, hidden]
    deepstack: list | None  # Qwen3-VL: per deepstack layer [n_tokens, hidden]
    thw: tuple[int, int, int] | None = None  # grid_thw as ints (the key of cached rotary positions)


@dataclass
class _Conv:
    ids: list[int]
    images: list[str]  # content keys (judges._image_keys), in placeholder order
    image_end: int  # index after the last image token (0 when there is no image)
    digest: int | None = None  # stable per-content seed material: see seed_digest (computed when first needed)
    #: the images' full content hashes (rewardkit.media.image_hash), where the judge was asked for them
    image_digests: list[str] | None = None

    def seed_digest(self) -> int:
        """A stable 64-bit digest of the ids and the images' full content hashes (blake2b, the same in every
        process): the per-row seed material of seeded sampling. Computed on first use; only seeded sampling
        needs it (``_prepare(..., digests=True)``)."""
        if self.digest is None:
            if self.image_digests is None:
                raise RuntimeError("seed_digest needs the images' content hashes: _prepare(..., digests=True)")
            h = hashlib.blake2b(digest_size=8)
            h.update(array("q", self.ids).tobytes())
            h.update("".join(self.image_digests).encode())
            self.digest = int.from_bytes(h.digest(), "little")
        return self.digest
