"""UnifiedReward (Wang et al. 2025, CodeGoat24/UnifiedReward): a generative judge (stock Qwen2.5-VL / Qwen3-VL
checkpoints, e.g. ``CodeGoat24/UnifiedReward-qwen-7b``) with its own text-to-image prompts, on the judge engine
(any backend).

- Pointwise (``reward(images, prompt)``): UnifiedReward's prompt asks for key elements and a score from 1 to 5
  after ``Final Score:``; the score is that number, in [1, 5]. The whole answer is the sample's rationale.
- Pairwise (``reward.compare(a, b, prompt)``): UnifiedReward's pairwise prompt; the answer must contain exactly
  one kind of conclusion, "Image 1 is better", "Image 2 is better" or "Both images are equally good"
  (1, 0, 0.5). By default asked in both orders, ``P(a) = (v(a, b) + 1 - v(b, a)) / 2`` (cancels position bias).

Parsing is strict: an answer without a well-formed verdict, with contradictory verdicts, or with a score outside
[1, 5] gives NaN and the reason (the answer text stays in ``rationales``), never a default score. Editing
templates (UnifiedReward-Edit) are not included yet.

    load_reward("unifiedreward", judge="transformers:CodeGoat24/UnifiedReward-qwen-7b",
                judge_kwargs={"dtype": "bfloat16"})
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput

__all__ = ["UnifiedReward", "parse_final_score", "parse_pair_verdict"]

_MARKER = re.compile(r"Final Score\s*:", re.IGNORECASE)
# after the marker: optional bold, a plain decimal number, optional "/5" or "/ 5", optional bold, optional
# full stop, then the end of the line. Nothing else ("4 out of 5", "3-4", "five", "1e1" are refused).
_VALUE = re.compile(r"[ \t]*(?:\*\*)?[ \t]*(\d+(?:\.\d+)?)[ \t]*(?:/[ \t]*(\d+))?[ \t]*(?:\*\*)?[ \t]*\.?[ \t]*(?:\r?\n|$)")
_VERDICTS = (("Image 1 is better", 1.0), ("Image 2 is better", 0.0), ("Both images are equally good", 0.5))


def parse_final_score(text: Any, lo: float = 1.0, hi: float = 5.0) -> tuple[float | None, str | None]:
    """The number after ``Final Score:`` -> ``(value, None)`` or ``(None, reason)``.

    Every ``Final Score:`` in the answer must carry the same well-formed number, inside ``[lo, hi]``.
    """
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    marks = list(_MARKER.finditer(text))
    if not marks:
        return None, "no 'Final Score:' in the answer"
    values = []
    for m in marks:
        v = _VALUE.match(text, m.end())
        if v is None:
            return None, f"malformed score after 'Final Score:': {text[m.end():m.end() + 30]!r}"
        if v.group(2) is not None and float(v.group(2)) != hi:
            return None, f"score given out of {v.group(2)}, expected out of {hi:g}"
        values.append(float(v.group(1)))
    if len(set(values)) > 1:
        return None, f"contradictory final scores {values}"
    x = values[0]
    if not (math.isfinite(x) and lo <= x <= hi):
        return None, f"score {x:g} outside [{lo:g}, {hi:g}]"
    return x, None


def parse_pair_verdict(text: Any) -> tuple[float | None, str | None]:
    """UnifiedReward's pairwise conclusion -> (1.0 image 1 / 0.0 image 2 / 0.5 equal, None) or (None, reason).

    Case-insensitive substring test as UnifiedReward's own evaluation, but an answer holding two different
    conclusions is refused instead of resolved by test order."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    low = text.lower()
    found = {v for phrase, v in _VERDICTS if phrase.lower() in low}
    if not found:
        return None, "no conclusion ('Image 1 is better', 'Image 2 is better' or 'Both images are equally good')"
    if len(found) > 1:
        return None, "contradictory conclusions in the answer"
    return found.pop(), None


@dataclass
class UnifiedRewardConfig(RewardConfig):
    #: judge spec for :func:`rewardkit.judges.load_judge`; or pass a backend object as ``judge=``
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    #: shorthand for ``judge="transformers:<model>"``; device / dtype merged into judge_kwargs
    model: str = ""
    device: str | None = None
    dtype: str | None = None
    #: template under rewardkit/templates/unifiedreward/ (or a YAML path): pointwise, pairwise, score range
    template: str = "t2i"
    max_new_tokens: int = 512  # UnifiedReward's inference scripts
    #: compare(): ask both orders and average (True) or only (a, b)
    both_orders: bool = True
    batch_size: int = 8


