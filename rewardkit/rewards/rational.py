"""RationalRewards: a reasoning reward model that critiques before it scores (PARROT-distilled).

The model (any judge backend: a local transformers checkpoint, vLLM, an OpenAI-compatible server) writes a
pointwise critique of the image on four dimensions (text faithfulness, image faithfulness (edits only),
physical / visual quality, text rendering), each scored 1–4 (floats allowed) or N/A; the reward is the
N/A-aware mean over the applicable dimensions mapped to [0, 1] as ``(mean - 1) / 3`` (the paper's RL reward,
appendix E eq. 13, on the unit scale). Dimensions are reported on the 1–4 scale (NaN where N/A or invalid);
the critique text is in ``rationales``; the summary and the refined request (for the generate-critique-refine
loop, :mod:`rewardkit.refine`) are in ``details``.

An answer that does not follow the format (a missing section, two score lines, "3.5/5", "about 3") makes the
sample NaN + invalid with the parser's reason; nothing is ever filled in.

``compare()`` asks the native pairwise question in both orders (position swap): each order's "Preferred:"
verdict votes, ``P(a) = (1[a wins | a first] + 1[a wins | a second]) / 2`` (0, 0.5 or 1); an order whose
answer does not parse makes the pair NaN + reason. ``compare_mode="scores"`` compares pointwise scores.

A failing judge call follows ``on_judge_error`` (:mod:`rewardkit.judges.policy`): with a backend that fails one
request at a time, only that request's sample (pair) fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..judges.base import check_temperature
from ..judges.policy import (JUDGE_FAILURE_PREFIX, JudgeError, JudgePolicyMixin, call_rows, check_policy,
                             describe_failure, is_judge_failure, judge_policy)
from ..reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput
from ._judge_setup import judge_from_config, judge_overrides

__all__ = ["RationalReward", "RationalConfig"]


@dataclass
class RationalConfig(RewardConfig):
    #: the distilled checkpoint (a local directory or hub id, loaded with the transformers judge backend) or
    #: a full judge spec with its backend prefix ("vllm:<path>", "openai:<url>" with judge_kwargs model=...)
    model: str = ""
    #: alternative to ``model``: a judge spec (what the other judge rewards call it)
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    template: str = "default"
    max_new_tokens: int = 1024
    temperature: float = 0.0
    seed: int = 0
    batch_size: int = 8
    compare_mode: str = "pairwise"  # "pairwise" (native, both orders) | "scores"
    #: what a failing judge call gives (rewardkit.judges.policy): "auto" (follow the call's on_error), "nan", "raise"
    on_judge_error: str = "auto"


class RationalReward(JudgePolicyMixin, Reward):
    """RationalRewards (PARROT) on any judge backend."""

    name: ClassVar[str] = "rational"
    tasks = frozenset({"t2i", "edit"})
    score_range = (0.0, 1.0)
    dimensions = ("text_faithfulness", "image_faithfulness", "physical_quality", "text_rendering")
    extras = ("hf",)
    compare_temperature = 0.1
    #: compare asks both orders inside one call: compare(a, b) == 1 - compare(b, a)
    compare_is_symmetric: ClassVar[bool] = True
    Config = RationalConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template

        super().__init__(config, **judge_overrides(overrides, judge=judge))
        cfg = self.config
        if cfg.compare_mode not in ("pairwise", "scores"):
            raise ValueError(f"rational compare_mode must be 'pairwise' or 'scores', got {cfg.compare_mode!r}")
        check_policy(cfg.on_judge_error, self.name)
        if cfg.max_new_tokens < 1:
            raise ValueError("rational needs max_new_tokens >= 1")
        check_temperature(cfg.temperature, "rational temperature")
        self.judge = judge_from_config(judge, cfg, owner=self.name, missing=(
            "rational needs a model: load_reward('rational', model='<distilled checkpoint>') "
            "(or judge='vllm:<path>' / 'openai:<url>' with judge_kwargs={'model': ...}, or a backend)"))
        self.template = load_template("parrot", cfg.template)
        self.default_batch_size = cfg.batch_size

    @property
    def _local(self):
        import threading

        loc = self.__dict__.get("_tls")
        if loc is None:
            loc = self.__dict__["_tls"] = threading.local()
        return loc

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_tls", None)
        return state

    def _source_items(self, entry: Any):
        if not getattr(self._local, "packed", False):
            return super()._source_items(entry)
        items = list(entry)  # compare() packs [source?] + candidate b
        if len(items) > 2:
            return [], f"{len(items) - 1} source images given but rational takes one"
        return items, None

    def _call_scope(self):
        return self.judge.session()

    def _generate(self, convs: list) -> tuple[list[str], list[str | None]]:
        """One answer per conversation and, per conversation, the judge failure that left it unanswered (None).
        Under the NaN policy a backend that fails one request at a time fails only that conversation."""
        cfg = self.config
        isolate = judge_policy(cfg.on_judge_error) == "nan"
        outs, failed = call_rows(self.judge, "generate", convs, isolate=isolate, n=1, temperature=cfg.temperature,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        if len(outs) != len(convs):
            raise JudgeError(f"generate returned {len(outs)} answers for {len(convs)} conversations")
        errs = [None if e is None else f"{JUDGE_FAILURE_PREFIX}: {e}" for e in failed]
        texts = []
        for i, o in enumerate(outs):
            if errs[i] is None and (not o or not isinstance(o[0], str)):
                raise JudgeError(f"generate returned no answer text for conversation {i}: {o!r:.80}")
            texts.append(o[0] if errs[i] is None else "")
        return texts, errs

    def _info(self) -> dict[str, Any]:
        return {"template": self.template.id, "judge": self.judge.describe(), "scale": "(mean 1-4 - 1) / 3",
                "max_new_tokens": self.config.max_new_tokens, "temperature": self.config.temperature}

    # ------------------------------------------------------------------ pointwise
    def _score(self, batch: RewardBatch) -> RewardOutput:
        # pairwise only inside compare() (a flag of this thread, set there): never from the caller's metadata
        pairwise = bool(getattr(self._local, "packed", False))
        try:
            return self._pairwise(batch) if pairwise else self._pointwise(batch)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the judge policy says NaN
            if not is_judge_failure(exc) or judge_policy(self.config.on_judge_error) != "nan":
                raise
            out = RewardOutput.invalid(len(batch), describe_failure(exc),
                                       dimensions=() if pairwise else self.dimensions)
            out.info = self._info()
            return out

    def _pointwise(self, batch: RewardBatch) -> RewardOutput:
        from ..parrot.format import ParseError, mean_score, parse_pointwise, to_unit
        from ..parrot.prompts import pointwise_conv

        B = len(batch)
        srcs = batch.sources or [[] for _ in range(B)]
        texts, failed = self._generate([pointwise_conv(self.template, batch.prompts[i], batch.images[i], srcs[i])
                                        for i in range(B)])
        scores = torch.full((B,), math.nan)
        dims = {d: torch.full((B,), math.nan) for d in self.dimensions}
        errors: list[str | None] = list(failed)
        details: list[dict[str, Any] | None] = []
        for i, text in enumerate(texts):
            if errors[i] is not None:
                details.append(None)
                continue
            try:
                c = parse_pointwise(text, t2i=not srcs[i])
            except ParseError as exc:
                errors[i] = f"unparseable critique: {exc}; answer: {text[:200]!r}"
                details.append({"raw": text})
                continue
            m = mean_score(c.scores)
            if math.isnan(m):
                errors[i] = "every dimension is N/A: nothing to score"
            else:
                scores[i] = to_unit(m)
            for d, v in c.scores.items():
                if v is not None:
                    dims[d][i] = v
            details.append({"scores": c.scores, "na": [d for d, v in c.scores.items() if v is None],
                            "summary": c.summary, "refined_request": c.refined_request, "notes": c.notes,
                            "mean": None if math.isnan(m) else m})
        valid = torch.tensor([e is None for e in errors])
        rationales = [None if e else t for t, e in zip(texts, failed)]  # (no text for an unanswered request)
        return RewardOutput(scores=scores, valid=valid, errors=errors, dimensions=dims, rationales=rationales,
                            details=details, info=self._info())

    # ------------------------------------------------------------------ pairwise
    def compare(self, images_a: Any, images_b: Any, prompt: str | Sequence[str] | None = None, *,
                sources: Sequence[Any] | None = None, metadata: Sequence[dict[str, Any] | None] | None = None,
                batch_size: int | None = None, on_error: str = "raise") -> PairwiseOutput:
        """P(a preferred over b): the native pairwise critique in both orders (see the module docstring)."""
        if self.config.compare_mode == "scores":
            return super().compare(images_a, images_b, prompt, sources=sources, metadata=metadata,
                                   batch_size=batch_size, on_error=on_error)
        from .. import media
        from ..errors import RewardInputError

        a, b = media.split_batch(images_a), media.split_batch(images_b)
        if len(a) != len(b):
            raise RewardInputError(f"compare got {len(a)} images_a but {len(b)} images_b")
        n = len(a)
        srcs = self._sources(sources, n) if sources is not None else [[] for _ in range(n)]
        # candidate b travels as the last "source" so that the base class decodes and validates it
        packed = [(list(s) if isinstance(s, (list, tuple)) else ([] if s is None else [s])) + [b[i]]
                  for i, s in enumerate(srcs)]
        metas = self._metadata(metadata, n)
        self._local.packed = True  # the packed candidate is one extra "source": allowed in this call only
        try:
            out = self(a, prompt, sources=packed, metadata=metas, batch_size=batch_size, on_error=on_error)
        finally:
            self._local.packed = False
        return PairwiseOutput(prob_a=out.scores, valid=out.valid, errors=out.errors, rationales=out.rationales,
                              info=out.info)

    def _pairwise(self, batch: RewardBatch) -> RewardOutput:
        from ..parrot.format import ParseError, parse_pairwise
        from ..parrot.prompts import pairwise_conv

        convs = []
        for i in range(len(batch)):
            refs, cand_b = batch.sources[i][:-1], batch.sources[i][-1]
            if len(refs) > 1:
                raise ValueError("rational compares t2i pairs or single-source edits (got several sources)")
            convs.append(pairwise_conv(self.template, batch.prompts[i], batch.images[i], cand_b, refs))
            convs.append(pairwise_conv(self.template, batch.prompts[i], cand_b, batch.images[i], refs))
        texts, failed = self._generate(convs)
        B = len(batch)
        prob = torch.full((B,), math.nan)
        errors: list[str | None] = [None] * B
        rats, details = [], []
        for i in range(B):
            fail = failed[2 * i] or failed[2 * i + 1]
            if fail is not None:  # one order unanswered: the pair is unknown (a judge failure, asked again later)
                errors[i] = fail
                rats.append(None)
                details.append(None)
                continue
            t2i = len(batch.sources[i]) == 1
            votes, bad = [], []
            for k, (text, a_slot) in enumerate(((texts[2 * i], "A"), (texts[2 * i + 1], "B"))):
                try:
                    votes.append(float(parse_pairwise(text, t2i=t2i).preferred == a_slot))
                except ParseError as exc:
                    bad.append(f"{'a first' if k == 0 else 'a second'}: {exc}; answer: {text[:160]!r}")
            if bad:
                errors[i] = "unparseable pairwise critique (" + "; ".join(bad) + ")"
            else:
                prob[i] = sum(votes) / 2
            rats.append(f"[a first]\n{texts[2 * i]}\n[a second]\n{texts[2 * i + 1]}")
            details.append({"votes_a": votes if not bad else None})
        info = dict(self._info(), compare="native pairwise critique, both orders")
        return RewardOutput(scores=prob, valid=torch.tensor([e is None for e in errors]), errors=errors,
                            rationales=rats, details=details, info=info)

    # ------------------------------------------------------------------ misc
    @classmethod
    def tiny(cls, workdir: str) -> "RationalReward":
        """RationalRewards on a tiny random Qwen2.5-VL (its critiques never parse: every sample is NaN + reason)."""
        from ..testing import save_tiny_checkpoint

        path = save_tiny_checkpoint("qwen2_5_vl", f"{workdir}/tiny-rational")
        return cls(model=str(path), device="cpu", max_new_tokens=8)

    def to(self, device):
        import torch as _torch

        if hasattr(self.judge, "to"):
            self.judge.to(device)
        self._device = _torch.device(device)
        return self

