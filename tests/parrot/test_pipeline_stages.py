"""PARROT's stage records (rewardkit/parrot/pipeline_stages.py) on hand-written answers, without a teacher or a
store, and the pipeline's public names still importable from rewardkit.parrot.pipeline after its split into
pipeline_{config,store,provenance,stages,report}.py. Expected records are written out by hand from the module
docstring of rewardkit/parrot/pipeline.py (status / reason rules)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from rewardkit.judges import load_template
from rewardkit.parrot.pipeline_stages import filter_records, project_records, rationale_records

PAIRWISE = ("Text Faithfulness: A follows it.\nScores: A = 4, B = 2.5\nImage Faithfulness: none.\n"
            "Scores: A = N/A, B = N/A\nPhysical and Visual Quality: same.\nScores: A=3, B=3\n"
            "Text Rendering: n/a\nScores: N/A\nSummary: A wins.\nPreferred: Image A")
POINTWISE = ("Text Faithfulness: the cat is there.\nScore: 3.5\nImage Faithfulness: no source.\nScore: N/A\n"
             "Physical and Visual Quality: slight blur.\nScore: 2\nText Rendering: none asked.\nScore: N/A\n"
             "Summary: blurry.")
PROV = {"template": "parrot/default@x", "seed": 0}


def _img():
    return Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8), "RGB")


def _row(i, *, prompt="a cat", label="A", sources=()):
    return {"row": i, "prompt": prompt, "label": label, "image_a": _img(), "image_b": _img(), "sources": list(sources)}


class Answers:
    """``generate`` that answers from a list in order and records what it was asked."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, convs, max_new_tokens):
        self.calls.append((len(convs), max_new_tokens))
        return [self.answers.pop(0) for _ in convs]


class Store(dict):
    """The one method of JsonlStore the stages read (``get``)."""


@pytest.fixture(scope="module")
def template():
    return load_template("parrot", "default")


def test_stage1_skips_asks_and_records_each_answer(template):
    rows = [_row(0, label="tie"), _row(1, prompt=None), _row(2, sources=[_img(), _img()]), _row(3), _row(4), _row(5)]
    gen = Answers(RuntimeError("server down"), "no sections at all", "  " + PAIRWISE + "\n")
    recs = rationale_records(rows, prov=PROV, template=template, generate=gen, max_new_tokens=77)
    assert gen.calls == [(3, 77)]  # one batch, only the three answerable rows
    assert [r["row"] for r in recs] == [0, 1, 2, 3, 4, 5]
    assert [r["status"] for r in recs] == ["skipped", "skipped", "skipped", "judge_failure", "unparseable", "ok"]
    assert recs[0]["reason"] == "tie label: nothing to rationalize"
    assert recs[1]["reason"] == "no text-to-image prompt (got None): nothing to judge the images against"
    assert recs[2]["reason"] == "multi-reference edit: PARROT takes one source" and recs[2]["task"] == "edit"
    assert recs[3]["reason"] == "RuntimeError: server down" and recs[3]["raw"] is None
    assert recs[4]["raw"] == "no sections at all" and recs[4]["reason"] and recs[4]["rationale"] is None
    assert recs[5]["rationale"] == PAIRWISE and recs[5]["rationale_preferred"] == "A" and recs[5]["reason"] is None
    assert all(r["template"] == "parrot/default@x" and r["seed"] == 0 for r in recs)


def test_stage2_predicts_from_the_rationale_and_keeps_iff_the_label(template):
    ok = {"prompt": "a cat", "task": "t2i", "status": "ok", "rationale": PAIRWISE}
    rationales = Store({0: {**ok, "label": "A"}, 1: {**ok, "label": "B"}, 2: {**ok, "label": "A"},
                        3: {**ok, "label": "A"},
                        4: {"prompt": "a cat", "label": "A", "task": "t2i", "status": "judge_failure", "reason": "x"},
                        5: {"prompt": "a cat", "label": "A", "task": "t2i", "status": "unparseable", "reason": "y",
                            "dimension": "text_rendering"}})
    gen = Answers("A", "A", "Both look fine.", OSError("reset"))
    recs = filter_records(list(range(6)), rationales=rationales, prov=PROV, template=template, view="full",
                          generate=gen, max_new_tokens=8)
    assert gen.calls == [(4, 8)]
    assert [(r["kept"], r["reason"]) for r in recs] == [
        (True, "kept"), (False, "wrong_prediction"), (False, "unparseable_prediction"), (False, "judge_failure"),
        (False, "judge_failure"), (False, "unparseable_rationale")]
    assert recs[1]["detail"] == "predicted A, label B"
    assert recs[3]["detail"] == "stage 2: OSError: reset" and recs[3]["status"] == "judge_failure"
    assert recs[4]["detail"] == "stage 1: x" and recs[4]["evidence"] is None
    assert recs[5]["detail"] == "y" and recs[5]["dimension"] == "text_rendering"
    assert "Preferred" not in recs[0]["evidence"] and "A follows it." in recs[0]["evidence"]


def test_stage3_critiques_each_image_not_done(template):
    rationales = Store({0: {"rationale": PAIRWISE}, 1: {"rationale": PAIRWISE}})
    gen = Answers(POINTWISE, "Summary: nothing else", POINTWISE.replace("Score: 3.5", "Score: N/A")
                  .replace("Score: 2", "Score: N/A"))
    recs = project_records([_row(0), _row(1)], rationales=rationales, done=lambda k: k == (0, "B"), prov=PROV,
                           template=template, generate=gen, max_new_tokens=64)
    assert gen.calls == [(3, 64)]
    assert [(r["row"], r["slot"], r["status"]) for r in recs] == [
        (0, "A", "ok"), (1, "A", "unparseable"), (1, "B", "unparseable")]
    # mean of the applicable scores: (3.5 + 2) / 2 = 2.75 (image faithfulness and text rendering N/A)
    assert recs[0]["mean"] == 2.75 and recs[0]["critique"] == POINTWISE
    assert recs[2]["reason"] == "every dimension is N/A"


def test_the_pipelines_public_names_import_as_before():
    import rewardkit.parrot.pipeline as pipeline
    from rewardkit.parrot import pipeline_config, pipeline_report, pipeline_store

    assert set(pipeline.__all__) == {"ParrotConfig", "DataCfg", "TeacherCfg", "SFTCfg", "JsonlStore", "Pipeline",
                                     "load_teacher", "filter_report", "REASONS"}
    for mod in (pipeline_config, pipeline_report, pipeline_store):
        for name in mod.__all__:
            assert getattr(pipeline, name) is getattr(mod, name)
    assert pipeline.REASONS == ("kept", "wrong_prediction", "unparseable_prediction", "unparseable_rationale",
                                "judge_failure", "skipped")
