"""The records of PARROT's stages 1-3 (the fields are described in :mod:`rewardkit.parrot.pipeline`): which rows
are asked, the conversations, and how each answer becomes a record (ok, unparseable with its reason, judge
failure, skipped). No storage and no teacher here: ``generate(convs, max_new_tokens)`` answers each conversation
with a string or the exception of its failed request; ``prov`` is the provenance every record carries.
:class:`~rewardkit.parrot.pipeline.Pipeline` drives them chunk by chunk."""

from __future__ import annotations

import math
from typing import Any, Callable

from .format import ParseError, consistency_view, mean_score, parse_pairwise, parse_pointwise, parse_prediction

__all__ = ["rationale_records", "filter_records", "project_records"]

#: ``generate(convs, max_new_tokens)``: per conversation, the answer or the exception of its failed request
Generate = Callable[[list, int], list]


def _parsed(rec: dict[str, Any], ans: Any, parse: Callable) -> Any:
    """The parse of a stage-1 / stage-3 answer (``parse(answer, t2i=...)``), with ``rec["raw"]`` set; None with
    ``rec`` marked ``judge_failure`` (``ans`` is the failed request's exception) or ``unparseable`` (the reason
    and the dimension at fault)."""
    if isinstance(ans, Exception):
        rec.update(status="judge_failure", reason=f"{type(ans).__name__}: {ans}")
        return None
    rec["raw"] = ans
    try:
        return parse(ans, t2i=rec["task"] == "t2i")
    except ParseError as exc:
        rec.update(status="unparseable", reason=str(exc), dimension=exc.dimension)
        return None


def rationale_records(rows: list[dict[str, Any]], *, prov: dict[str, Any], template: Any, generate: Generate,
                      max_new_tokens: int) -> list[dict[str, Any]]:
    """Stage 1: the anchored rationale of each row (``{row, prompt, label: A|B|tie, image_a, image_b,
    sources}``), in order; a tie, a missing request or a multi-reference edit is skipped with its reason."""
    from .prompts import rationalize_conv

    recs: list[dict[str, Any] | None] = [None] * len(rows)
    ask = []
    for j, r in enumerate(rows):
        prompt = r["prompt"] if isinstance(r["prompt"], str) else None
        base = {"row": r["row"], "prompt": prompt, "label": r["label"],
                "task": "edit" if r["sources"] else "t2i", "rationale": None, "raw": None, "reason": None,
                "dimension": None, "rationale_preferred": None, **prov}
        if r["label"] == "tie":
            recs[j] = {**base, "status": "skipped", "reason": "tie label: nothing to rationalize"}
        elif prompt is None or not prompt.strip():  # never a rationale for the request "None"
            what = "edit instruction" if r["sources"] else "text-to-image prompt"
            recs[j] = {**base, "status": "skipped",
                       "reason": f"no {what} (got {r['prompt']!r:.40}): nothing to judge the images against"}
        elif len(r["sources"]) > 1:
            recs[j] = {**base, "status": "skipped", "reason": "multi-reference edit: PARROT takes one source"}
        else:
            recs[j] = base
            ask.append(j)
    convs = [rationalize_conv(template, rows[j]["prompt"], rows[j]["image_a"], rows[j]["image_b"],
                              rows[j]["label"], rows[j]["sources"]) for j in ask]
    for j, ans in zip(ask, generate(convs, max_new_tokens) if convs else []):
        rec = recs[j]
        p = _parsed(rec, ans, parse_pairwise)
        if p is not None:
            rec.update(status="ok", rationale=ans.strip(), rationale_preferred=p.preferred)
    return recs  # type: ignore[return-value]


