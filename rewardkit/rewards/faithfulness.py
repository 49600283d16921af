"""Faithfulness: the fraction of a prompt's checklist questions an MLLM judge answers "yes" for the image.

Seed 001 (Arena-T2I-Hard's faithfulness reward): offline, an LLM decomposes every prompt into a dependency
tree of atomic yes/no questions (Davidsonian-scene-graph style); at training time the judge answers them
per image; a question whose parent failed is not asked and counts as "no"; reward = fraction of "yes".

    >>> reward = load_reward("faithfulness", judge="transformers:Qwen/Qwen3-VL-8B-Instruct",
    ...                      questions="faith_questions.jsonl")
    >>> reward.prepare(prompts, progress=True)      # offline, once: generate + cache missing trees
    >>> reward(images, prompts)

Question trees come from, in order: ``metadata[i]["questions"]`` (a list of ``{id, question, parents}``),
the cache file (``questions=``, JSONL keyed by prompt, written by :meth:`prepare` or
``rewardkit compose questions``), or, with ``generate_missing=True``, the judge on first sight. A prompt
without a tree is NaN + the reason, never a made-up score. A question the judge gives no usable Yes/No
probability for (labels absent from the log-probs, NaN / -inf / off-scale values) is *unanswered*, never
"no": the sample is NaN with a reason naming the question. A failing judge call follows ``on_judge_error``
(see :mod:`rewardkit.judges.policy`): with ``on_error="nan"`` the affected samples are NaN + the error.

Efficiency: one ``choice_probs`` call per tree level across all images and questions; each conversation is
(system, image, question) so the backend encodes each image once and reuses the image prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..compose.rubric import QuestionTree, RubricCache, answer_trees, generate_trees, tree_score, unanswered
from ..judges.policy import JudgePolicyMixin, check_policy, describe_failure, is_judge_failure, judge_policy
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from ._judge_setup import judge_overrides

__all__ = ["Faithfulness", "RubricReward", "RubricConfig"]


@dataclass
class RubricConfig(RewardConfig):
    #: judge spec for :func:`rewardkit.judges.load_judge`; or pass a backend object as ``judge=``
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    #: JSONL cache of question trees keyed by prompt ("" = in memory only)
    questions: str = ""
    #: template name under rewardkit/templates/rubric/ (or a path to a YAML file)
    template: str = "faithfulness"
    #: "hard": fraction of questions with P(yes) > threshold (the seed); "soft": sum of P(yes) over asked
    #: questions / number of questions (a smoother signal; parents still gate by threshold)
    scoring: str = "hard"
    threshold: float = 0.5
    #: generate trees for prompts missing from the cache during scoring (appended to the cache)
    generate_missing: bool = False
    max_new_tokens: int = 1024
    batch_size: int = 16
    #: a failing judge call (after the backend's retries): "auto" (follow the call's on_error), "nan", "raise"
    on_judge_error: str = "auto"


class RubricReward(JudgePolicyMixin, Reward):
    """Base of checklist rewards: per-prompt question trees answered yes/no by an MLLM judge."""

    tasks = frozenset({"t2i"})
    score_range = (0.0, 1.0)
    dimensions = ("n_questions", "n_asked", "n_yes")
    extras = ("hf",)
    compare_temperature = 0.25  # default compare on the [0, 1] fraction scale
    uses_judge: ClassVar[bool] = True
    Config = RubricConfig
    #: which key of metadata may carry a tree for the sample
    metadata_key: ClassVar[str] = "questions"

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        from ..judges import load_template, resolve_judge

        super().__init__(config, **judge_overrides(overrides, judge=judge))
        cfg = self.config
        if cfg.scoring not in ("hard", "soft"):
            raise ValueError(f"scoring must be 'hard' or 'soft', got {cfg.scoring!r}")
        if not 0.0 < cfg.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {cfg.threshold}")
        check_policy(cfg.on_judge_error, self.name)
        self.judge = resolve_judge(judge, cfg.judge, cfg.judge_kwargs, owner=self.name)
        self.template = load_template("rubric", cfg.template)
        self.cache = RubricCache(cfg.questions or None)
        self.default_batch_size = cfg.batch_size

    # ------------------------------------------------------------------ offline preparation
    def prepare(self, prompts: Sequence[str], *, progress: bool = False) -> RubricCache:
        """Generate (and cache) the question tree of every prompt that has none yet."""
        return generate_trees(self.judge, prompts, self.template, cache=self.cache, batch_size=self.config.batch_size,
                              max_new_tokens=self.config.max_new_tokens, progress=progress)

    # ------------------------------------------------------------------ scoring
    def _tree_for(self, prompt: str, meta: dict[str, Any]) -> tuple[QuestionTree | None, str | None]:
        """The sample's tree, or None and the reason it has none."""
        if meta.get(self.metadata_key) is not None:
            try:
                return QuestionTree.from_list(meta[self.metadata_key]), None
            except ValueError as exc:
                return None, f"metadata[{self.metadata_key!r}] is not a question tree: {exc}"
        if prompt not in self.cache and self.config.generate_missing:
            self.prepare([prompt])
        rec = self.cache.get(prompt)
        if rec is None:
            return None, (f"no {self.name} questions for this prompt (generate them offline with "
                          f"reward.prepare(prompts) or `rewardkit compose questions`)")
        if not rec.get("questions"):
            return None, f"question generation failed for this prompt: {rec.get('error') or 'empty list'}"
        try:
            return QuestionTree.from_list(rec["questions"]), None
        except ValueError as exc:
            return None, f"cached questions are not a valid tree: {exc}"

    def _applicable(self, batch: RewardBatch) -> list[str | None]:
        """Per sample, None when the reward applies, else the reason it does not (subclasses)."""
        return [None] * len(batch)

    def _judge_failed(self, exc: BaseException) -> str:
        """The reason for samples hit by a failing judge call, or re-raise per ``on_judge_error``."""
        if not is_judge_failure(exc) or judge_policy(self.config.on_judge_error) != "nan":
            raise exc
        return describe_failure(exc)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        cfg = self.config
        n = len(batch)
        trees: list[QuestionTree | None] = [None] * n
        errors: list[str | None] = list(self._applicable(batch))
        gen_failed: str | None = None
        for i in range(n):
            if errors[i] is None:
                prompt, meta = batch.prompts[i], batch.metadata[i]
                if gen_failed is not None and cfg.generate_missing and meta.get(self.metadata_key) is None \
                        and self.cache.tree(prompt) is None:
                    errors[i] = gen_failed  # the judge already failed generating in this chunk: do not wait again
                    continue
                try:  # (generate_missing asks the judge here)
                    trees[i], errors[i] = self._tree_for(prompt, meta)
                except Exception as exc:  # noqa: BLE001 - re-raised unless the policy says NaN
                    errors[i] = gen_failed = self._judge_failed(exc)
        failures: dict[int, str] | None = {} if judge_policy(cfg.on_judge_error) == "nan" else None
        try:
            probs = answer_trees(self.judge, batch.images, trees, question_format=self.template["answer_prompt"],
                                 system=self.template.get("answer_system"),
                                 choices=self.template.get("choices", ["Yes", "No"]), threshold=cfg.threshold,
                                 failures=failures)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the policy says NaN
            reason = self._judge_failed(exc)
            for i in range(n):
                if trees[i] is not None:
                    errors[i], trees[i] = reason, None
            probs = [{} for _ in range(n)]
        scores = torch.full((n,), float("nan"))
        dims = {k: torch.full((n,), float("nan")) for k in self.dimensions}
        details: list[dict[str, Any] | None] = [None] * n
        for i, t in enumerate(trees):
            if t is None:
                continue
            p = probs[i]
            dims["n_questions"][i] = len(t)
            dims["n_asked"][i] = len(p)
            details[i] = {"p_yes": {q: (round(v, 6) if v == v else None) for q, v in p.items()}}
            missing = unanswered(t, p)
            if failures and i in failures:  # this sample's request failed (the others' were kept)
                errors[i] = f"judge call failed for {failures[i]}"
                continue
            if missing:  # never "no": the score depends on these answers
                details[i]["unanswered"] = [q.id for q in missing]
                errors[i] = ("the judge gave no usable Yes/No probability for question(s) "
                             + "; ".join(f"{q.id} ({q.text[:120]!r})" for q in missing))
                continue
            yes = {q: v > cfg.threshold for q, v in p.items()}
            if cfg.scoring == "hard":
                scores[i] = tree_score(t, yes)
            else:
                scores[i] = sum(p.values()) / len(t)
            dims["n_yes"][i] = sum(yes.values())
        return RewardOutput(scores=scores, errors=errors, dimensions=dims, details=details,
                            info={"template": self.template.id, "judge": self.judge.describe(),
                                  "scoring": cfg.scoring})


