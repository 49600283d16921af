"""The ``geneval`` reward's per-sample output as the official records: the one place that knows its ``details``
keys, shared by ``rewardkit bench geneval`` and the flow_grpo drop-in (which may not import each other).

The record is the one djghosh13/geneval @ af4902f ``evaluation/evaluate_images.py:247-258`` writes per image:
``filename, tag, prompt, correct, reason, metadata`` (``json.dumps`` of the prompt's metadata row) and
``details`` (``json.dumps`` of ``{class: [box, ...]}``). flow_grpo's reward server adds ``strict_correct`` and
the partial ``score`` (yifan123/reward-server @ 92ac29f ``reward_server/gen_eval.py:291-305``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

__all__ = ["official_records", "flow_grpo_geneval", "GENEVAL_TAGS"]

#: the six GenEval tags, in reward-server's order (gen_eval.py:321-328, ``required_keys``)
GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def _detail(out: Any, i: int) -> dict[str, Any]:
    details = out.details[i] if out.details is not None else None
    if not out.valid[i].item() or not isinstance(details, dict):
        why = out.errors[i] or "no per-sample details"
        raise ValueError(f"sample {i} has no GenEval verdict: {why}")
    if "correct" not in details:
        raise ValueError(f"sample {i}: the geneval reward's details lack 'correct' (keys: {sorted(details)})")
    return details


def official_records(out: Any, metadata: Sequence[dict[str, Any]],
                     filenames: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """``RewardOutput`` of the ``geneval`` reward + each sample's metadata row -> the official per-image records
    (evaluate_images.py:247-258; ``filename`` first when ``filenames`` is given). A sample without a verdict (an
    invalid one) raises with its reason: the official summary has no way to leave an image out."""
    recs = []
    for i, meta in enumerate(metadata):
        d = _detail(out, i)
        boxes = d.get("details", {})
        rec = {} if filenames is None else {"filename": str(filenames[i])}
        rec.update({"tag": meta["tag"], "prompt": meta["prompt"], "correct": bool(d["correct"]),
                    "reason": str(d.get("reason", "")), "metadata": json.dumps(meta),
                    "details": boxes if isinstance(boxes, str) else json.dumps(boxes)})
        recs.append(rec)
    return recs


def flow_grpo_geneval(out: Any, metadata: Sequence[dict[str, Any]], only_strict: bool) -> dict[str, list[float]]:
    """The extra keys flow_grpo's ``multi_score`` adds for ``geneval`` (flow_grpo/rewards.py:383-389 @ ac4c86e;
    DiffusionNFT's :280-287), from reward-server's ``compute_geneval`` (gen_eval.py:320-345):

    ``accuracy`` (1.0 / 0.0 per image: the official verdict; 0.0 for every image when ``only_strict``, which
    skips it there), ``strict_accuracy`` (exact counts), then ``<tag>_strict_accuracy`` and ``<tag>_accuracy``
    for the six tags, each -10.0 on images of another tag. An image without a verdict gives NaN in every key."""
    n = len(metadata)
    acc, strict = [], []
    tags: list[str | None] = []
    for i, meta in enumerate(metadata):
        try:
            d = _detail(out, i)
        except ValueError:
            acc.append(math.nan)
            strict.append(math.nan)
            tags.append(None)
            continue
        if "strict_correct" not in d:
            raise ValueError(f"sample {i}: the geneval reward's details lack 'strict_correct' (keys: {sorted(d)})")
        acc.append(0.0 if only_strict else (1.0 if d["correct"] else 0.0))
        strict.append(1.0 if d["strict_correct"] else 0.0)
        tags.append(meta.get("tag"))
    res: dict[str, list[float]] = {"accuracy": acc, "strict_accuracy": strict}
    for suffix, vals in (("strict_accuracy", strict), ("accuracy", acc)):
        for key in GENEVAL_TAGS:
            res[f"{key}_{suffix}"] = [math.nan if tags[i] is None else (vals[i] if tags[i] == key else -10.0)
                                      for i in range(n)]
    return res
