"""Anti-hacking detectors: yes/no failure-mode checks by an MLLM judge, used as vetoes by the composite.

Seed 001: *pointwise* detectors look at the policy image alone (garbled or unrequested text); *reference*
detectors compare the policy image with the frozen base model's image for the same prompt and seed (a
non-photographic style drifting to photorealism), judged in both orders, and a hit needs both. A detector
is enabled for a prompt only when its failure mode conflicts with the prompt. Questions and enabling
conditions live in a versioned template (``rewardkit/templates/rubric/detectors.yaml``).

Score per sample: 1.0 when at least one enabled detector fired, else 0.0 (``higher_is_better=False``).
Dimensions: one per detector, 1 / 0 where enabled, NaN where not enabled for the prompt.

    >>> det = load_reward("detectors", judge="transformers:<ckpt>", applicability_cache="det.jsonl")
    >>> det(images, prompts, metadata=[{"reference_image": base_img}, ...])

Enablement per (prompt, detector): ``metadata[i]["detectors"]`` (a list of enabled names) when given, else
the cache (an entry counts only under the same template id / version and judge), else a text-only yes/no
question to the judge about the prompt (``applies_question``), cached.
``applicability="always"`` enables every detector for every prompt (the ungated ablation).

No usable probability is ever read as "No". A question the judge gives no usable Yes/No probability for is
unanswered: an enablement question is not cached (asked again next time) and leaves the detector's
enablement unknown; a detector question leaves the detector's verdict unknown (a reference detector with one
order answered "No" is still known not to fire). The score is 1 when some detector is known to have fired,
0 when every enabled detector is known not to have fired, else NaN with a reason naming the unanswered
question(s). A failing judge call follows ``on_judge_error`` (:mod:`rewardkit.judges.policy`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..compose.rubric import RubricCache, yes_no_conversation
from ..judges.policy import (JUDGE_FAILURE_PREFIX, JudgePolicyMixin, call_rows, check_policy, describe_failure,
                             is_judge_failure, judge_policy, usable_rows)
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from ._judge_setup import judge_overrides

__all__ = ["Detectors", "DetectorsConfig"]

_KINDS = ("pointwise", "reference")
_ORDINAL = {0: "the first image", 1: "the second image"}


@dataclass
class DetectorsConfig(RewardConfig):
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    template: str = "detectors"
    #: names of the template's detectors to run (empty = all)
    detectors: list = field(default_factory=list)
    #: "prompt": enable each detector only when its failure mode conflicts with the prompt; "always": all
    applicability: str = "prompt"
    #: JSONL cache of per-prompt enablement ("" = in memory)
    applicability_cache: str = ""
    #: metadata key of the frozen base model's image for reference detectors
    reference_key: str = "reference_image"
    #: a reference detector enabled for a sample without a reference image: "invalid" (NaN + reason) or
    #: "skip" (that detector is treated as not enabled for the sample)
    missing_reference: str = "invalid"
    threshold: float = 0.5
    batch_size: int = 16
    #: a failing judge call (after the backend's retries): "auto" (follow the call's on_error), "nan", "raise"
    on_judge_error: str = "auto"


class Detectors(JudgePolicyMixin, Reward):
    """1 when an enabled anti-hacking detector fires on the image, else 0 (docs/compose.md)."""

    name: ClassVar[str] = "detectors"
    tasks = frozenset({"t2i"})
    higher_is_better = False
    score_range = (0.0, 1.0)
    extras = ("hf",)
    uses_judge: ClassVar[bool] = True
    Config = DetectorsConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template, resolve_judge

        super().__init__(config, **judge_overrides(overrides, judge=judge))
        cfg = self.config
        if cfg.applicability not in ("prompt", "always"):
            raise ValueError(f"applicability must be 'prompt' or 'always', got {cfg.applicability!r}")
        if cfg.missing_reference not in ("invalid", "skip"):
            raise ValueError(f"missing_reference must be 'invalid' or 'skip', got {cfg.missing_reference!r}")
        check_policy(cfg.on_judge_error, self.name)
        if not 0.0 < cfg.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {cfg.threshold}")
        self.judge = resolve_judge(judge, cfg.judge, cfg.judge_kwargs, owner=self.name)
        self.template = load_template("rubric", cfg.template)
        specs = dict(self.template["detectors"])
        names = list(cfg.detectors) or list(specs)
        unknown = [n for n in names if n not in specs]
        if unknown:
            raise ValueError(f"unknown detector(s) {unknown}; template {self.template.id} has {sorted(specs)}")
        self.specs = {n: dict(specs[n]) for n in names}
        for n, s in self.specs.items():
            if s.get("kind") not in _KINDS:
                raise ValueError(f"detector {n!r}: kind must be one of {_KINDS}")
            if str(s.get("enabled_when", "any")) not in ("Yes", "No", "any"):
                raise ValueError(f"detector {n!r}: enabled_when must be Yes, No or any")
        self.dimensions = tuple(self.specs)
        self.cache = RubricCache(cfg.applicability_cache or None)
        self.default_batch_size = cfg.batch_size

    # ------------------------------------------------------------------ enablement
    def enabled_for(self, prompts: Sequence[str], *, failures: dict[str, str] | None = None
                    ) -> list[dict[str, bool | None]]:
        """Per prompt, ``{detector: enabled}``; asks the judge (text only, one batch) for uncached prompts.

        ``None`` marks a detector whose enablement question the judge left unanswered (no usable
        probability): nothing is cached for it, so it is asked again next time. ``failures`` (a dict) isolates
        failing requests (backends with ``isolates_rows``): ``failures[prompt]`` gets the error, the detector
        is None for that prompt, and the other prompts are kept."""
        if self.config.applicability == "always":
            return [{n: True for n in self.specs} for _ in prompts]
        choices = list(self.template.get("choices", ["Yes", "No"]))
        ask: list[tuple[str, str]] = []
        for p in dict.fromkeys(prompts):
            have = self._cached_applies(p)
            ask += [(p, n) for n, s in self.specs.items()
                    if str(s.get("enabled_when", "any")) != "any" and n not in have]
        fresh: dict[str, dict[str, bool | None]] = {}
        if ask:
            system = self.template.get("applies_system")
            convs = []
            for p, n in ask:
                text = self.template.render("applies_prompt", prompt=p, question=self.specs[n]["applies_question"])
                convs.append([*([{"role": "system", "content": system}] if system else []),
                              {"role": "user", "content": [{"type": "text", "text": text}]}])
            raw, errs = call_rows(self.judge, "choice_probs", convs, choices, isolate=failures is not None)
            probs, ok = usable_rows(raw, len(convs), len(choices))
            for (p, n), row, good, err in zip(ask, probs, ok.tolist(), errs):
                fresh.setdefault(p, {})[n] = bool(row[0] > self.config.threshold) if good and err is None else None
                if err is not None and failures is not None:
                    failures.setdefault(p, f"whether detector {n} applies: {err}")
            for p, ans in fresh.items():
                answered = {k: v for k, v in ans.items() if v is not None}
                if answered:  # only answered questions are cached
                    merged = self._cached_applies(p)
                    merged.update(answered)
                    self.cache.put(p, applies=merged, template=self.template.id, judge=self._judge_id())
        out = []
        for p in prompts:
            applies = {**self._cached_applies(p), **fresh.get(p, {})}
            row: dict[str, bool | None] = {}
            for n, s in self.specs.items():
                when = str(s.get("enabled_when", "any"))
                if when == "any":
                    row[n] = True
                else:
                    a = applies.get(n)
                    row[n] = None if a is None else (a == (when == "Yes"))
            out.append(row)
        return out

    def _judge_id(self) -> str:
        return json.dumps(self.judge.describe(), sort_keys=True, default=str)

    def _cached_applies(self, prompt: str) -> dict[str, bool]:
        """Cached enablement answers for ``prompt``, when they were given under this template (id and version)
        by this judge; otherwise none (asked again, and the entry is replaced). Non-boolean entries are
        ignored (asked again)."""
        rec = self.cache.get(prompt) or {}
        if rec.get("template") != self.template.id or rec.get("judge") != self._judge_id():
            return {}
        have = rec.get("applies")
        if not isinstance(have, dict):
            return {}
        return {k: v for k, v in have.items() if isinstance(v, bool)}

    # ------------------------------------------------------------------ scoring
    def _judge_failed(self, exc: BaseException) -> str:
        if not is_judge_failure(exc) or judge_policy(self.config.on_judge_error) != "nan":
            raise exc
        return describe_failure(exc)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        from ..media import to_pil

        cfg = self.config
        n = len(batch)
        choices = list(self.template.get("choices", ["Yes", "No"]))
        system = self.template.get("answer_system")
        errors: list[str | None] = [None] * n
        enabled: list[dict[str, bool | None]] = [{} for _ in range(n)]
        need = [i for i in range(n) if batch.metadata[i].get("detectors") is None]
        from_judge: dict[int, dict[str, bool | None]] = {}
        isolate = judge_policy(cfg.on_judge_error) == "nan"
        failed: dict[str, str] = {}
        if need:
            try:
                from_judge = dict(zip(need, self.enabled_for([batch.prompts[i] for i in need],
                                                             failures=failed if isolate else None)))
            except Exception as exc:  # noqa: BLE001 - re-raised unless the policy says NaN
                reason = self._judge_failed(exc)
                for i in need:
                    errors[i] = reason
        for i in range(n):
            if errors[i] is not None:
                continue
            listed = batch.metadata[i].get("detectors")
            if listed is not None:
                if isinstance(listed, str) or not isinstance(listed, (list, tuple, set, frozenset)):
                    errors[i] = f"metadata['detectors'] must be a list of detector names, got {listed!r}"
                    continue
                bad = [d for d in listed if d not in self.specs]
                if bad:
                    errors[i] = f"metadata['detectors'] names unknown detector(s) {bad}"
                else:
                    enabled[i] = {d: d in listed for d in self.specs}
            elif batch.prompts[i] in failed:
                errors[i] = f"{JUDGE_FAILURE_PREFIX} for {failed[batch.prompts[i]]}"
            else:
                enabled[i] = from_judge[i]
        refs: list[Any] = [None] * n
        for i in range(n):
            if errors[i] is not None:
                continue
            wants_ref = [d for d, on in enabled[i].items() if on and self.specs[d]["kind"] == "reference"]
            raw = batch.metadata[i].get(cfg.reference_key)
            if wants_ref and raw is None:
                if cfg.missing_reference == "invalid":
                    errors[i] = (f"reference detector(s) {wants_ref} apply but metadata has no "
                                 f"{cfg.reference_key!r} (the frozen base model's image)")
                else:
                    for d in wants_ref:
                        enabled[i][d] = False
            elif wants_ref:
                try:
                    refs[i] = to_pil(raw)
                except Exception as exc:  # media raises its own error types for undecodable input
                    errors[i] = f"metadata[{cfg.reference_key!r}] is not an image: {exc}"

        convs, where = [], []
        for i in range(n):
            if errors[i] is not None:
                continue
            for d, on in enabled[i].items():
                if not on:  # False (not enabled) or None (enablement unknown: not asked)
                    continue
                spec = self.specs[d]
                if spec["kind"] == "pointwise":
                    q = self.template.render("answer_prompt", question=spec["question"].strip())
                    convs.append(yes_no_conversation([batch.images[i]], q, system))
                    where.append((i, d, 0))
                else:  # both orders: (reference, candidate) and (candidate, reference)
                    for order, imgs in enumerate(([refs[i], batch.images[i]], [batch.images[i], refs[i]])):
                        ref_pos, cand_pos = (0, 1) if order == 0 else (1, 0)
                        text = spec["question"].strip().format(reference=_ORDINAL[ref_pos],
                                                               candidate=_ORDINAL[cand_pos])
                        text = text[0].upper() + text[1:]
                        convs.append(yes_no_conversation(imgs, self.template.render("answer_prompt", question=text),
                                                         system))
                        where.append((i, d, order))
        p_yes: dict[tuple[int, str], list[float]] = {}
        if convs:
            try:
                with self.judge.session():
                    raw, errs = call_rows(self.judge, "choice_probs", convs, choices, isolate=isolate)
                probs, _ = usable_rows(raw, len(convs), len(choices))
                for (i, d, _), row, err in zip(where, probs, errs):
                    p_yes.setdefault((i, d), []).append(float(row[0]) if err is None else math.nan)  # NaN: unanswered
                    if err is not None and errors[i] is None:  # this sample's request failed; others kept
                        errors[i] = f"{JUDGE_FAILURE_PREFIX} for detector {d}: {err}"
            except Exception as exc:  # noqa: BLE001 - re-raised unless the policy says NaN
                reason = self._judge_failed(exc)
                for i, _, _ in where:
                    errors[i] = reason

        scores = torch.full((n,), float("nan"))
        dims = {d: torch.full((n,), float("nan")) for d in self.specs}
        details: list[dict[str, Any] | None] = [None] * n
        for i in range(n):
            if errors[i] is not None:
                continue
            fired_any, unknown = False, []
            det: dict[str, Any] = {}
            for d, on in enabled[i].items():
                if on is None:
                    unknown.append(f"{d} (whether it applies: {self.specs[d]['applies_question'].strip()[:120]!r})")
                    continue
                if not on:
                    continue
                ps = p_yes[(i, d)]
                det[d] = [round(p, 6) if p == p else None for p in ps]
                # reference: both orders must say yes; one usable "no" settles it, an unanswered order doesn't
                if any(p == p and p <= cfg.threshold for p in ps):
                    fired: bool | None = False
                elif any(p != p for p in ps):
                    fired = None
                    unknown.append(f"{d} ({self.specs[d]['question'].strip()[:120]!r})")
                else:
                    fired = True
                if fired is not None:
                    dims[d][i] = float(fired)
                    fired_any |= fired
            details[i] = {"p_yes": det}
            if fired_any:
                scores[i] = 1.0  # known whatever the unanswered ones say
            elif unknown:
                details[i]["unanswered"] = unknown
                errors[i] = "the judge gave no usable Yes/No probability for detector(s) " + "; ".join(unknown)
            else:
                scores[i] = 0.0
            if fired_any and unknown:
                details[i]["unanswered"] = unknown
        return RewardOutput(scores=scores, errors=errors, dimensions=dims, details=details,
                            info={"template": self.template.id, "judge": self.judge.describe(),
                                  "applicability": cfg.applicability})

    @classmethod
    def tiny(cls, workdir: str) -> "Detectors":
        """Pointwise detectors on a tiny random Qwen2.5-VL judge (reference ones need a base image)."""
        from pathlib import Path

        from ..testing import save_tiny_checkpoint

        path = Path(workdir) / "tiny-rubric-judge"
        if not (path / "config.json").is_file():
            save_tiny_checkpoint("qwen2_5_vl", path)
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"},
                   detectors=["garbled_text", "unrequested_text"])