def filter_records(rows: list[int], *, rationales: Any, prov: dict[str, Any], template: Any, view: str,
                   generate: Generate, max_new_tokens: int) -> list[dict[str, Any]]:
    """Stage 2: for each row with a stage-1 record in ``rationales`` (a
    :class:`~rewardkit.parrot.pipeline_store.JsonlStore`), the teacher's prediction from the rationale's ``view``
    alone; kept iff it equals the label."""
    from .prompts import consistency_conv

    recs, ask = [], []
    for i in rows:
        src = rationales.get(i)
        base = {"row": i, "prompt": src["prompt"], "label": src["label"], "task": src["task"], "kept": False,
                "prediction": None, "answer": None, "dimension": src.get("dimension"), "status": "ok", **prov}
        if src["status"] == "ok":
            recs.append({**base, "reason": None})
            ask.append(len(recs) - 1)
        elif src["status"] == "judge_failure":
            recs.append({**base, "status": "judge_failure", "reason": "judge_failure",
                         "detail": f"stage 1: {src['reason']}"})
        elif src["status"] == "unparseable":
            recs.append({**base, "reason": "unparseable_rationale", "detail": src["reason"]})
        else:
            recs.append({**base, "reason": "skipped", "detail": src["reason"]})
    for j in ask:  # what stage 2 is shown (recorded for audit): never the Preferred line
        recs[j]["evidence"] = consistency_view(rationales.get(recs[j]["row"])["rationale"], view)
    convs = [consistency_conv(template, recs[j]["prompt"], rationales.get(recs[j]["row"])["rationale"],
                              recs[j]["task"] == "edit", view) for j in ask]
    for j, ans in zip(ask, generate(convs, max_new_tokens) if convs else []):
        rec = recs[j]
        if isinstance(ans, Exception):
            rec.update(status="judge_failure", reason="judge_failure", detail=f"stage 2: {type(ans).__name__}: {ans}")
            continue
        rec["answer"] = ans
        pred = parse_prediction(ans)
        rec["prediction"] = pred
        if pred is None:
            rec.update(reason="unparseable_prediction", detail=f"answer {ans[:120]!r} is not A or B")
        elif pred != rec["label"]:
            rec.update(reason="wrong_prediction", detail=f"predicted {pred}, label {rec['label']}")
        else:
            rec.update(kept=True, reason="kept", detail=None)
    for rec in recs:
        rec.setdefault("detail", None)
        rec.setdefault("evidence", None)
    return recs


def project_records(rows: list[dict[str, Any]], *, rationales: Any, done: Callable[[tuple], bool],
                    prov: dict[str, Any], template: Any, generate: Generate,
                    max_new_tokens: int) -> list[dict[str, Any]]:
    """Stage 3: a pointwise critique of each image of each row (as for stage 1) not ``done((row, slot))`` yet,
    with the row's verified rationale as the hint."""
    from .prompts import project_conv

    recs, convs = [], []
    for r in rows:
        rat = rationales.get(r["row"])["rationale"]
        for slot in ("A", "B"):
            if done((r["row"], slot)):
                continue
            im = r["image_a"] if slot == "A" else r["image_b"]
            convs.append(project_conv(template, r["prompt"], im, slot, rat, r["sources"]))
            recs.append({"row": r["row"], "slot": slot, "prompt": r["prompt"],
                         "task": "edit" if r["sources"] else "t2i", "critique": None, "raw": None,
                         "scores": None, "mean": None, "reason": None, "dimension": None, **prov})
    for rec, ans in zip(recs, generate(convs, max_new_tokens) if convs else []):
        c = _parsed(rec, ans, parse_pointwise)
        if c is None:
            continue
        m = mean_score(c.scores)
        if math.isnan(m):
            rec.update(status="unparseable", reason="every dimension is N/A")
            continue
        if c.notes:  # the t2i image-faithfulness number was ignored: train on the corrected text? no: drop
            rec.update(status="unparseable", reason="; ".join(c.notes), dimension="image_faithfulness")
            continue
        rec.update(status="ok", critique=ans.strip(), scores=c.scores, mean=m)
    return recs
