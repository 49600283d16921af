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
the cache, else a text-only yes/no question to the judge about the prompt (``applies_question``), cached.
``applicability="always"`` enables every detector for every prompt (the ungated ablation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..compose.rubric import RubricCache, yes_no_conversation
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput

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


class Detectors(Reward):
    """1 when an enabled anti-hacking detector fires on the image, else 0 (see module docs)."""

    name: ClassVar[str] = "detectors"
    tasks = frozenset({"t2i"})
    higher_is_better = False
    score_range = (0.0, 1.0)
    extras = ("hf",)
    uses_judge: ClassVar[bool] = True
    Config = DetectorsConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template, resolve_judge

        if isinstance(judge, str):
            overrides["judge"] = judge
        super().__init__(config, **overrides)
        cfg = self.config
        if cfg.applicability not in ("prompt", "always"):
            raise ValueError(f"applicability must be 'prompt' or 'always', got {cfg.applicability!r}")
        if cfg.missing_reference not in ("invalid", "skip"):
            raise ValueError(f"missing_reference must be 'invalid' or 'skip', got {cfg.missing_reference!r}")
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
    def enabled_for(self, prompts: Sequence[str]) -> list[dict[str, bool]]:
        """Per prompt, ``{detector: enabled}``; asks the judge (text only, one batch) for uncached prompts."""
        if self.config.applicability == "always":
            return [{n: True for n in self.specs} for _ in prompts]
        choices = list(self.template.get("choices", ["Yes", "No"]))
        ask: list[tuple[str, str]] = []
        for p in dict.fromkeys(prompts):
            have = (self.cache.get(p) or {}).get("applies", {})
            ask += [(p, n) for n, s in self.specs.items()
                    if str(s.get("enabled_when", "any")) != "any" and n not in have]
        if ask:
            system = self.template.get("applies_system")
            convs = []
            for p, n in ask:
                text = self.template.render("applies_prompt", prompt=p, question=self.specs[n]["applies_question"])
                convs.append([*([{"role": "system", "content": system}] if system else []),
                              {"role": "user", "content": [{"type": "text", "text": text}]}])
            probs = torch.as_tensor(self.judge.choice_probs(convs, choices), dtype=torch.float32)
            answers: dict[str, dict[str, bool]] = {}
            for (p, n), row in zip(ask, probs):
                answers.setdefault(p, {})[n] = bool(row[0] > self.config.threshold)
            for p, ans in answers.items():
                merged = dict((self.cache.get(p) or {}).get("applies", {}))
                merged.update(ans)
                self.cache.put(p, applies=merged, template=self.template.id)
        out = []
        for p in prompts:
            applies = (self.cache.get(p) or {}).get("applies", {})
            row = {}
            for n, s in self.specs.items():
                when = str(s.get("enabled_when", "any"))
                row[n] = True if when == "any" else (applies[n] == (when == "Yes"))
            out.append(row)
        return out

    # ------------------------------------------------------------------ scoring
    def _score(self, batch: RewardBatch) -> RewardOutput:
        from ..media import to_pil

        cfg = self.config
        n = len(batch)
        choices = list(self.template.get("choices", ["Yes", "No"]))
        system = self.template.get("answer_system")
        errors: list[str | None] = [None] * n
        enabled = [None] * n
        need = [i for i in range(n) if batch.metadata[i].get("detectors") is None]
        from_judge = dict(zip(need, self.enabled_for([batch.prompts[i] for i in need]))) if need else {}
        for i in range(n):
            listed = batch.metadata[i].get("detectors")
            if listed is not None:
                bad = [d for d in listed if d not in self.specs]
                if bad:
                    errors[i] = f"metadata['detectors'] names unknown detector(s) {bad}"
                    enabled[i] = {}
                else:
                    enabled[i] = {d: d in listed for d in self.specs}
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
                if not on:
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
            with self.judge.session():
                probs = torch.as_tensor(self.judge.choice_probs(convs, choices), dtype=torch.float32)
            for (i, d, _), row in zip(where, probs):
                p_yes.setdefault((i, d), []).append(float(row[0]))

        scores = torch.full((n,), float("nan"))
        dims = {d: torch.full((n,), float("nan")) for d in self.specs}
        details: list[dict[str, Any] | None] = [None] * n
        for i in range(n):
            if errors[i] is not None:
                continue
            fired_any = False
            det: dict[str, Any] = {}
            for d, on in enabled[i].items():
                if not on:
                    continue
                ps = p_yes[(i, d)]
                fired = all(p > cfg.threshold for p in ps)  # reference: both orders must say yes
                dims[d][i] = float(fired)
                fired_any |= fired
                det[d] = [round(p, 6) for p in ps]
            scores[i] = float(fired_any)
            details[i] = {"p_yes": det}
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