class UnifiedReward(Reward):
    """UnifiedReward judge: 1-5 'Final Score' pointwise, native pairwise verdicts for compare()."""

    name: ClassVar[str] = "unifiedreward"
    tasks = frozenset({"t2i"})
    score_range = (1.0, 5.0)
    extras = ("hf",)
    compare_temperature = 0.5
    Config = UnifiedRewardConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template
        from .vqascore import judge_from_config

        if isinstance(judge, str):
            overrides["judge"] = judge
        super().__init__(config, **overrides)
        cfg = self.config
        if cfg.batch_size < 1 or cfg.max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be >= 1")
        self.template = load_template("unifiedreward", cfg.template)
        self.score_range = (float(self.template["score_min"]), float(self.template["score_max"]))
        self.compare_is_symmetric = bool(cfg.both_orders)
        self.judge = judge_from_config(judge, cfg, owner=self.name)
        self.default_batch_size = cfg.batch_size

    def _call_scope(self):
        return self.judge.session()

    def _ask(self, convs: list) -> list[str]:
        outs = self.judge.generate(convs, n=1, temperature=0.0, max_new_tokens=self.config.max_new_tokens)
        return [o[0] if o else "" for o in outs]

    def _score(self, batch: RewardBatch) -> RewardOutput:
        convs = [[{"role": "user", "content": [{"type": "image", "image": im},
                                               {"type": "text", "text": self.template.render("pointwise", prompt=p)}]}]
                 for im, p in zip(batch.images, batch.prompts)]
        texts = self._ask(convs)
        lo, hi = self.score_range
        scores, errors = [], []
        for t in texts:
            v, why = parse_final_score(t, lo, hi)
            scores.append(float("nan") if v is None else v)
            errors.append(why)
        return RewardOutput(scores=torch.tensor(scores), valid=torch.tensor([e is None for e in errors]),
                            errors=errors, rationales=texts,
                            info={"template": self.template.id, "judge": self.judge.describe()})

    def compare(self, images_a: Any, images_b: Any, prompt: str | Sequence[str] | None = None, *,
                sources: Sequence[Any] | None = None, metadata: Sequence[dict[str, Any] | None] | None = None,
                batch_size: int | None = None, on_error: str = "raise") -> PairwiseOutput:
        """P(a preferred over b) from UnifiedReward's pairwise prompt (see the module docstring)."""
        from .. import media
        from ..errors import RewardInputError

        if on_error not in ("raise", "nan"):
            raise ValueError(f"on_error must be 'raise' or 'nan', got {on_error!r}")
        a, b = media.split_batch(images_a), media.split_batch(images_b)
        if len(a) != len(b):
            raise RewardInputError(f"compare got {len(a)} images_a but {len(b)} images_b")
        if sources is not None:
            raise RewardInputError("unifiedreward's text-to-image prompts take no sources")
        n = len(a)
        prompts = self._prompts(prompt, n)
        errors: list[str | None] = [None] * n
        pil: list[tuple[Any, Any] | None] = [None] * n
        for i in range(n):
            errors[i] = self._check_prompt(prompts[i])
            if errors[i] is None:
                try:
                    pil[i] = (media._to_pil(a[i]), media._to_pil(b[i]))
                except media._Bad as exc:
                    errors[i] = str(exc)
            if errors[i] is not None and on_error == "raise":
                raise RewardInputError(errors[i], index=i)
        prob = torch.full((n,), float("nan"))
        rationales: list[str | None] = [None] * n
        ok = [i for i in range(n) if errors[i] is None]
        orders = 2 if self.config.both_orders else 1
        chunk = batch_size or self.default_batch_size or max(len(ok), 1)
        with self._lock, self._call_scope():
            for s in range(0, len(ok), chunk):
                idx = ok[s:s + chunk]
                convs = []
                for i in idx:
                    text = self.template.render("pairwise", prompt=prompts[i])
                    pairs = [pil[i], pil[i][::-1]][:orders]
                    for first, second in pairs:
                        convs.append([{"role": "user", "content": [{"type": "image", "image": first},
                                                                   {"type": "image", "image": second},
                                                                   {"type": "text", "text": text}]}])
                texts = self._ask(convs)
                for j, i in enumerate(idx):
                    answers = texts[j * orders:(j + 1) * orders]
                    rationales[i] = "\n---\n".join(answers)
                    v_ab, why = parse_pair_verdict(answers[0])
                    if v_ab is not None and orders == 2:
                        v_ba, why2 = parse_pair_verdict(answers[1])
                        why = None if v_ba is not None else f"swapped order: {why2}"
                        v = None if v_ba is None else 0.5 * (v_ab + 1.0 - v_ba)
                    else:
                        v = v_ab
                    if v is None:
                        errors[i] = why
                    else:
                        prob[i] = v
        valid = torch.isfinite(prob)
        return PairwiseOutput(prob_a=prob, valid=valid, errors=errors, rationales=rationales,
                              info={"template": self.template.id, "judge": self.judge.describe(),
                                    "compare": "pairwise, both orders" if orders == 2 else "pairwise"})

    @classmethod
    def tiny(cls, workdir: str) -> "UnifiedReward":
        """On a tiny random Qwen2.5-VL judge (its answers do not parse: every sample is NaN + reason)."""
        from pathlib import Path

        from ..testing import save_tiny_checkpoint

        path = Path(workdir) / "tiny-unifiedreward-judge"
        if not (path / "config.json").is_file():
            save_tiny_checkpoint("qwen2_5_vl", path)
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"}, max_new_tokens=6)
