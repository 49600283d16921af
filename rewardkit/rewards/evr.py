"""EVR: Evaluate-Verify Reward for (multi-)reference image editing.

An MLLM *evaluator* writes, for each of five dimensions d (reference consistency RC, scene consistency SC,
harmony H, instruction consistency IC, visual quality Q), K independent hypotheses: a short rationale
T_{d,i} and a score S_{d,i} in [1, 5]. A *verifier* (the same judge by default) rules whether each
hypothesis is supported by the pixels of the candidate: v_{d,i} in {0, 1} (binary, the paper) or P(Yes)
(soft). Then

    r_d = sum_i v_{d,i} S_{d,i} / (sum_i v_{d,i} + eps)        R = (prod_d r_d)^(1/D)

and the reported score is R normalised to [0, 1] as (R - 1) / 4 (``output="raw"`` reports R itself; the
raw value is always in ``dimensions["raw"]``).

When the verifier rejects every hypothesis of a dimension, ``all_rejected`` decides (never eps by accident):
``"invalid"`` (default: the sample is NaN + invalid with the reason), ``"unverified_mean"`` (r_d = mean of
the K scores, as without a verifier) or ``"zero"`` (r_d = 0, so a geometric R is 0). ``"zero"`` is what the
paper's formula gives with the binary verifier (every v = 0: 0 / eps); with ``verifier="soft"`` the formula
taken literally would give the P(Yes)-weighted mean of the scores (every v small but non-zero), so there
``"zero"`` is a policy, not the formula.

Ablations of the paper: ``verifier="none"`` (mean of S), ``use_dimensions=False`` (one joint score),
``cot=False`` (score only), ``aggregate="arithmetic"``; and ``k``, ``eps``, ``temperature``,
``dimensions`` (a subset).

The formula and the parser of the evaluator's answers are pure functions in ``_evr_formula.py``
(:func:`dimension_scores`, :func:`aggregate_dimensions`, :func:`normalise`, :func:`parse_hypothesis`, imported
here); this module holds the reward: prompts, the evaluate / verify calls and the pairwise modes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..judges.base import check_temperature
from ..judges.policy import (JUDGE_FAILURE_PREFIX, JudgePolicyMixin, call_rows, check_policy, describe_failure,
                             is_judge_failure, judge_policy, usable_rows)
from ..reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput
# the formula and the answer parser, pure functions, have their own module; importable from here as before
from ._evr_formula import aggregate_dimensions, dimension_scores, normalise, parse_hypothesis
from ._judge_setup import judge_from_config, judge_overrides

__all__ = ["EVR", "EVRConfig", "dimension_scores", "aggregate_dimensions", "normalise", "parse_hypothesis",
           "DIMENSIONS"]

DIMENSIONS = ("reference_consistency", "scene_consistency", "harmony", "instruction_consistency", "visual_quality")
_SHORT = {"rc": "reference_consistency", "sc": "scene_consistency", "h": "harmony",
          "ic": "instruction_consistency", "q": "visual_quality"}


# ---------------------------------------------------------------------------------------------- reward
@dataclass
class EVRConfig(RewardConfig):
    #: judge spec for :func:`rewardkit.judges.load_judge` ("transformers:<path>", "vllm:<path>",
    #: "openai:<url>"); a ready backend object can be passed as ``judge=`` to the constructor instead.
    judge: str = ""
    #: keyword arguments for load_judge (device, dtype, model=..., ...)
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    #: shorthand for ``judge="transformers:<model>"`` (what ``rewardkit score --model`` sets); a string with a
    #: backend prefix ("vllm:...", "openai:...") is used as is
    model: str = ""
    #: device / dtype for a transformers (dtype: also vllm) judge, merged into judge_kwargs
    device: str | None = None
    dtype: str | None = None
    #: a separate verifier judge spec ("" = the evaluator's judge, as in the paper)
    verifier_judge: str = ""
    template: str = "default"
    k: int = 4
    dimensions: tuple[str, ...] = DIMENSIONS
    use_dimensions: bool = True  # False: the paper's "w/o Dim" ablation (one joint score)
    cot: bool = True  # False: score only ("w/o CoT")
    verifier: str = "binary"  # "binary" | "soft" | "none"
    all_rejected: str = "invalid"  # "invalid" | "unverified_mean" | "zero"
    eps: float = 1e-6
    aggregate: str = "geometric"  # "geometric" | "arithmetic"
    output: str = "normalized"  # "normalized" ((R-1)/4 in [0, 1]) | "raw" (R)
    temperature: float = 0.7
    max_new_tokens: int = 128
    max_retries: int = 2  # extra generation rounds for hypotheses that did not parse
    unparsed: str = "invalid"  # "invalid": any hypothesis still unparsed -> sample invalid; "drop": ignore it
    seed: int = 0
    batch_size: int = 8
    compare_mode: str = "pairwise"  # "pairwise" (native prompt, both orders) | "scores" (sigmoid of score gap)
    #: a judge call that fails (e.g. a server down after its retries): "auto" (follow the call's on_error:
    #: on_error="nan" gives NaN + the error for the affected samples), "nan" (always), "raise" (always)
    on_judge_error: str = "auto"


class EVR(JudgePolicyMixin, Reward):
    """Evaluate-Verify Reward (EVR) for (multi-)reference image editing on any MLLM judge backend."""

    name: ClassVar[str] = "evr"
    tasks = frozenset({"edit", "multi_ref"})
    score_range = (0.0, 1.0)
    dimensions = DIMENSIONS + ("raw",)  # the default; a dimension subset narrows it per instance
    extras = ("hf",)
    compare_temperature = 0.25  # used by compare_mode="scores" on the [0, 1] scale
    #: compare(a, b) == 1 - compare(b, a) exactly (both orders are asked inside one call; score gaps are
    #: antisymmetric): the benchmark harness skips the swapped call
    compare_is_symmetric: ClassVar[bool] = True
    uses_judge: ClassVar[bool] = True
    Config = EVRConfig

    def __init__(self, config=None, /, *, judge: Any = None, verifier_judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template

        if "dimensions" in overrides and isinstance(overrides["dimensions"], (list, str)):
            d = overrides["dimensions"]
            overrides["dimensions"] = tuple(d.split(",") if isinstance(d, str) else d)
        super().__init__(config, **judge_overrides(overrides, judge=judge, verifier_judge=verifier_judge))
        cfg = self.config
        self._check_config()
        self.judge = judge_from_config(judge, cfg, owner=self.name, missing=(
            "EVR needs a judge: load_reward('evr', judge='transformers:<checkpoint>') "
            "(or 'vllm:<checkpoint>', 'openai:<url>' with judge_kwargs={'model': ...}, or a backend)"))
        separate = (verifier_judge is not None and not isinstance(verifier_judge, str)) or cfg.verifier_judge
        self.verifier_backend = (judge_from_config(verifier_judge, cfg, owner=self.name, spec=cfg.verifier_judge)
                                 if separate else self.judge)
        self.template = load_template("evr", cfg.template)
        self.dims = tuple(_SHORT.get(d.lower(), d) for d in cfg.dimensions) if cfg.use_dimensions else ("overall",)
        self.dimensions = self.dims + ("raw",)
        if cfg.output == "raw":
            self.score_range = (0.0, 5.0)
        self.default_batch_size = cfg.batch_size

    def _check_config(self) -> None:
        cfg = self.config
        choices = {"verifier": ("binary", "soft", "none"), "all_rejected": ("invalid", "unverified_mean", "zero"),
                   "aggregate": ("geometric", "arithmetic"), "output": ("normalized", "raw"),
                   "unparsed": ("invalid", "drop"), "compare_mode": ("pairwise", "scores")}
        check_policy(cfg.on_judge_error, "EVR")
        for key, allowed in choices.items():
            if getattr(cfg, key) not in allowed:
                raise ValueError(f"EVR {key} must be one of {allowed}, got {getattr(cfg, key)!r}")
        if cfg.k < 1 or cfg.max_retries < 0 or cfg.eps < 0 or cfg.max_new_tokens < 1:
            raise ValueError("EVR needs k >= 1, max_retries >= 0, eps >= 0, max_new_tokens >= 1")
        check_temperature(cfg.temperature, "EVR temperature")
        if cfg.use_dimensions:
            unknown = [d for d in cfg.dimensions if _SHORT.get(d.lower(), d) not in DIMENSIONS]
            if unknown or not cfg.dimensions:
                raise ValueError(f"unknown EVR dimensions {unknown}; choose from {DIMENSIONS} (or RC, SC, H, IC, Q)")

    # ------------------------------------------------------------------ prompts
    def _check_sample_metadata(self, meta: dict[str, Any], sources: Any) -> str | None:
        """``reference_roles``: one non-empty string per reference image, or absent (None / [] = no roles)."""
        roles = meta.get("reference_roles")
        if roles is None or (isinstance(roles, (list, tuple)) and not roles):
            return None
        if not isinstance(roles, (list, tuple)) or not all(isinstance(r, str) and r.strip() for r in roles):
            return f"metadata reference_roles must be a list of non-empty strings, got {roles!r}"
        items, err = self._source_items(sources) if sources is not None else ([], None)
        n_refs = len(items) - (1 if self._pair_mode() else 0)  # compare() packs candidate b last
        if err is None and len(roles) != n_refs:
            return (f"metadata reference_roles names {len(roles)} role(s) for {n_refs} reference image(s); "
                    "give one per reference, in order")
        return None

    def _ref_roles(self, meta: dict[str, Any], n: int) -> str:
        roles = meta.get("reference_roles")  # checked per sample by _check_sample_metadata
        if roles:
            return " (" + "; ".join(f"image {i + 1}: {r}" for i, r in enumerate(roles)) + ")"
        return ""

    def _images(self, refs: list, candidate) -> list[dict[str, Any]]:
        return [{"type": "image", "image": im} for im in [*refs, candidate]]

    def _dim_fields(self, dim: str) -> dict[str, str]:
        t = self.template
        return t["joint"] if dim == "overall" else t["dimensions"][dim]

    def _context(self, instruction: str, refs: list, meta: dict[str, Any]) -> str:
        return self.template.render("context", n_refs=len(refs), ref_roles=self._ref_roles(meta, len(refs)),
                                    instruction=instruction)

    def _eval_conv(self, instruction, refs, candidate, meta, dim):
        t, f = self.template, self._dim_fields(dim)
        fmt = t["evaluate_format_cot"] if self.config.cot else t["evaluate_format_score_only"]
        text = "\n".join([self._context(instruction, refs, meta),
                          t.render("evaluate", title=f["title"], rubric=f["rubric"]), fmt])
        return [{"role": "system", "content": t["evaluator_system"]},
                {"role": "user", "content": self._images(refs, candidate) + [{"type": "text", "text": text}]}]

    def _verify_conv(self, instruction, refs, candidate, meta, dim, score, reason):
        t, f = self.template, self._dim_fields(dim)
        claim = f"{reason} (score {score:g}/5)" if reason else t.render("score_claim", title=f["title"], score=f"{score:g}")
        text = "\n".join([self._context(instruction, refs, meta), t.render("verify", title=f["title"], claim=claim)])
        return [{"role": "system", "content": t["verifier_system"]},
                {"role": "user", "content": self._images(refs, candidate) + [{"type": "text", "text": text}]}]

    # ------------------------------------------------------------------ scoring
    def _pair_mode(self) -> str | None:
        """"2way" / "4way" inside :meth:`_pair_call` (a flag of this thread, set there), else None: an internal
        switch never read from the caller's metadata (a ``__evr_pairwise__`` key there used to switch a pointwise
        call to the pairwise path)."""
        import threading

        loc = self.__dict__.get("_tls")
        if loc is None:
            loc = self.__dict__.setdefault("_tls", threading.local())
        return getattr(loc, "mode", None)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_tls", None)
        return state

    def _score(self, batch: RewardBatch) -> RewardOutput:
        pairwise = self._pair_mode() is not None
        try:
            return self._pairwise(batch) if pairwise else self._evaluate_verify(batch)
        except Exception as exc:  # noqa: BLE001 - re-raised unless on_judge_error says NaN
            if not is_judge_failure(exc) or judge_policy(self.config.on_judge_error) != "nan":
                raise
            out = RewardOutput.invalid(len(batch), describe_failure(exc),
                                       dimensions=() if pairwise else self.dimensions)
            out.info = self._info()
            return out

    def _call_scope(self):
        """One judge session for the whole call: every distinct image (e.g. references shared by all
        candidates) goes through the vision encoder once per call, across chunks."""
        from contextlib import ExitStack

        stack = ExitStack()
        stack.enter_context(self.judge.session())
        if self.verifier_backend is not self.judge:
            stack.enter_context(self.verifier_backend.session())
        return stack

    def _evaluate_verify(self, batch: RewardBatch) -> RewardOutput:
        cfg = self.config
        B, D, K = len(batch), len(self.dims), cfg.k
        srcs = batch.sources or [[] for _ in range(B)]
        # (the judge session spanning the whole call comes from _call_scope)
        # 1. evaluator: K hypotheses per (sample, dimension), bounded retries for unparsed ones
        convs = [self._eval_conv(batch.prompts[b], srcs[b], batch.images[b], batch.metadata[b], d)
                 for b in range(B) for d in self.dims]
        raw: list[list[list[str]]] = [[[] for _ in range(K)] for _ in convs]  # every attempt's text
        parsed: list[list[tuple[float, str] | None]] = [[None] * K for _ in convs]
        todo = [(c, i) for c in range(len(convs)) for i in range(K)]
        isolate = judge_policy(cfg.on_judge_error) == "nan"
        failed: dict[int, str] = {}  # conversation -> error of its failed request
        for attempt in range(cfg.max_retries + 1):
            if not todo:
                break
            need: dict[int, list[int]] = {}
            for c, i in todo:
                need.setdefault(c, []).append(i)
            by_n: dict[int, list[int]] = {}
            for c, idx in need.items():
                by_n.setdefault(len(idx), []).append(c)
            for n, cs in by_n.items():
                outs, errs = call_rows(self.judge, "generate", [convs[c] for c in cs], isolate=isolate, n=n,
                                       temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                       seed=cfg.seed + 7919 * attempt)
                for c, texts, err in zip(cs, outs, errs):
                    if err is not None:  # this request failed after its retries (the others are kept)
                        failed[c] = err
                        continue
                    failed.pop(c, None)
                    for i, text in zip(need[c], texts):
                        raw[c][i].append(text)
                        parsed[c][i] = parse_hypothesis(text, cot=cfg.cot)
            todo = [(c, i) for c, i in todo if parsed[c][i] is None]
        S = torch.full((B, D, K), math.nan)
        for c in range(len(convs)):
            for i in range(K):
                if parsed[c][i] is not None:
                    S[c // D, c % D, i] = parsed[c][i][0]
        # 2. verifier: one Yes/No question per parsed hypothesis
        V = None
        no_verdict: dict[tuple[int, int], int] = {}  # (sample, dimension) -> hypotheses without a verdict
        if cfg.verifier != "none":
            V = torch.zeros((B, D, K))
            vq, where = [], []
            for c in range(len(convs)):
                b, d = divmod(c, D)
                for i in range(K):
                    if parsed[c][i] is not None:
                        s, reason = parsed[c][i]
                        vq.append(self._verify_conv(batch.prompts[b], srcs[b], batch.images[b],
                                                    batch.metadata[b], self.dims[d], s, reason))
                        where.append((b, d, i))
            if vq:
                vc = list(self.template["verify_choices"])
                vraw, verrs = call_rows(self.verifier_backend, "choice_probs", vq, vc, isolate=isolate)
                p, _ = usable_rows(vraw, len(vq), len(vc))
                for (b, d, i), py, err in zip(where, p[:, 0].tolist(), verrs):
                    if err is not None:
                        failed.setdefault(b * D + d, f"(verifier) {err}")
                        py = math.nan
                    if math.isnan(py):  # no usable Yes/No probability: unanswered, never a rejection
                        no_verdict[(b, d)] = no_verdict.get((b, d), 0) + 1
                        V[b, d, i] = math.nan
                        continue
                    V[b, d, i] = py if cfg.verifier == "soft" else float(py >= 0.5)
        # 3. arithmetic
        r, rejected = dimension_scores(S, V, eps=cfg.eps, all_rejected=cfg.all_rejected)
        R = aggregate_dimensions(r, cfg.aggregate)
        scores = R if cfg.output == "raw" else normalise(R)
        errors: list[str | None] = [None] * B
        details, rationales = [], []
        for b in range(B):
            reasons = []
            for d, dim in enumerate(self.dims):
                c = b * D + d
                bad = [i for i in range(K) if parsed[c][i] is None]
                if c in failed:  # first, with the prefix leading the reason: a score cache must not store it
                    reasons.insert(sum(r.startswith(JUDGE_FAILURE_PREFIX) for r in reasons),
                                   f"{JUDGE_FAILURE_PREFIX} ({dim}): {failed[c]}")
                elif bad and (cfg.unparsed == "invalid" or len(bad) == K):
                    sample = raw[c][bad[0]][-1] if raw[c][bad[0]] else ""
                    reasons.append(f"{dim}: {len(bad)}/{K} hypotheses unparseable after {cfg.max_retries} "
                                   f"retries; last answer: {sample[:200]!r}")
                elif (b, d) in no_verdict:
                    reasons.append(f"{dim}: the verifier returned no usable Yes/No probability for "
                                   f"{no_verdict[(b, d)]}/{K - len(bad)} hypotheses (unanswered, not rejected)")
                elif bool(rejected[b, d]) and cfg.all_rejected == "invalid":
                    reasons.append(f"{dim}: the verifier rejected all {K - len(bad)} hypotheses")
            if reasons:
                errors[b] = "; ".join(reasons)
                scores[b] = math.nan
            details.append({"dimensions": {
                dim: {"r": _f(r[b, d]), "hypotheses": [
                    {"score": parsed[b * D + d][i][0] if parsed[b * D + d][i] else None,
                     "rationale": parsed[b * D + d][i][1] if parsed[b * D + d][i] else None,
                     "verdict": None if V is None or parsed[b * D + d][i] is None else _f(V[b, d, i]),
                     "raw": raw[b * D + d][i][-1] if raw[b * D + d][i] else None,
                     "attempts": len(raw[b * D + d][i])} for i in range(K)]}
                for d, dim in enumerate(self.dims)}, "raw": _f(R[b])})
            rationales.append(self._rationale(details[-1]))
        valid = torch.tensor([e is None for e in errors]) & torch.isfinite(scores)
        dims = {dim: r[:, d] for d, dim in enumerate(self.dims)}
        dims["raw"] = R
        return RewardOutput(scores=scores, valid=valid, errors=errors, dimensions=dims, rationales=rationales,
                            details=details, info=self._info())

    @staticmethod
    def _rationale(det: dict[str, Any]) -> str:
        parts = []
        for dim, dd in det["dimensions"].items():
            hyps = dd["hypotheses"]
            kept = [h for h in hyps if h["score"] is not None and (h["verdict"] is None or h["verdict"] >= 0.5)]
            best = next((h["rationale"] for h in kept if h["rationale"]), "")
            r = "n/a" if dd["r"] is None else f"{dd['r']:.2f}"
            parts.append(f"{dim} {r} ({len(kept)}/{len(hyps)} kept){': ' + best if best else ''}")
        return " | ".join(parts)

    def _info(self) -> dict[str, Any]:
        cfg = self.config
        return {"template": self.template.id, "judge": self.judge.describe(),
                "verifier_judge": self.verifier_backend.describe() if self.verifier_backend is not self.judge else None,
                "k": cfg.k, "verifier": cfg.verifier, "cot": cfg.cot, "dimensions": list(self.dims),
                "aggregate": cfg.aggregate, "all_rejected": cfg.all_rejected, "eps": cfg.eps,
                "temperature": cfg.temperature, "output": cfg.output}

    # ------------------------------------------------------------------ pairwise
    def compare(self, images_a: Any, images_b: Any, prompt: str | Sequence[str] | None = None, *,
                sources: Sequence[Any] | None = None, metadata: Sequence[dict[str, Any] | None] | None = None,
                batch_size: int | None = None, on_error: str = "raise") -> PairwiseOutput:
        """P(a preferred over b). ``compare_mode="pairwise"`` (default): one native A-or-B question asked in
        both orders (position swap), ``P(a) = (P(A | a,b) + P(B | b,a)) / 2``; ``"scores"``: the EVR scores
        of both, ``sigmoid((s_a - s_b) / compare_temperature)``."""
        if self.config.compare_mode == "scores":
            return super().compare(images_a, images_b, prompt, sources=sources, metadata=metadata,
                                   batch_size=batch_size, on_error=on_error)
        out = self._pair_call(images_a, images_b, prompt, sources, metadata, "2way", batch_size, on_error)
        return PairwiseOutput(prob_a=out.scores, valid=out.valid, errors=out.errors, rationales=out.rationales,
                              info=out.info)

    def judge_4way(self, images_a: Any, images_b: Any, prompt: str | Sequence[str] | None = None, *,
                   sources: Sequence[Any] | None = None, metadata: Sequence[dict[str, Any] | None] | None = None,
                   batch_size: int | None = None, reasons: list | None = None) -> list[str | None]:
        """GenAI-Bench's four-way verdict per pair: ``"A>B"``, ``"B>A"``, ``"A=B=Good"`` or ``"A=B=Bad"``
        (None when the judge gave no probabilities). One native question with four single-token answers,
        asked in both orders; the verdict is the argmax of the order-averaged probabilities. ``reasons`` (a list)
        receives one entry per pair: why it has no verdict (a failed judge call starts with
        ``JUDGE_FAILURE_PREFIX``), None where it has one."""
        out = self._pair_call(images_a, images_b, prompt, sources, metadata, "4way", batch_size, "nan")
        verdicts = [d["verdict"] if (bool(v) and d) else None
                    for d, v in zip(out.details or [None] * len(out), out.valid)]
        if reasons is not None:
            reasons[:] = [None if v is not None else (e or "no verdict") for v, e in zip(verdicts, out.errors)]
        return verdicts

    def _pair_call(self, images_a, images_b, prompt, sources, metadata, mode: str, batch_size, on_error):
        from .. import media
        from ..errors import RewardInputError

        a, b = media.split_batch(images_a), media.split_batch(images_b)
        if len(a) != len(b):
            raise RewardInputError(f"compare got {len(a)} images_a but {len(b)} images_b")
        n = len(a)
        if sources is None:
            raise RewardInputError("EVR's pairwise questions need sources= (the reference image(s))")
        srcs = self._sources(sources, n)
        # candidate b travels as the last "source" so that the base class decodes and validates it
        packed = [(list(s) if isinstance(s, (list, tuple)) else [s]) + [b[i]] for i, s in enumerate(srcs)]
        metas = self._metadata(metadata, n)
        self._pair_mode()  # (creates this reward's thread-local state)
        tls = self.__dict__["_tls"]
        tls.mode = mode  # the packed candidate is one extra "source": allowed in this call only
        try:
            return self(a, prompt, sources=packed, metadata=metas, batch_size=batch_size, on_error=on_error)
        finally:
            tls.mode = None

    def _pairwise(self, batch: RewardBatch) -> RewardOutput:
        t = self.template
        fourway = self._pair_mode() == "4way"
        key = "pairwise_4way" if fourway else "pairwise"
        convs = []
        for i in range(len(batch)):
            refs, cand_b = batch.sources[i][:-1], batch.sources[i][-1]
            meta = batch.metadata[i]
            text = t.render(key, n_refs=len(refs), ref_roles=self._ref_roles(meta, len(refs)),
                            instruction=batch.prompts[i])
            for first, second in ((batch.images[i], cand_b), (cand_b, batch.images[i])):
                convs.append([{"role": "system", "content": t["pairwise_system"]},
                              {"role": "user", "content": [{"type": "image", "image": im} for im in [*refs, first, second]]
                               + [{"type": "text", "text": text}]}])
        choices = list(t[f"{key}_choices"])
        isolate = judge_policy(self.config.on_judge_error) == "nan"
        praw, perrs = call_rows(self.judge, "choice_probs", convs, choices, isolate=isolate)
        p, _ = usable_rows(praw, len(convs), len(choices))
        failed = {k // 2: e for k, e in enumerate(perrs) if e is not None}
        for k in range(len(convs)):
            if perrs[k] is not None:
                p[k] = math.nan
        p = p.reshape(len(batch), 2, len(choices))
        info = {"template": t.id, "judge": self.judge.describe(), "compare": f"{key}, both orders"}
        if fourway:
            out = self._fourway(p, info)
            for b, e in failed.items():
                out.errors[b] = f"{JUDGE_FAILURE_PREFIX}: {e}"
            return out
        ab, ba = p[:, 0, 0], p[:, 1, 1]  # P(a) when a is shown first / second
        prob = 0.5 * (ab + ba)
        rats = [f"P(a) with a first: {x:.4f}; with a second: {y:.4f}" for x, y in zip(ab.tolist(), ba.tolist())]
        errors = [None if math.isfinite(v) else (f"{JUDGE_FAILURE_PREFIX}: {failed[b]}" if b in failed else
                  "the judge gave no usable probability for the A-or-B question in at least one order")
                  for b, v in enumerate(prob.tolist())]
        return RewardOutput(scores=prob, rationales=rats, info=info, errors=errors,
                            details=[{"p_a_first": x, "p_a_second": y} for x, y in zip(ab.tolist(), ba.tolist())])

    @staticmethod
    def _fourway(p: torch.Tensor, info: dict[str, Any]) -> RewardOutput:
        """``p``: ``[B, 2 orders, 4]`` over (first better, second better, both good, both bad) with a shown first
        in order 0 and second in order 1 -> verdicts from the order-averaged probabilities."""
        avg = torch.stack([0.5 * (p[:, 0, 0] + p[:, 1, 1]),   # a better
                           0.5 * (p[:, 0, 1] + p[:, 1, 0]),   # b better
                           p[:, :, 2].mean(1), p[:, :, 3].mean(1)], dim=1)  # [B, 4]
        labels = ("A>B", "B>A", "A=B=Good", "A=B=Bad")
        ok = torch.isfinite(avg).all(1)
        best = avg.nan_to_num(-1.0).argmax(1)
        scores = torch.where(ok, avg.gather(1, best[:, None])[:, 0], torch.full_like(ok, float("nan"), dtype=torch.float32))
        details = [{"verdict": labels[int(j)], "probs": dict(zip(labels, row))} if good else None
                   for j, row, good in zip(best.tolist(), avg.tolist(), ok.tolist())]
        errors = [None if good else "the judge returned no probabilities for the four answers" for good in ok.tolist()]
        return RewardOutput(scores=scores, valid=ok, errors=errors, info=info, details=details)

    @classmethod
    def tiny(cls, workdir: str) -> "EVR":
        """EVR on a tiny random Qwen2.5-VL judge (its answers do not parse: every sample is NaN + reason)."""
        from ..testing import save_tiny_checkpoint

        path = save_tiny_checkpoint("qwen2_5_vl", f"{workdir}/tiny-evr-judge")
        # two dimensions, short answers, no retries: the conformance suite calls it ~30 times on CPU
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"}, k=2, max_new_tokens=6,
                   max_retries=0, dimensions=("reference_consistency", "instruction_consistency"))

    def to(self, device):
        """Move the judge model(s) (transformers backend) to ``device``."""
        import torch as _torch

        for j in {id(self.judge): self.judge, id(self.verifier_backend): self.verifier_backend}.values():
            if hasattr(j, "to"):
                j.to(device)
        self._device = _torch.device(device)
        return self


def _f(x: torch.Tensor) -> float | None:
    v = float(x)
    return None if math.isnan(v) else v
