"""The contract: ``Reward``, ``RewardOutput``, ``PairwiseOutput``, ``RewardBatch``.

A reward implements one method, :meth:`Reward._score`, on an already validated and normalised
:class:`RewardBatch`. The base class owns everything else: input normalisation (via :mod:`rewardkit.media`),
per-sample error handling, chunking, ``inference_mode``, output validation, thread safety, ``compare``.

This is the contract's public module: import every name from here. The data types and the input handling live
beside it (:mod:`rewardkit._reward_outputs`: ``RewardOutput``, ``PairwiseOutput``; :mod:`rewardkit._reward_inputs`:
``RewardBatch`` and the per-sample normalisation, checks and decoding that :meth:`Reward.__call__` uses).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from . import media
from .config import build_config
from .devices import device_arg, resolve_device
from .errors import ConfigError, RewardInputError
from .reasons import join_reasons
from ._reward_inputs import RewardBatch, RewardInputs
from ._reward_outputs import PairwiseOutput, RewardOutput, scatter

__all__ = ["Reward", "RewardOutput", "PairwiseOutput", "RewardBatch", "RewardConfig", "TASKS"]

TASKS = frozenset({"t2i", "edit", "multi_ref"})
_ON_ERROR = ("raise", "nan")


def _device_arg(device: Any) -> Any:
    try:
        return device_arg(device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@dataclass
class RewardConfig:
    """Base of every reward's configuration dataclass (empty: a reward with no options uses it as is)."""


class Reward(RewardInputs, abc.ABC):
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
        if hasattr(self.config, "input_policy"):  # published rewards: "official" / "corrected" (rewardkit.media)
            media.check_input_policy(self.config.input_policy)
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
        # A call scored in one chunk leaves an encoded image's header checks to its decode (one header read,
        # not two; the same reasons, and still nothing scored before a bad image is refused: _precheck), unless
        # the reward replaced the header check or the decode (then both run as they did).
        chunk = None if self.batch_relative else (batch_size or self.default_batch_size)
        cls = type(self)
        defer = (chunk is None or n <= chunk) and cls._check_image_size is RewardInputs._check_image_size \
            and cls.decode_image is RewardInputs.decode_image
        errors: list[str | None] = [None] * n
        for i in range(n):
            src = None if srcs is None else srcs[i]
            errors[i] = meta_errors[i] or self._precheck(prompts[i], raw[i], src, defer) \
                or self._check_sample_metadata(metas[i], src)
            if errors[i] is not None and defer:  # the reason the checks in order give (the image's, if it has one)
                errors[i] = meta_errors[i] or self._precheck(prompts[i], raw[i], src) \
                    or self._check_sample_metadata(metas[i], src)
            if errors[i] is not None and on_error == "raise":
                raise RewardInputError(errors[i], index=i)
        todo = [i for i in range(n) if errors[i] is None]

        if chunk is None:  # batch_relative (statistics of the whole call: one _score call, chunking left to the
            # reward) or no batch size set: the whole call in one chunk
            chunk = max(len(todo), 1)
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
                for sub in self._decoded_chunks(raw, prompts, srcs, metas, todo, chunk, errors, on_error, defer):
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
        # one chunk (the usual call) is its own concatenation: no second output built and checked
        scored = (parts[0] if len(parts) == 1 else RewardOutput.concat(parts)) if parts \
            else RewardOutput(scores=torch.zeros(0))
        return scatter(scored, ok, errors, n, self.dimensions)

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
