"""The contract's input handling: :class:`RewardBatch` (what :meth:`Reward._score` receives) and
:class:`RewardInputs`, the mixin of :class:`~rewardkit.reward.Reward` that normalises, checks and decodes a call's
inputs (prompts, sources, metadata, images) and cuts it into decoded chunks.

Import :class:`RewardBatch` from :mod:`rewardkit.reward`, the contract's public module. Rewards override the
hooks here (``_check_sample_metadata``, ``_check_resized_size``, ``_image_processors``) on their ``Reward``
subclass as before; the mixin only keeps them out of ``reward.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from PIL import Image

from . import media
from .errors import RewardInputError

__all__ = ["RewardBatch", "RewardInputs"]



def _meta_entry_error(m: Any) -> str:
    return f"metadata entries must be dicts (or None), got {type(m).__name__}"




@dataclass
class RewardBatch:
    """A validated, normalised batch handed to :meth:`Reward._score`.

    Attributes:
        images: B canonical RGB PIL images; or, for rewards with ``supports_tensor_input`` called with a float
            ``[B, 3, H, W]`` tensor, that tensor (values in [0, 1], on the caller's device, not converted).
        prompts: B non-empty strings (or None entries when the reward has ``uses_prompt = False``).
        sources: B lists of canonical RGB PIL source / reference images ([] for text-to-image samples), or
            None when the call passed no sources.
        metadata: B dicts (empty when not given).
        indices: position of each sample in the caller's batch (for diagnostics).
        chunk_size: the caller's ``batch_size`` when the reward is ``batch_relative`` (it then receives the
            whole call as one batch and should forward this to the models / sub-rewards it runs).
    """

    images: list[Image.Image] | torch.Tensor
    prompts: list[str | None]
    sources: list[list[Image.Image]] | None = None
    metadata: list[dict[str, Any]] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        n = len(self.images)
        if not self.metadata:
            self.metadata = [{} for _ in range(n)]
        if not self.indices:
            self.indices = list(range(n))

    def __len__(self) -> int:
        return len(self.images)

    def select(self, idx: Sequence[int]) -> "RewardBatch":
        return RewardBatch(
            images=(self.images[torch.as_tensor(list(idx), dtype=torch.long, device=self.images.device)]
                    if isinstance(self.images, torch.Tensor) else [self.images[i] for i in idx]),
            prompts=[self.prompts[i] for i in idx],
            sources=None if self.sources is None else [self.sources[i] for i in idx],
            metadata=[self.metadata[i] for i in idx],
            indices=[self.indices[i] for i in idx],
            chunk_size=self.chunk_size,
        )



class RewardInputs:
    """Input handling of :class:`~rewardkit.reward.Reward` (a mixin: it reads the reward's ``name``, ``tasks``,
    ``uses_prompt``, ``scores_empty_prompt``, ``accepts_sources`` and ``requires_sources``)."""

    def _decoded_chunks(self, raw: list[Any], prompts: list[Any], srcs: list[Any] | None,
                        metas: list[dict[str, Any]], todo: list[int], chunk: int, errors: list[str | None],
                        on_error: str, deferred: bool = False):
        """Yield :class:`RewardBatch` es of up to ``chunk`` decoded samples, in call order.

        Samples are decoded only when their chunk is filled; one that fails to decode gets its error in
        ``errors`` (or raises with ``on_error="raise"``) and the chunk is refilled from the next samples.
        ``deferred``: the header checks of encoded images were left to the decode (:meth:`_precheck`).
        """
        imgs: list[Image.Image] = []
        src_lists: list[list[Image.Image]] = []
        idx: list[int] = []

        def batch() -> RewardBatch:
            return RewardBatch(images=imgs, prompts=[prompts[i] for i in idx],
                               sources=None if srcs is None else src_lists,
                               metadata=[metas[i] for i in idx], indices=idx)

        for i in todo:
            img, src, err = self._decode_sample(raw[i], None if srcs is None else srcs[i],
                                                deferred and media._is_encoded(raw[i]))
            if err is not None:
                errors[i] = err
                if on_error == "raise":
                    raise RewardInputError(err, index=i)
                continue
            imgs.append(img)
            src_lists.append(src)
            idx.append(i)
            img = src = None  # only the chunk's lists hold decoded images
            if len(idx) == chunk:
                yield batch()
                imgs, src_lists, idx = [], [], []  # drop our references: the chunk's images can be freed
        if idx:
            yield batch()

    def _check_sample_metadata(self, meta: dict[str, Any], sources: Any) -> str | None:
        """A reward's own check of one sample's metadata (e.g. EVR's ``reference_roles`` against the number of
        references): the reason it is unusable, or None. ``sources`` is the sample's raw, undecoded entry."""
        return None

    def _precheck(self, prompt: Any, image: Any, sources: Any, defer: bool = False) -> str | None:
        """Cheap per-sample checks (no pixel decoded); the reason a sample is bad, or None.

        ``defer=True`` (a call scored in one chunk): an encoded image's header checks (:meth:`_check_header`)
        are left to its decode, which reads the header anyway and runs them before any pixel is decoded: one
        header read per image instead of two, and still nothing scored before a bad image is refused (the
        decode fills the only chunk). The caller re-runs this without ``defer`` when another check fails, so
        a sample's reason is the same either way."""
        try:
            err = self._check_prompt(prompt)
            if err is None and not (defer and media._is_encoded(image)):
                err = self._check_image_size(image)
            if err is None and sources is not None:
                items, err = self._source_items(sources)
                for j, x in enumerate(items if err is None else ()):
                    e = self._check_image_size(x)
                    if e is not None:
                        return f"source {j}: {e}"
            return err
        except Exception as exc:  # noqa: BLE001 -- whatever a caller passes is that sample's error
            return f"cannot read this sample ({type(exc).__name__}: {exc})"

    def _check_image_size(self, x: Any) -> str | None:
        """Size checks from the header / shape: pixel limit, aspect ratio, size after this model's resize."""
        try:
            w, h = media._probe(x)
            media._check_size(w, h)
            self._check_resized_size(w, h)
        except media._Bad as exc:
            return str(exc)
        return None

    def _check_header(self, w: int, h: int) -> None:
        """:meth:`_check_image_size`'s checks of a ``w x h`` header, run by a deferred decode (``media._Bad``
        with the same reason; any other error is the sample's, worded as :meth:`_precheck` words it)."""
        try:
            media._check_size(w, h)
            self._check_resized_size(w, h)
        except media._Bad:
            raise
        except Exception as exc:  # noqa: BLE001
            raise media._Bad(f"cannot read this sample ({type(exc).__name__}: {exc})") from None

    def _check_resized_size(self, w: int, h: int) -> None:
        """Raise ``media._Bad`` when this model's resize of a ``w x h`` image is refused (default: each of
        :meth:`_image_processors`' rules). Override to add a model's own limit (HPSv2: a side rounding to 0)."""
        for ip in self._image_processors():
            media.check_resized_size(w, h, ip)

    def _image_processors(self) -> list[Any]:
        """The Hugging Face image processors this reward resizes images with (used to refuse images whose
        resized size would exceed the pixel limit before anything is decoded).

        Default: found on the reward's attributes (``x.image_processor``, ``x.processor.image_processor``,
        one level down). Override to declare them explicitly."""
        found = self.__dict__.get("_found_image_processors")
        if found is not None:
            return found
        found = []
        for v in list(vars(self).values()):
            for cand in (v, getattr(v, "processor", None), getattr(v, "backbone", None)):
                if cand is None or isinstance(cand, (str, bytes, int, float, dict, list, tuple)):
                    continue
                ip = getattr(cand, "image_processor", None)
                if ip is None and hasattr(cand, "processor"):
                    ip = getattr(cand.processor, "image_processor", None)
                if ip is not None and hasattr(ip, "size") and all(ip is not f for f in found):
                    found.append(ip)
        self.__dict__["_found_image_processors"] = found
        return found

    def _official_rgb(self, im: Image.Image) -> Image.Image:
        """The original package's conversion of an image as opened to RGB (``input_policy="official"``): PIL's
        ``convert("RGB")`` (alpha dropped, 16-bit clipped) unless a published reward overrides it."""
        return im.convert("RGB")

    def _image_converter(self) -> Any:
        """None (rewardkit's corrected decoding), or :meth:`_official_rgb` when the reward's config has
        ``input_policy="official"`` (published rewards; docs/zoo.md, "Input policy")."""
        return self._official_rgb if getattr(self.config, "input_policy", "corrected") == "official" else None

    def decode_image(self, x: Any, header_check: Any = None) -> Image.Image:
        """One image (path, bytes, PIL, array, tensor) -> the RGB PIL image this reward scores, under its input
        policy; raises ``media._Bad`` for an unusable one. ``header_check``: see ``media._to_pil``."""
        return media._to_pil(x, self._image_converter(), header_check)

    def _decode_sample(self, image: Any, sources: Any,
                       deferred: bool = False) -> tuple[Image.Image | None, list[Image.Image], str | None]:
        """Decode one sample (image + its sources); ``(image, sources, None)`` or ``(None, [], reason)``.
        ``deferred``: the image's header checks were left to this decode (:meth:`_precheck`)."""
        try:
            img = self.decode_image(image, self._check_header) if deferred else self.decode_image(image)
            src, err = self._decode_sources(sources)
            return (None, [], err) if err is not None else (img, src, None)
        except media._Bad as exc:
            return None, [], str(exc)
        except Exception as exc:  # noqa: BLE001 -- one sample's failure never takes down the batch
            return None, [], f"cannot read this sample ({type(exc).__name__}: {exc})"

    # ------------------------------------------------------------------ input validation
    def _prompts(self, prompt: Any, n: int) -> list[Any]:
        if prompt is None or isinstance(prompt, str):
            if prompt is None and self.uses_prompt:
                raise RewardInputError(f"reward {self.name!r} needs a prompt (got None)")
            return [prompt] * n
        if isinstance(prompt, bytes):
            raise RewardInputError("prompt must be str, got bytes (decode it first)")
        if isinstance(prompt, (Mapping, AbstractSet)):
            # a dict would give its keys and a set an arbitrary order: never what the caller meant
            raise RewardInputError(f"prompt must be a string or a list of strings, got {type(prompt).__name__} "
                                   "(unordered or keyed; pass a list in the order of the images)")
        try:
            prompts = list(prompt)
        except TypeError:
            raise RewardInputError(f"prompt must be a string or a list of strings, got {type(prompt).__name__}") from None
        if len(prompts) != n:
            raise RewardInputError(f"got {n} images but {len(prompts)} prompts (pass one string to broadcast)")
        return prompts

    def _check_prompt(self, p: Any) -> str | None:
        if p is None and not self.uses_prompt:
            return None
        if not isinstance(p, str):
            return f"prompt must be a string, got {type(p).__name__}"
        if self.uses_prompt and not p.strip() and not self.scores_empty_prompt:
            return "prompt is empty"
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\udc80", e.g. from surrogateescape): not text
            return (f"prompt is not valid Unicode text: lone surrogate {p[exc.start]!r} at position {exc.start} "
                    "(decode the bytes with errors='replace', or fix the source)")
        return None

    def _sources(self, sources: Any, n: int) -> list[Any] | None:
        if sources is None:
            if self.requires_sources and n:
                raise RewardInputError(f"reward {self.name!r} scores edits and needs sources= (the source image(s))")
            return None
        if not self.accepts_sources:
            raise RewardInputError(
                f"reward {self.name!r} does not take sources (tasks: {', '.join(sorted(self.tasks))}); "
                "drop sources= or use an editing reward")
        if isinstance(sources, (str, bytes)) or not isinstance(sources, (list, tuple)):
            raise RewardInputError("sources must be a list with one entry (a list of images) per sample")
        if len(sources) != n:
            raise RewardInputError(f"got {n} images but {len(sources)} source entries")
        return list(sources)

    def _source_items(self, entry: Any) -> tuple[list[Any], str | None]:
        """One sample's sources entry -> (list of undecoded images, None) or ([], reason)."""
        if entry is None:
            items: list[Any] = []
        elif isinstance(entry, (list, tuple)):
            items = list(entry)
        elif media._is_tensor(entry) and entry.ndim == 4:
            items = list(entry.unbind(0))
        else:
            items = [entry]
        if not items and self.requires_sources:
            return [], "this reward needs at least one source image"
        if len(items) > 1 and "multi_ref" not in self.tasks:
            return [], f"{len(items)} source images given but reward {self.name!r} takes one (no multi_ref task)"
        return items, None

    def _decode_sources(self, entry: Any) -> tuple[list[Image.Image], str | None]:
        items, err = self._source_items(entry)
        if err is not None:
            return [], err
        out = []
        for j, x in enumerate(items):
            try:
                out.append(self.decode_image(x))
            except media._Bad as exc:
                return [], f"source {j}: {exc}"
        return out, None

    def _metadata(self, metadata: Any, n: int) -> list[dict[str, Any]]:
        if metadata is None:
            return [{} for _ in range(n)]
        if isinstance(metadata, dict):
            raise RewardInputError("metadata must be a list of per-sample dicts, got one dict")
        if isinstance(metadata, (str, bytes, set, frozenset)):
            raise RewardInputError(f"metadata must be a list of per-sample dicts, got {type(metadata).__name__}")
        try:
            metas = list(metadata)
        except TypeError:
            raise RewardInputError(f"metadata must be a list of per-sample dicts (or None), got "
                                   f"{type(metadata).__name__} {metadata!r:.40}") from None
        if len(metas) != n:
            raise RewardInputError(f"got {n} images but {len(metas)} metadata entries")
        for i, m in enumerate(metas):
            if m is not None and not isinstance(m, Mapping):
                raise RewardInputError(_meta_entry_error(m), index=i)
        return [dict(m) if m else {} for m in metas]

    def _metadata_entries(self, metadata: Any, n: int) -> tuple[list[dict[str, Any]], list[str | None]]:
        """Like :meth:`_metadata`, but an entry that is not a dict is that sample's error (``{}`` in its place)
        instead of the call's: call-level problems (wrong container, wrong length) still raise."""
        if metadata is None or isinstance(metadata, (dict, str, bytes, set, frozenset)) \
                or not isinstance(metadata, (list, tuple)):
            return self._metadata(metadata, n), [None] * n
        metas = list(metadata)
        errs = [None if (m is None or isinstance(m, Mapping)) else _meta_entry_error(m) for m in metas]
        clean = [None if e else m for m, e in zip(metas, errs)]
        return self._metadata(clean, n), errs
