"""The contract: ``Reward``, ``RewardOutput``, ``PairwiseOutput``, ``RewardBatch``.

A reward implements one method, :meth:`Reward._score`, on an already validated and normalised
:class:`RewardBatch`. The base class owns everything else: input normalisation (via :mod:`rewardkit.media`),
per-sample error handling, chunking, ``inference_mode``, output validation, thread safety, ``compare``.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, ClassVar, Sequence

import torch
from PIL import Image

from . import media
from .config import build_config
from .errors import ConfigError, RewardInputError

__all__ = ["Reward", "RewardOutput", "PairwiseOutput", "RewardBatch", "RewardConfig", "TASKS"]

TASKS = frozenset({"t2i", "edit", "multi_ref"})
_ON_ERROR = ("raise", "nan")


def _device_arg(device: Any) -> Any:
    from .models.vlm import device_arg

    try:
        return device_arg(device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _meta_entry_error(m: Any) -> str:
    return f"metadata entries must be dicts (or None), got {type(m).__name__}"


def _mask(valid: Any, n: int) -> torch.Tensor:
    """A reward's ``valid`` as a bool ``[n]`` tensor; a mask of another length is a bug, never broadcast."""
    mask = torch.as_tensor(valid, dtype=torch.bool).reshape(-1)
    if mask.shape[0] != n:
        raise ValueError(f"valid has {mask.shape[0]} entries for {n} values")
    return mask


def _json_float(x: float) -> float | None:
    return None if (x is None or math.isnan(x) or math.isinf(x)) else float(x)


