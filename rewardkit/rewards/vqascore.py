"""VQAScore (Lin et al. 2024, "Evaluating Text-to-Visual Generation with Image-to-Text Generation"): the
probability that a VLM answers "Yes" to ``Does this figure show "{prompt}"? Please answer Yes or No.``.

Runs on any judge backend (transformers, vLLM, OpenAI-compatible) through the judge engine's label
probabilities, with one vision encode per distinct image per call. Score in [0, 1].

**Normalisation.** The judge engine returns label probabilities renormalised over the labels, so the score
here is ``P(Yes) / (P(Yes) + P(No))`` at the first answer position. t2v_metrics (v3.1, Qwen-VL models) reports
``P(Yes)`` under the full-vocabulary softmax; the two agree when the model puts (almost) all its mass on
Yes / No, as instruction-tuned VLMs do for this question, and rank images identically per model only in that
case. Use the same template for both if you compare numbers across tools.

    load_reward("vqascore", judge="transformers:Qwen/Qwen2.5-VL-7B-Instruct", judge_kwargs={"dtype": "bfloat16"})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput


def judge_from_config(judge: Any, cfg: Any, *, owner: str):
    """The judge backend of a judge reward: ``judge`` (a backend / ``(model, processor)`` / spec), else the
    config's ``judge`` spec or ``model`` shorthand, with ``device`` / ``dtype`` merged into ``judge_kwargs``."""
    from ..judges import BACKENDS, resolve_judge

    spec = cfg.judge or cfg.model
    if spec and spec.partition(":")[0] not in BACKENDS:
        spec = f"transformers:{spec}"
    kind = spec.partition(":")[0] if spec else ""
    kw = dict(cfg.judge_kwargs)
    if cfg.device is not None and kind in ("transformers", "hf"):
        kw.setdefault("device", cfg.device)
    if cfg.dtype is not None and kind in ("transformers", "hf", "vllm"):
        kw.setdefault("dtype", cfg.dtype)
    return resolve_judge(judge, spec, kw, owner=owner)


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
    #: template under rewardkit/templates/vqascore/ (or a YAML path): question, answer, negative
    template: str = "default"
    batch_size: int = 16


class VQAScore(Reward):
    """VQAScore: P("Yes") of a VLM judge to 'Does this figure show "{prompt}"?'."""

    name: ClassVar[str] = "vqascore"
    tasks = frozenset({"t2i"})
    score_range = (0.0, 1.0)
    extras = ("hf",)
    compare_temperature = 0.1  # on the [0, 1] probability scale
    Config = VQAScoreConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template

        if isinstance(judge, str):
            overrides["judge"] = judge
        super().__init__(config, **overrides)
        cfg = self.config
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
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
        probs = torch.as_tensor(self.judge.choice_probs(convs, self.labels), dtype=torch.float32).reshape(len(convs), 2)
        p_yes = probs[:, 0].clone()
        ok = torch.isfinite(probs).all(1) & (p_yes >= 0) & (p_yes <= 1)
        errors = [None if bool(v) else "the judge returned no probability for the answer labels" for v in ok]
        p_yes[~ok] = float("nan")
        return RewardOutput(scores=p_yes, valid=ok, errors=errors,
                            info={"template": self.template.id, "judge": self.judge.describe()})

    @classmethod
    def tiny(cls, workdir: str) -> "VQAScore":
        from pathlib import Path

        from ..testing import save_tiny_checkpoint

        path = Path(workdir) / "tiny-vqascore-judge"
        if not (path / "config.json").is_file():
            save_tiny_checkpoint("qwen2_5_vl", path)
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"})