class Faithfulness(RubricReward):
    """Fraction of the prompt's dependency-tree questions the judge answers "yes" (parent failed -> "no")."""

    name: ClassVar[str] = "faithfulness"
    Config = RubricConfig

    @classmethod
    def tiny(cls, workdir: str) -> "Faithfulness":
        """On a tiny random Qwen2.5-VL judge with a small hand-written tree per conformance prompt
        (the judge's answers are random but real: every code path runs)."""
        return cls(**_tiny_kwargs(workdir, "faithfulness"))


def _tiny_kwargs(workdir: str, kind: str) -> dict[str, Any]:
    import json
    from pathlib import Path

    from ..conformance import _PROMPTS
    from ..testing import save_tiny_checkpoint

    path = Path(workdir) / "tiny-rubric-judge"
    if not (path / "config.json").is_file():
        save_tiny_checkpoint("qwen2_5_vl", path)
    cache = Path(workdir) / f"tiny-{kind}-questions.jsonl"
    with cache.open("w", encoding="utf-8") as fh:
        for p in _PROMPTS:
            subject = p.split(" on ")[0]
            rec = {"prompt": p, "intent": "strict",
                   "questions": [{"id": "1", "question": f"Is there {subject}?", "parents": []},
                                 {"id": "2", "question": f"Does the image show: {p}?", "parents": ["1"]},
                                 {"id": "3", "question": "Is the image in focus?", "parents": []}]}
            fh.write(json.dumps(rec) + "\n")
    return {"judge": f"transformers:{path}", "judge_kwargs": {"device": "cpu"}, "questions": str(cache)}