@dataclass
class RewardOutput:
    """Scores for a batch of B samples.

    Attributes:
        scores: float32 tensor ``[B]``; NaN where a sample is invalid or the reward does not apply.
        valid: bool tensor ``[B]``.
        errors: ``B`` entries, the reason a sample is invalid (None when valid).
        dimensions: name -> float32 tensor ``[B]`` of per-dimension scores (NaN where not available).
        rationales: ``B`` optional texts (judges), or None.
        info: JSON-serialisable call-level extras (model id, template version, ...).
        details: ``B`` optional JSON-serialisable per-sample extras (e.g. a judge's verdicts), or None.
    """

    scores: torch.Tensor
    valid: torch.Tensor | None = None
    errors: list[str | None] | None = None
    dimensions: dict[str, torch.Tensor] = field(default_factory=dict)
    rationales: list[str | None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    details: list[dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        self.scores = torch.as_tensor(self.scores, dtype=torch.float32).detach().cpu().reshape(-1) \
            if not (isinstance(self.scores, torch.Tensor) and self.scores.requires_grad) \
            else self.scores.float().reshape(-1)
        n = self.scores.shape[0]
        finite = torch.isfinite(self.scores.detach()).cpu()  # one transfer when scores stay on a device (grad)
        self.valid = finite.clone() if self.valid is None else _mask(self.valid, n).cpu() & finite
        if self.errors is None:
            self.errors = [None] * n
        self.errors = list(self.errors)
        if len(self.errors) != n:  # before the loop below indexes it (a short list was an IndexError)
            raise ValueError(f"errors has {len(self.errors)} entries for {n} scores")
        for i in range(n):
            if not bool(self.valid[i]) and not self.errors[i]:
                self.errors[i] = "non-finite score" if not bool(finite[i]) else "marked invalid by the reward"
            elif bool(self.valid[i]):
                self.errors[i] = None
        self.dimensions = {k: torch.as_tensor(v, dtype=torch.float32).detach().cpu().reshape(-1)
                           for k, v in (self.dimensions or {}).items()}
        for k, v in self.dimensions.items():
            if v.shape[0] != n:
                raise ValueError(f"dimension {k!r} has {v.shape[0]} values for {n} scores")
        for name in ("errors", "rationales", "details"):
            seq = getattr(self, name)
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries for {n} scores")

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @classmethod
    def invalid(cls, n: int, reason: str, dimensions: Sequence[str] = ()) -> "RewardOutput":
        """All-invalid output: NaN scores with one reason."""
        nan = torch.full((n,), float("nan"))
        return cls(scores=nan, valid=torch.zeros(n, dtype=torch.bool), errors=[reason] * n,
                   dimensions={d: nan.clone() for d in dimensions})

    def tolist(self) -> list[float | None]:
        """Scores as Python floats; invalid samples are None."""
        return [_json_float(s) if v else None for s, v in zip(self.scores.tolist(), self.valid.tolist())]

    def records(self) -> list[dict[str, Any]]:
        """One JSON-serialisable dict per sample (what ``rewardkit score`` writes as JSONL)."""
        out = []
        for i in range(len(self)):
            rec: dict[str, Any] = {"score": _json_float(float(self.scores[i])), "valid": bool(self.valid[i]),
                                   "error": self.errors[i]}
            if self.dimensions:
                rec["dimensions"] = {k: _json_float(float(v[i])) for k, v in self.dimensions.items()}
            if self.rationales is not None:
                rec["rationale"] = self.rationales[i]
            if self.details is not None and self.details[i] is not None:
                rec["details"] = self.details[i]
            out.append(rec)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole output as JSON-serialisable lists (NaN -> None)."""
        return {
            "scores": [_json_float(x) for x in self.scores.tolist()],
            "valid": self.valid.tolist(),
            "errors": list(self.errors),
            "dimensions": {k: [_json_float(x) for x in v.tolist()] for k, v in self.dimensions.items()},
            "rationales": None if self.rationales is None else list(self.rationales),
            "info": dict(self.info),
            "details": None if self.details is None else list(self.details),
        }

    @classmethod
    def concat(cls, outputs: Sequence["RewardOutput"]) -> "RewardOutput":
        """Concatenate chunk outputs along the batch; ``info`` is merged (later chunks win)."""
        if not outputs:
            return cls(scores=torch.zeros(0))
        dims: list[str] = []
        for o in outputs:
            dims += [d for d in o.dimensions if d not in dims]
        info: dict[str, Any] = {}
        for o in outputs:
            info.update(o.info)
        any_rat = any(o.rationales is not None for o in outputs)
        any_det = any(o.details is not None for o in outputs)
        return cls(
            scores=torch.cat([o.scores for o in outputs]),
            valid=torch.cat([o.valid for o in outputs]),
            errors=[e for o in outputs for e in o.errors],
            dimensions={d: torch.cat([o.dimensions.get(d, torch.full((len(o),), float("nan"))) for o in outputs])
                        for d in dims},
            rationales=[r for o in outputs for r in (o.rationales or [None] * len(o))] if any_rat else None,
            info=info,
            details=[r for o in outputs for r in (o.details or [None] * len(o))] if any_det else None,
        )


@dataclass
class PairwiseOutput:
    """Preference between two candidates per sample.

    Attributes:
        prob_a: float32 tensor ``[B]`` in [0, 1], P(candidate a preferred); NaN where invalid.
        valid, errors, rationales, info: as in :class:`RewardOutput`.
        scores_a, scores_b: the underlying scores when the comparison was derived from scores.
    """

    prob_a: torch.Tensor
    valid: torch.Tensor | None = None
    errors: list[str | None] | None = None
    rationales: list[str | None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    scores_a: torch.Tensor | None = None
    scores_b: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.prob_a = torch.as_tensor(self.prob_a, dtype=torch.float32).detach().cpu().reshape(-1)
        n = self.prob_a.shape[0]
        finite = torch.isfinite(self.prob_a)
        self.valid = finite.clone() if self.valid is None else _mask(self.valid, n).cpu() & finite
        self.errors = list(self.errors) if self.errors is not None else [None] * n
        for name in ("errors", "rationales"):
            seq = getattr(self, name)
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries for {n} probabilities")
        for i in range(n):
            if not bool(self.valid[i]) and not self.errors[i]:
                self.errors[i] = "non-finite probability"
            elif bool(self.valid[i]):
                self.errors[i] = None
        if bool(((self.prob_a[finite] < 0) | (self.prob_a[finite] > 1)).any()):
            raise ValueError("prob_a must lie in [0, 1]")

    def __len__(self) -> int:
        return int(self.prob_a.shape[0])

    def tolist(self) -> list[float | None]:
        return [_json_float(p) if v else None for p, v in zip(self.prob_a.tolist(), self.valid.tolist())]

    def to_dict(self) -> dict[str, Any]:
        d = {"prob_a": [_json_float(x) for x in self.prob_a.tolist()], "valid": self.valid.tolist(),
             "errors": list(self.errors), "rationales": self.rationales, "info": dict(self.info)}
        if self.scores_a is not None:
            d["scores_a"] = [_json_float(x) for x in self.scores_a.tolist()]
            d["scores_b"] = [_json_float(x) for x in self.scores_b.tolist()]
        return d


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


@dataclass
class RewardConfig:
    """Base of every reward's configuration dataclass (empty: a reward with no options uses it as is)."""


class Reward(abc.ABC):
    """Abstract base of every reward. Subclasses set the class metadata and implement :meth:`_score`.

    Call it as ``reward(images, prompt, sources=..., metadata=..., batch_size=..., on_error=...)``.
    """

    name: ClassVar[str] = ""
    tasks: ClassVar[frozenset[str]] = frozenset({"t2i"})
    higher_is_better: ClassVar[bool] = True
    differentiable: ClassVar[bool] = False
    score_range: ClassVar[tuple[float, float] | None] = None
    dimensions: tuple[str, ...] = ()
    #: pip extras the reward needs (shown by ``rewardkit ls``; the error for a missing one names them).
    extras: ClassVar[tuple[str, ...]] = ()
    #: False for rewards that ignore the prompt (e.g. aesthetics): ``prompt`` may then be None.
    uses_prompt: ClassVar[bool] = True
    #: True for prompt-conditioned rewards that score an empty (or blank) prompt as their own package does, the
    #: model's unconditional text input (hpsv2, hpsv3, imagereward, pickscore, clipscore); otherwise an empty
    #: prompt is that sample's input error (NaN + "prompt is empty").
    scores_empty_prompt: ClassVar[bool] = False
    #: Chunk size when the caller passes no ``batch_size`` (None = the whole batch at once).
    default_batch_size: ClassVar[int | None] = None
    #: ``compare`` default: P(a) = sigmoid((s_a - s_b) / compare_temperature).
    compare_temperature: ClassVar[float] = 1.0
    #: True when ``compare(a, b) == 1 - compare(b, a)`` by construction (e.g. a judge that asks both orders
    #: itself): benchmark harnesses then skip the position-swapped call.
    compare_is_symmetric: ClassVar[bool] = False
    #: True when ``_score`` may run concurrently from several threads; otherwise calls are serialised.
    thread_safe: ClassVar[bool] = False
    #: True when a sample's score depends on the other samples of the call (e.g. z-scores over the batch):
    #: the base then never chunks the call; ``RewardBatch.chunk_size`` carries the caller's ``batch_size``.
    batch_relative: bool = False
    Config: ClassVar[type] = RewardConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``to(device)`` receives a resolved ``torch.device``: ints (GPU index),
        ``torch.device`` and strings are accepted, and an unusable device (``"cuda"`` on a CPU-only torch, an
        index past the visible GPUs) is a clear ``ValueError`` before any module moves."""
        super().__init_subclass__(**kwargs)
        to = cls.__dict__.get("to")
        if to is not None and not getattr(to, "_rk_resolves_device", False):
            @functools.wraps(to)
            def to_checked(self, device, *args, **kw):
                from .models.vlm import resolve_device

                return to(self, resolve_device(device), *args, **kw)

            to_checked._rk_resolves_device = True  # type: ignore[attr-defined]
            cls.to = to_checked  # type: ignore[method-assign]

    def __init__(self, config: Any = None, /, **overrides: Any) -> None:
        # RL trainers pass torch.device objects and integer GPU indices: store them as the string configs hold
        if "device" in overrides:
            overrides["device"] = _device_arg(overrides["device"])
        if isinstance(config, dict) and "device" in config:
            config = {**config, "device": _device_arg(config["device"])}
        self.config = build_config(self.Config, config, overrides)
        self._device = torch.device("cpu")
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ to implement
    @abc.abstractmethod
    def _score(self, batch: RewardBatch) -> RewardOutput:
        """Score a validated batch; return an output with ``len(batch)`` entries."""

    @classmethod
    def tiny(cls, workdir: str) -> "Reward":
        """A tiny, randomly initialised instance for tests (built with :mod:`rewardkit.testing`).

        Every registered reward implements this so the conformance suite can run it offline.
        """
        raise NotImplementedError(f"{cls.__name__} has no tiny test instance")

    # ------------------------------------------------------------------ plumbing
    @property
    def device(self) -> torch.device:
        return self._device

    def to(self, device: str | torch.device) -> "Reward":
        """Move every ``torch.nn.Module`` attribute to ``device``; returns self."""
        from .models.vlm import resolve_device

        device = resolve_device(device)
        for value in vars(self).values():
            if isinstance(value, torch.nn.Module):
                value.to(device)
        self._device = device
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, config={self.config!r})"

    @property
    def accepts_sources(self) -> bool:
        return bool(self.tasks & {"edit", "multi_ref"})

    @property
    def requires_sources(self) -> bool:
        return "t2i" not in self.tasks

    def _grad_context(self):
        # Calls never build autograd graphs, even for differentiable rewards: gradients go through
        # score_tensor (an RL rollout scoring images that came out of a graph must not keep it alive).
        return torch.inference_mode()

    # ------------------------------------------------------------------ tensor fast path / gradients (issue 12)
    @property
    def supports_tensor_input(self) -> bool:
        """True when ``_score`` takes a float ``[B, 3, H, W]`` tensor batch and pre-processes it in torch on its
        device (see :mod:`rewardkit.preprocess`). ``__call__`` then passes such tensors through unconverted."""
        return False

    @property
    def supports_score_tensor(self) -> bool:
        """True when :meth:`score_tensor` can pre-process a float ``[B, 3, H, W]`` tensor in torch. Default: the
        same as :attr:`supports_tensor_input`. Rewards whose calls keep their published PIL recipe (``hpsv2``,
        ``aesthetic``, ``imagereward``) have a torch port of it for gradients only, and override this."""
        return self.supports_tensor_input

    def score_tensor(self, images: torch.Tensor, prompt: str | Sequence[str] | None = None, *,
                     batch_size: int | None = None) -> torch.Tensor:
        """Scores with gradients to the pixels, for reward-guided fine-tuning (ReFL, DRaFT, AlignProp).

        Args:
            images: float tensor ``[B, 3, H, W]`` in [0, 1], any float dtype, on any device; may require grad.
            prompt: one string or B strings.
            batch_size: chunk size (default: the whole batch in one forward).

        Returns:
            float32 tensor ``[B]`` on ``images.device``, differentiable w.r.t. ``images``. The reward's own
            weights are frozen: they never receive gradients. Bad input (NaN, out of range, empty prompt)
            raises :class:`RewardInputError` naming the sample, since a NaN would poison the loss.
            Raises TypeError for rewards that are not ``differentiable``.
        """
        from . import preprocess

        return preprocess.score_tensor(self, images, prompt, batch_size=batch_size)

    def __call__(
        self,
        images: Any,
        prompt: str | Sequence[str] | None = None,
        *,
        sources: Sequence[Any] | None = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        batch_size: int | None = None,
        on_error: str = "raise",
        progress: bool = False,
    ) -> RewardOutput:
        """Score ``images`` against ``prompt``.

        Args:
            images: a batch of B images in any kind :mod:`rewardkit.media` accepts.
            prompt: one string (broadcast to every image) or B strings.
            sources: per sample, a list of source / reference images (one for an edit, N >= 2 for
                multi-reference editing); a bare image counts as a list of one; None or [] for none.
            metadata: per sample, a dict (e.g. ``{"intent": "strict"}``) or None.
            batch_size: chunk size for the model; default ``default_batch_size``.
            on_error: ``"raise"`` raises :class:`RewardInputError` naming the first bad sample;
                ``"nan"`` scores the rest and marks bad samples invalid with a reason.
            progress: show a progress bar (over images) when the call spans several chunks.

        Returns:
            RewardOutput with B entries.
        """
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if sources is None and self.supports_tensor_input:  # issue 12: on-device fast path for float tensors
            from . import preprocess

            if preprocess.is_float_batch(images):
                return preprocess.tensor_call(self, images, prompt, metadata=metadata, batch_size=batch_size,
                                              on_error=on_error, progress=progress)
        raw = media.split_batch(images)
        n = len(raw)
        prompts = self._prompts(prompt, n)
        srcs = self._sources(sources, n)
        metas, meta_errors = self._metadata_entries(metadata, n)

        # Pass 1 (cheap, nothing decoded): prompts, and every image's size from its header / shape, checked
        # against the pixel limit, the aspect-ratio bound and the size after this model's own resize. Most bad
        # inputs are caught here, before any chunk is scored.
        errors: list[str | None] = [None] * n
        for i in range(n):
            errors[i] = meta_errors[i] or self._precheck(prompts[i], raw[i], None if srcs is None else srcs[i]) \
                or self._check_sample_metadata(metas[i], None if srcs is None else srcs[i])
            if errors[i] is not None and on_error == "raise":
                raise RewardInputError(errors[i], index=i)
        todo = [i for i in range(n) if errors[i] is None]

        if self.batch_relative:  # statistics of the whole call: one _score call, chunking left to the reward
            chunk = max(len(todo), 1)
        else:
            chunk = batch_size or self.default_batch_size or max(len(todo), 1)
        bar = None
        if progress and len(todo) > chunk:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(todo), desc=f"{self.name or type(self).__name__}", unit="img", delay=1.0)
        parts: list[RewardOutput] = []
        ok: list[int] = []
        try:
            with self._call_scope():
                # Pass 2: decode per chunk, so at most `chunk` decoded images (+ their sources) are alive at a
                # time: peak memory follows batch_size, not the size of the call (batch_relative rewards need
                # the whole call at once). A sample that fails to decode is that sample's error.
                for sub in self._decoded_chunks(raw, prompts, srcs, metas, todo, chunk, errors, on_error):
                    if self.batch_relative:
                        sub.chunk_size = batch_size or self.default_batch_size
                    parts.append(self._run(sub))
                    ok.extend(sub.indices)
                    if bar is not None:
                        bar.update(len(sub))
                    del sub  # release this chunk's images before the next chunk is decoded
        finally:
            if bar is not None:
                bar.close()
        scored = RewardOutput.concat(parts) if parts else RewardOutput(scores=torch.zeros(0))
        return self._scatter(scored, ok, errors, n)

    def _decoded_chunks(self, raw: list[Any], prompts: list[Any], srcs: list[Any] | None,
                        metas: list[dict[str, Any]], todo: list[int], chunk: int, errors: list[str | None],
                        on_error: str):
        """Yield :class:`RewardBatch` es of up to ``chunk`` decoded samples, in call order.

        Samples are decoded only when their chunk is filled; one that fails to decode gets its error in
        ``errors`` (or raises with ``on_error="raise"``) and the chunk is refilled from the next samples.
        """
        imgs: list[Image.Image] = []
        src_lists: list[list[Image.Image]] = []
        idx: list[int] = []

        def batch() -> RewardBatch:
            return RewardBatch(images=imgs, prompts=[prompts[i] for i in idx],
                               sources=None if srcs is None else src_lists,
                               metadata=[metas[i] for i in idx], indices=idx)

        for i in todo:
            img, src, err = self._decode_sample(raw[i], None if srcs is None else srcs[i])
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

    def _precheck(self, prompt: Any, image: Any, sources: Any) -> str | None:
        """Cheap per-sample checks (no pixel decoded); the reason a sample is bad, or None."""
        try:
            err = self._check_prompt(prompt)
            if err is None:
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

    def _decode_sample(self, image: Any, sources: Any) -> tuple[Image.Image | None, list[Image.Image], str | None]:
        """Decode one sample (image + its sources); ``(image, sources, None)`` or ``(None, [], reason)``."""
        try:
            img = media._to_pil(image)
            src, err = self._decode_sources(sources)
            return (None, [], err) if err is not None else (img, src, None)
        except media._Bad as exc:
            return None, [], str(exc)
        except Exception as exc:  # noqa: BLE001 -- one sample's failure never takes down the batch
            return None, [], f"cannot read this sample ({type(exc).__name__}: {exc})"

    def _call_scope(self):
        """Context manager around all chunks of one call: per-call resources that outlive a chunk (e.g. a
        judge session that keeps each distinct image's features, so shared references are encoded once per
        call however the call is chunked). Default: nothing."""
        return nullcontext()

    def _run(self, sub: RewardBatch) -> RewardOutput:
        lock = nullcontext() if self.thread_safe else self._lock
        with lock, self._grad_context():
            out = self._score(sub)
        if not isinstance(out, RewardOutput):
            raise TypeError(f"{type(self).__name__}._score must return RewardOutput, got {type(out).__name__}")
        if len(out) != len(sub):
            raise RuntimeError(f"{type(self).__name__}._score returned {len(out)} scores for {len(sub)} samples")
        return out

    def _scatter(self, scored: RewardOutput, ok: list[int], errors: list[str | None], n: int) -> RewardOutput:
        if len(ok) == n:
            return scored
        idx = torch.tensor(ok, dtype=torch.long)
        scores = torch.full((n,), float("nan"))
        valid = torch.zeros(n, dtype=torch.bool)
        if ok:
            scores = scores.to(scored.scores.dtype)
            scores[idx] = scored.scores.detach() if not scored.scores.requires_grad else scored.scores
            valid[idx] = scored.valid
        dims = {}
        for k, v in scored.dimensions.items():
            full = torch.full((n,), float("nan"))
            if ok:
                full[idx] = v
            dims[k] = full
        for dname in self.dimensions:
            dims.setdefault(dname, torch.full((n,), float("nan")))
        errs = list(errors)
        rats = None if scored.rationales is None else [None] * n
        dets = None if scored.details is None else [None] * n
        for j, i in enumerate(ok):
            errs[i] = scored.errors[j]
            if rats is not None:
                rats[i] = scored.rationales[j]
            if dets is not None:
                dets[i] = scored.details[j]
        return RewardOutput(scores=scores, valid=valid, errors=errs, dimensions=dims, rationales=rats,
                            info=scored.info, details=dets)

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
                out.append(media._to_pil(x))
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

    # ------------------------------------------------------------------ pairwise
    def compare(
        self,
        images_a: Any,
        images_b: Any,
        prompt: str | Sequence[str] | None = None,
        *,
        sources: Sequence[Any] | None = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        batch_size: int | None = None,
        on_error: str = "raise",
    ) -> PairwiseOutput:
        """P(a preferred over b) per sample. Default: both scored in one call,
        ``sigmoid((s_a - s_b) / compare_temperature)`` (sign flipped when lower is better).
        Judges override this with a native pairwise prompt."""
        a, b = media.split_batch(images_a), media.split_batch(images_b)
        if len(a) != len(b):
            raise RewardInputError(f"compare got {len(a)} images_a but {len(b)} images_b")
        n = len(a)
        prompts = self._prompts(prompt, n)
        out = self(a + b, prompts + prompts,
                   sources=None if sources is None else list(sources) + list(sources),
                   metadata=None if metadata is None else list(metadata) + list(metadata),
                   batch_size=batch_size, on_error=on_error)
        ca, cb = self._compare_values(out).chunk(2) if n else (out.scores, out.scores)
        diff = (ca - cb) if self.higher_is_better else (cb - ca)
        prob = torch.sigmoid(diff / self.compare_temperature)
        valid = out.valid[:n] & out.valid[n:]
        from .judges.policy import join_reasons

        errors = []
        for i in range(n):
            ea, eb = out.errors[i], out.errors[n + i]
            # (a judge failure leads the reason with its prefix: a score cache must not store it)
            errors.append(None if valid[i] else (join_reasons([("a", ea), ("b", eb)]) or ""))
        prob = torch.where(valid, prob, torch.full_like(prob, float("nan")))
        return PairwiseOutput(prob_a=prob, valid=valid, errors=errors, info=out.info,
                              scores_a=out.scores[:n], scores_b=out.scores[n:])

    def _compare_values(self, out: RewardOutput) -> torch.Tensor:
        """The per-sample values the default ``compare`` turns into ``sigmoid(diff / temperature)``: the
        scores, unless a reward reports scores on a transformed scale (e.g. calibrated) and compares raw."""
        return out.scores


def config_dict(reward: Reward) -> dict[str, Any]:
    """The reward's configuration as a plain dict (what result records store)."""
    cfg = reward.config
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
