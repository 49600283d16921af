"""flow_grpo's ``qwenvl`` reward: Qwen2.5-VL-7B-Instruct asked for an aesthetic score from 1 to 5, on rewardkit's
judge engine (any backend: transformers, vLLM, an OpenAI-compatible server).

What flow_grpo does (yifan123/flow_grpo @ ac4c86e, ``flow_grpo/qwenvl.py``): one user turn per image, the image
first and then a fixed task text (``qwenvl.py:40-58``, 63-72; the caption is **not** sent, ``QwenVLScorer`` ignores
its prompt argument), greedy ``generate`` with ``max_new_tokens=2048`` (``:91``), and the score is the first
``<Score>N</Score>`` of the answer, ``N / 5`` (``extract_scores``, ``:16-24``). The task text is the versioned
template ``rewardkit/templates/qwenvl/default.yaml``, byte for byte.

rewardkit's score is N on the 1-5 scale (as ``unifiedreward``'s); the flow_grpo drop-in multiplies by 0.2, so
``multi_score(device, {"qwenvl": 1.0})`` gives flow_grpo's N / 5. Two deliberate differences, both fail-loud:
an answer without ``<Score>N</Score>`` is NaN with the reason (flow_grpo scores it 0), and an N outside 1-5 is
NaN with the reason (flow_grpo would give N / 5 whatever N is). Decoding is greedy (temperature 0); flow_grpo's
``generate`` takes the checkpoint's ``generation_config.json`` (sampling settings included), which rewardkit does
not read: answers may differ where that config samples.
Images reach the model through the backend's processor (flow_grpo: a PNG round trip and qwen_vl_utils' resize,
which is lossless for PNG and the same ``smart_resize`` rule as the processor's).

    load_reward("qwenvl")                                         # Qwen/Qwen2.5-VL-7B-Instruct, transformers
    load_reward("qwenvl", judge="vllm:Qwen/Qwen2.5-VL-7B-Instruct")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..judges.policy import (JUDGE_FAILURE_PREFIX, JudgeError, JudgePolicyMixin, call_rows, describe_failure,
                             is_judge_failure, judge_policy)
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from ._judge_setup import judge_from_config, judge_overrides, scored_template

__all__ = ["QwenVLAesthetic", "parse_score_tag"]

# flow_grpo's pattern (qwenvl.py:19), ASCII digits only (Python's \d also takes fullwidth or Arabic-Indic digits)
_SCORE = re.compile(r"<Score>([0-9]+)</Score>")


def parse_score_tag(text: Any, lo: float = 1.0, hi: float = 5.0) -> tuple[float | None, str | None]:
    """The first ``<Score>N</Score>`` of an answer (flow_grpo's ``re.search``) -> ``(N, None)``, or
    ``(None, reason)`` when there is none or N lies outside ``[lo, hi]``."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    m = _SCORE.search(text)
    if m is None:
        return None, "no <Score>N</Score> in the answer"
    x = float(m.group(1))
    if not (lo <= x <= hi):
        return None, f"score {x:g} outside [{lo:g}, {hi:g}]"
    return x, None


@dataclass
class QwenVLConfig(RewardConfig):
    #: judge spec for :func:`rewardkit.judges.load_judge`; or pass a backend object as ``judge=``
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    #: shorthand for ``judge="transformers:<model>"`` (flow_grpo: Qwen/Qwen2.5-VL-7B-Instruct in bfloat16)
    model: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    device: str | None = None
    dtype: str | None = "bfloat16"
    #: template under rewardkit/templates/qwenvl/ (or a YAML path)
    template: str = "default"
    #: None: the template's (flow_grpo: 2048)
    max_new_tokens: int | None = None
    #: what a failing judge call gives (rewardkit.judges.policy): "auto", "nan", "raise"
    on_judge_error: str = "auto"
    batch_size: int = 8


class QwenVLAesthetic(JudgePolicyMixin, Reward):
    """flow_grpo's QwenVL aesthetic judge: a 1-5 score read from its ``<Score>N</Score>`` answer."""

    name: ClassVar[str] = "qwenvl"
    uses_prompt = False
    score_range = (1.0, 5.0)
    extras = ("hf",)
    Config = QwenVLConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        super().__init__(config, **judge_overrides(overrides, judge=judge))
        cfg = self.config
        self.template, self.max_new_tokens, self.score_range = scored_template(
            cfg, "qwenvl", owner=self.name, default_max_new_tokens=2048)
        self.text = self.template.render("pointwise")
        self.judge = judge_from_config(judge, cfg, owner=self.name)
        self.default_batch_size = cfg.batch_size

    def _call_scope(self):
        return self.judge.session()

    def conversation(self, image: Any) -> list[dict[str, Any]]:
        """The one user turn flow_grpo sends (``qwenvl.py:63-72``): the image, then the task text."""
        return [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": self.text}]}]

    def _score(self, batch: RewardBatch) -> RewardOutput:
        convs = [self.conversation(im) for im in batch.images]
        isolate = judge_policy(self.config.on_judge_error) == "nan"
        try:
            outs, failed = call_rows(self.judge, "generate", convs, isolate=isolate, n=1, temperature=0.0,
                                     max_new_tokens=self.max_new_tokens)
            failed = [None if e is None else f"{JUDGE_FAILURE_PREFIX}: {e}" for e in failed]
        except Exception as exc:  # noqa: BLE001 - re-raised unless the judge policy says NaN
            if not (isolate and is_judge_failure(exc)):
                raise
            outs, failed = [[""]] * len(convs), [describe_failure(exc)] * len(convs)
        if len(outs) != len(convs):
            raise JudgeError(f"the judge returned {len(outs)} answers for {len(convs)} conversations")
        texts = [o[0] if o else "" for o in outs]
        lo, hi = self.score_range
        scores, errors = [], []
        for text, fail in zip(texts, failed):
            v, why = (None, fail) if fail is not None else parse_score_tag(text, lo, hi)
            scores.append(float("nan") if v is None else v)
            errors.append(why)
        return RewardOutput(scores=torch.tensor(scores), valid=torch.tensor([e is None for e in errors]),
                            errors=errors, rationales=texts,
                            info={"template": self.template.id, "judge": self.judge.describe(),
                                  "max_new_tokens": self.max_new_tokens})

    @classmethod
    def tiny(cls, workdir: str) -> "QwenVLAesthetic":
        """On a tiny random Qwen2.5-VL judge (its answers do not parse: every sample is NaN + reason)."""
        from pathlib import Path

        from ..testing import save_tiny_checkpoint

        path = Path(workdir) / "tiny-qwenvl-judge"
        if not (path / "config.json").is_file():
            save_tiny_checkpoint("qwen2_5_vl", path)
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"}, dtype=None, max_new_tokens=6)
