"""Intent-gated constraint reward: for *strict* prompts, questions about unrequested content, answered yes/no.

Seed 001: an offline classifier labels every prompt strict / neutral / open; for strict prompts an LLM
writes questions about content the prompt did not ask for ("Is the background free of other objects?"),
phrased so that "yes" means the constraint holds; at training time the judge answers them like the
faithfulness checklist and the reward is the fraction of "yes". The composite turns this axis on only for
strict prompts (``gate: intent``); this reward itself is NaN ("not applicable") for non-strict prompts
unless ``only_strict=False`` (the ungated ablation, which then needs questions for every prompt).

    >>> reward = load_reward("constraints", judge="transformers:<ckpt>", questions="constraints.jsonl")
    >>> reward.prepare(prompts, progress=True)      # offline: intent labels, then questions for strict ones
    >>> reward.intent_for(prompts)                 # ["strict", "open", None (classifier failed), ...]

The intent label comes from ``metadata[i]["intent"]`` when given, else from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from ..compose.functions import INTENT_LABELS
from ..compose.rubric import RubricCache, classify_intents, generate_trees
from ..reward import RewardBatch
from .faithfulness import RubricConfig, RubricReward, _tiny_kwargs

__all__ = ["Constraints", "ConstraintsConfig"]


@dataclass
class ConstraintsConfig(RubricConfig):
    template: str = "constraints"
    #: True: score only prompts labelled strict (NaN "not applicable" otherwise); False: every prompt
    only_strict: bool = True
    #: metadata key holding an intent label that overrides the cache
    intent_key: str = "intent"
    max_new_tokens: int = 1024


class Constraints(RubricReward):
    """Fraction of "yes" to constraint questions (no unrequested content) for strict prompts."""

    name: ClassVar[str] = "constraints"
    Config = ConstraintsConfig
    metadata_key: ClassVar[str] = "constraint_questions"

    def prepare(self, prompts: Sequence[str], *, progress: bool = False) -> RubricCache:
        """Offline: classify every prompt's intent, then write constraint questions for the strict ones
        (for every prompt when ``only_strict=False``)."""
        cfg = self.config
        classify_intents(self.judge, prompts, self.template, cache=self.cache, batch_size=cfg.batch_size,
                         progress=progress)
        targets = [p for p in dict.fromkeys(prompts)
                   if not cfg.only_strict or (self.cache.get(p) or {}).get("intent") == "strict"]
        return generate_trees(self.judge, targets, self.template, cache=self.cache, batch_size=cfg.batch_size,
                              max_new_tokens=cfg.max_new_tokens, progress=progress)

    def intent_for(self, prompts: Sequence[str]) -> list[str | None]:
        """Cached intent labels (None when unknown or when the classifier failed)."""
        out = []
        for p in prompts:
            lab = (self.cache.get(p) or {}).get("intent")
            out.append(lab if lab in INTENT_LABELS else None)
        return out

    def _applicable(self, batch: RewardBatch) -> list[str | None]:
        cfg = self.config
        reasons: list[str | None] = []
        cached = self.intent_for(batch.prompts)
        for p, meta, lab in zip(batch.prompts, batch.metadata, cached):
            label = meta.get(cfg.intent_key, lab)
            if label is not None and label not in INTENT_LABELS:
                reasons.append(f"unknown intent label {label!r} (expected one of {INTENT_LABELS})")
            elif not cfg.only_strict:
                reasons.append(None)
            elif label is None:
                err = (self.cache.get(p) or {}).get("intent_error")
                reasons.append("no intent label for this prompt" + (f" ({err})" if err else
                               " (run reward.prepare(prompts) or pass metadata={'intent': ...})"))
            elif label != "strict":
                reasons.append(f"not applicable: intent is {label!r} (constraints apply to strict prompts)")
            else:
                reasons.append(None)
        return reasons

    def _tree_for(self, prompt: str, meta: dict[str, Any]):
        if (prompt not in self.cache or not (self.cache.get(prompt) or {}).get("questions")) \
                and meta.get(self.metadata_key) is None and self.config.generate_missing:
            self.prepare([prompt])
        return super()._tree_for(prompt, meta)

    @classmethod
    def tiny(cls, workdir: str) -> "Constraints":
        """On a tiny random Qwen2.5-VL judge with hand-written strict labels and questions."""
        return cls(**_tiny_kwargs(workdir, "constraints"))
