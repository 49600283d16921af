"""VQAScore (Lin et al. 2024, "Evaluating Text-to-Visual Generation with Image-to-Text Generation"): the
probability that a VLM answers "Yes" to ``Does this figure show "{prompt}"? Please answer Yes or No.``.

**Which question** (``template=``): t2v_metrics asks two different questions depending on where it came from.
``"default"`` (= ``"t2v_metrics-3.1"``): ``Does this figure show "{prompt}"? Please answer Yes or No.``, the GitHub
version (linzhiqiu/t2v_metrics, 3.1 line); ``"t2v_metrics-3.0"``: ``Does this image show "{prompt}"?``, what the
PyPI release (``pip install t2v-metrics`` = 3.0) asks with its Qwen-VL scorers. The VQAScore paper's own numbers
come from CLIP-FlanT5 (``... Please answer yes or no.``), an architecture transformers cannot host. ``out.info
["template"]`` records the version used.

Runs on any judge backend (transformers, vLLM, OpenAI-compatible) through the judge engine's label
probabilities, with one vision encode per distinct image per call. Score in [0, 1].

**Which probability** (``probability=``):

- ``"full"`` (default, t2v_metrics parity): ``P(Yes)`` under the softmax over the **whole vocabulary** at the
  first answer position, as t2v_metrics computes it for its Qwen-VL scorers (``softmax(scores[0])[id("Yes")]``
  after a one-token greedy ``generate``; its CLIP-FlanT5 scorer also uses full-vocabulary probabilities, as
  ``exp(-mean cross-entropy)`` over the answer's label tokens). Through :meth:`~rewardkit.judges.JudgeBackend.raw_choice_probs`: exact on
  the transformers and vLLM backends and on a vLLM server; on another OpenAI-compatible server "Yes" must be
  among the ``top_logprobs`` alternatives, else the sample is NaN + reason (its probability is unknown).
  Mass the model puts on other tokens (" Yes", "yes", "The") lowers the score.
- ``"yes_no"``: ``P(Yes) / (P(Yes) + P(No))``, renormalised over the two answers (the judge engine's
  ``choice_probs``); the two agree when the model puts (almost) all its mass on Yes / No.

Differences that remain from t2v_metrics: it reads ``generate()``'s scores, i.e. after the checkpoint's
``generation_config`` logits processors (a repetition penalty, if the checkpoint sets one, lowers "Yes", which
appears in the question); rewardkit reads the raw logits.

    load_reward("vqascore", judge="transformers:Qwen/Qwen2.5-VL-7B-Instruct", judge_kwargs={"dtype": "bfloat16"})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..judges.policy import (JUDGE_FAILURE_PREFIX, JudgePolicyMixin, call_rows, check_policy, describe_failure,
                             is_judge_failure, judge_policy, usable_rows)
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from ._judge_setup import judge_from_config, judge_overrides  # judge_from_config: also imported from here


@dataclass
class VQAScoreConfig(RewardConfig):
    #: judge spec for :func:`rewardkit.judges.load_judge`; or pass a backend object as ``judge=``
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    #: shorthand for ``judge="transformers:<model>"`` (what ``rewardkit score / bench --model`` set); a string
    #: with a backend prefix ("vllm:...", "openai:...") is used as is
    model: str = ""
    #: device / dtype of a transformers (dtype: also vLLM) judge, merged into judge_kwargs
    device: str | None = None
    dtype: str | None = None
    #: template under rewardkit/templates/vqascore/ (or a YAML path): question, answer, negative. "default" =
    #: "t2v_metrics-3.1" (GitHub t2v_metrics); "t2v_metrics-3.0" = the PyPI release's question
    template: str = "default"
    #: "full": P(Yes) under the full-vocabulary softmax (t2v_metrics); "yes_no": renormalised over Yes / No
    probability: str = "full"
    #: what a failing judge call gives (rewardkit.judges.policy): "auto" (follow the call's on_error), "nan", "raise"
    on_judge_error: str = "auto"
    batch_size: int = 16
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


#: ``probability=`` options: full-vocabulary P(Yes) (t2v_metrics) or renormalised over Yes / No
PROBABILITIES = ("full", "yes_no")


class VQAScore(JudgePolicyMixin, Reward):
    """VQAScore: P("Yes") of a VLM judge to 'Does this figure show "{prompt}"?'."""

    name: ClassVar[str] = "vqascore"
    tasks = frozenset({"t2i"})
    score_range = (0.0, 1.0)
    extras = ("hf",)
    compare_temperature = 0.1  # on the [0, 1] probability scale
    Config = VQAScoreConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template

        super().__init__(config, **judge_overrides(overrides, judge=judge))
        cfg = self.config
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        if cfg.probability not in PROBABILITIES:
            raise ValueError(f"probability must be one of {PROBABILITIES}, got {cfg.probability!r}")
        check_policy(cfg.on_judge_error, self.name)
        self.template = load_template("vqascore", cfg.template)
        self.labels = [str(self.template["answer"]), str(self.template["negative"])]
        self.judge = judge_from_config(judge, cfg, owner=self.name)
        self.default_batch_size = cfg.batch_size

    def _call_scope(self):
        return self.judge.session()  # each distinct image through the vision encoder once per call

    def conversation(self, image: Any, prompt: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": self.template.render("question", prompt=prompt)}]}]

    def _score(self, batch: RewardBatch) -> RewardOutput:
        convs = [self.conversation(im, p) for im, p in zip(batch.images, batch.prompts)]
        n = len(convs)
        isolate = judge_policy(self.config.on_judge_error) == "nan"
        info = {"template": self.template.id, "judge": self.judge.describe(), "probability": self.config.probability}
        reasons: list[str | None] = [None] * n
        try:
            if self.config.probability == "full":
                why: list = []
                try:
                    raw, failed = call_rows(self.judge, "raw_choice_probs", convs, self.labels[:1], reasons=why,
                                            isolate=isolate)
                except NotImplementedError as exc:
                    raise NotImplementedError(f"{exc}; use probability='yes_no' (renormalised over Yes / No) with "
                                              "this backend") from None
                p_yes = torch.as_tensor(raw, dtype=torch.float32).reshape(n, 1)[:, 0].clone()
                if len(why) == n:
                    reasons = list(why)
            else:
                probs, failed = call_rows(self.judge, "choice_probs", convs, self.labels, isolate=isolate)
                # a row must be a distribution over (Yes, No): finite, in [0, 1], summing to 1 (else unanswered)
                raw_rows = torch.as_tensor(probs, dtype=torch.float32)
                probs, usable = usable_rows(raw_rows, n, 2)
                p_yes = probs[:, 0].clone()
                for i in range(n):
                    if not bool(usable[i]) and bool(torch.isfinite(raw_rows[i]).all()):
                        reasons[i] = (f"the judge's probabilities for {self.labels} are {raw_rows[i].tolist()}, "
                                      "not a distribution over the answers")
        except Exception as exc:  # noqa: BLE001 - re-raised unless the judge policy says NaN
            if not (isolate and is_judge_failure(exc)):
                raise
            return RewardOutput(scores=torch.full((n,), float("nan")), valid=torch.zeros(n, dtype=torch.bool),
                                errors=[describe_failure(exc)] * n, info=info)
        for i, err in enumerate(failed):
            if err is not None:  # this sample's request failed after its retries; the others are kept
                reasons[i] = f"{JUDGE_FAILURE_PREFIX}: {err}"
                p_yes[i] = float("nan")
        ok = torch.isfinite(p_yes) & (p_yes >= 0) & (p_yes <= 1)  # NaN fails every comparison: invalid
        flags = ok.tolist()
        errors = [None if v else (reasons[i] or "the judge returned no probability for the answer label (no usable log-probability)")
                  for i, v in enumerate(flags)]
        if not all(flags):
            p_yes[~ok] = float("nan")
        return RewardOutput(scores=p_yes, valid=ok, errors=errors, info=info)

    @classmethod
    def tiny(cls, workdir: str) -> "VQAScore":
        from pathlib import Path

        from ..testing import save_tiny_checkpoint

        path = Path(workdir) / "tiny-vqascore-judge"
        if not (path / "config.json").is_file():
            save_tiny_checkpoint("qwen2_5_vl", path)
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"})
