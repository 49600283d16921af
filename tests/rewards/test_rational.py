"""RationalRewards: strict critique parsing by hand, the reward's arithmetic on the scripted teacher, and the
real path on a tiny Qwen judge (garbage -> NaN + reason, never a fallback value)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from rewardkit.parrot.format import (ParseError, mean_score, needs_refinement, parse_pairwise, parse_pointwise,
                                     parse_prediction, parse_score, to_unit)
from rewardkit.parrot.testing import ScriptedTeacher

GOOD = """Text Faithfulness: the cat is there.
Score: 3.5
Image Faithfulness: no source.
Score: N/A
**Physical and Visual Quality**: slight blur.
Score: **2**
Text Rendering: no text requested.
Score: n/a
Summary: blurry.
Refined Request: a sharp photo of a cat"""


def grey(v, size=32):
    return Image.fromarray(np.full((size, size, 3), v, dtype=np.uint8), "RGB")


def test_parse_score_strict():
    assert parse_score("3.5") == 3.5 and parse_score(" **4** ") == 4.0 and parse_score("3/4") == 3.0
    assert parse_score("N/A") is None and parse_score("n / a") is None and parse_score("1") == 1.0
    for bad in ("0.5", "4.5", "5", "3.5/5", "about 3", "3 or 4", "nan", "inf", "", "-1", "2,5", "three"):
        with pytest.raises(ParseError):
            parse_score(bad)
    with pytest.raises(ParseError):
        parse_score("N/A", allow_na=False)


def test_parse_pointwise_and_mean():
    c = parse_pointwise(GOOD)
    assert c.scores == {"text_faithfulness": 3.5, "image_faithfulness": None, "physical_quality": 2.0,
                        "text_rendering": None}
    assert c.refined_request == "a sharp photo of a cat" and c.summary == "blurry."
    assert mean_score(c.scores) == 2.75 and to_unit(2.75) == pytest.approx(0.5833333)
    assert math.isnan(mean_score({"a": None}))
    # t2i: a number for image faithfulness is ignored (and noted)
    c2 = parse_pointwise(GOOD.replace("Score: N/A", "Score: 4", 1), t2i=True)
    assert c2.scores["image_faithfulness"] is None and c2.notes
    # strictness: a missing section, two score lines, out of range, a duplicated header
    with pytest.raises(ParseError) as e:
        parse_pointwise(GOOD.replace("Text Rendering: no text requested.\nScore: n/a\n", ""))
    assert e.value.dimension == "text_rendering"
    with pytest.raises(ParseError, match="2 'Score:' lines"):
        parse_pointwise(GOOD.replace("Score: 3.5", "Score: 3.5\nScore: 2"))
    with pytest.raises(ParseError, match="outside"):
        parse_pointwise(GOOD.replace("Score: 3.5", "Score: 7"))
    with pytest.raises(ParseError, match="appears 2 times"):
        parse_pointwise(GOOD + "\nText Faithfulness: again\nScore: 3")
    with pytest.raises(ParseError):
        parse_pointwise("garbage garbage")


def test_parse_pairwise_and_prediction():
    t = ("Text Faithfulness: A follows it.\nScores: A = 4, B = 2.5\nImage Faithfulness: none.\nScores: A = N/A, B = N/A\n"
         "Physical and Visual Quality: same.\nScores: A=3, B=3\nText Rendering: n/a\nScores: N/A\n"
         "Summary: A wins.\nPreferred: Image A")
    r = parse_pairwise(t, t2i=True)
    assert r.preferred == "A" and r.scores["text_faithfulness"] == (4.0, 2.5)
    assert r.scores["text_rendering"] == (None, None)
    with pytest.raises(ParseError, match="no image faithfulness"):
        parse_pairwise(t.replace("A = N/A, B = N/A", "A = 3, B = 2"), t2i=True)
    with pytest.raises(ParseError, match="one image only"):
        parse_pairwise(t.replace("A = N/A, B = N/A", "A = 3, B = N/A"))
    with pytest.raises(ParseError, match="Preferred"):
        parse_pairwise(t.replace("Preferred: Image A", "Preferred: both"))
    assert parse_prediction("A") == "A" and parse_prediction("**B**.") == "B" and parse_prediction("Image B") == "B"
    assert parse_prediction("Preferred: A") == "A"
    for bad in ("a", "A or B", "Both images look fine.", "", "AB", "Tie"):
        assert parse_prediction(bad) is None


def test_needs_refinement_threshold():
    assert not needs_refinement({"a": 3.0, "b": None, "c": 3.01})
    assert needs_refinement({"a": 2.99, "b": None})
    assert not needs_refinement({"a": None, "b": None})
    assert needs_refinement({"a": float("nan")})  # NaN is never "good"
    assert not needs_refinement({"a": 2.5}, threshold=2.5)


def test_rational_scripted_arithmetic():
    from rewardkit.rewards.rational import RationalReward

    r = RationalReward(judge=ScriptedTeacher())
    bright, dark = grey(255), grey(0)  # q = 4 and 1
    out = r([bright, dark], "a cat")
    # t2i, no quote: text faithfulness = physical = q, the rest N/A -> mean q -> (q - 1) / 3
    assert out.scores.tolist() == [1.0, 0.0] and out.valid.all()
    assert out.dimensions["text_faithfulness"].tolist() == [4.0, 1.0]
    assert math.isnan(float(out.dimensions["image_faithfulness"][0]))
    assert out.details[0]["refined_request"].startswith("a cat")
    # edit: image faithfulness 3; a quoted text request adds text rendering 2: (4 + 3 + 4 + 2) / 4 = 3.25
    out = r([bright], 'a sign saying "hi"', sources=[[grey(10)]])
    assert out.scores.tolist() == [pytest.approx((3.25 - 1) / 3)]
    assert out.dimensions["text_rendering"].tolist() == [2.0]
    # native compare, both orders: the brighter wins in both -> 1 / 0
    p = r.compare([bright, dark], [dark, bright], "a cat")
    assert p.prob_a.tolist() == [1.0, 0.0]
    p = r.compare([bright], [dark], "add a hat", sources=[[grey(50)]])
    assert p.prob_a.tolist() == [1.0]


class _Fixed(ScriptedTeacher):
    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def generate(self, conversations, **kw):
        return [[self.answer] for _ in conversations]


def test_rational_unparseable_and_all_na():
    from rewardkit.rewards.rational import RationalReward

    out = RationalReward(judge=_Fixed(GOOD.replace("Score: 3.5", "Score: 3.5/5")))([grey(9)], "x")
    assert not out.valid[0] and math.isnan(float(out.scores[0])) and "unparseable critique" in out.errors[0]
    all_na = GOOD.replace("Score: 3.5", "Score: N/A").replace("Score: **2**", "Score: N/A")
    out = RationalReward(judge=_Fixed(all_na))([grey(9)], "x")
    assert not out.valid[0] and "N/A" in out.errors[0]
    p = RationalReward(judge=_Fixed("A is better"))([grey(1)], "x")
    assert not p.valid[0]
    p = RationalReward(judge=_Fixed("Preferred: A")).compare([grey(1)], [grey(2)], "x")
    assert not p.valid[0] and "unparseable pairwise" in p.errors[0]


def test_user_metadata_never_switches_rational_to_pairwise():
    """Bug: a metadata key ``__rational_pairwise__`` in the caller's metadata turned a pointwise call into the
    pairwise path (a crash, or a pairwise vote reported as a score). Only compare() asks pairwise."""
    from rewardkit.rewards.rational import RationalReward

    r = RationalReward(judge=ScriptedTeacher())
    meta = [{"__rational_pairwise__": True}, {"__rational_pairwise__": 1}]
    out = r([grey(255), grey(0)], "a cat", sources=[[grey(10)], [grey(10)]], metadata=meta)
    # pointwise edit scores (4 + 3 + 4) / 3 and (1 + 3 + 1) / 3 on the unit scale, not votes
    assert out.valid.all() and out.scores.tolist() == pytest.approx([(11 / 3 - 1) / 3, (5 / 3 - 1) / 3])
    assert out.details[0]["summary"] is not None
    p = r.compare([grey(255)], [grey(0)], "a cat", metadata=[{"__rational_pairwise__": False}])
    assert p.prob_a.tolist() == [1.0]      # compare stays pairwise whatever the metadata holds


@pytest.mark.parametrize("digit", ["\uff13", "\u0663", "\u0969"])  # fullwidth, Arabic-Indic, Devanagari three
def test_rational_scores_take_ascii_digits_only(digit):
    """One number rule for every judge parser (rewardkit.judges.base.DECIMAL): unifiedreward refused "３" but
    rational read it as 3 (Python's Unicode-aware \\d)."""
    from rewardkit.rewards.rational import RationalReward

    with pytest.raises(ParseError):
        parse_score(digit)
    with pytest.raises(ParseError):
        parse_score(f"2.{digit}")
    out = RationalReward(judge=_Fixed(GOOD.replace("Score: 3.5", f"Score: {digit}")))([grey(9)], "x")
    assert not out.valid[0] and "unparseable critique" in out.errors[0]
    pair = ("Text Faithfulness: A.\nScores: A = {}, B = 2\nImage Faithfulness: none.\nScores: N/A\n"
            "Physical and Visual Quality: same.\nScores: A = 3, B = 3\nText Rendering: n/a\nScores: N/A\n"
            "Summary: A.\nPreferred: A")
    assert parse_pairwise(pair.format("4"), t2i=True).scores["text_faithfulness"] == (4.0, 2.0)
    with pytest.raises(ParseError):
        parse_pairwise(pair.format(digit), t2i=True)


def test_rational_tiny_qwen_end_to_end(tiny_qwen2_5_vl_dir):
    import rewardkit

    r = rewardkit.load_reward("rational", model=str(tiny_qwen2_5_vl_dir), device="cpu", max_new_tokens=12)
    out = r([grey(30), grey(200)], "a cat", sources=None)
    assert not out.valid.any() and all("unparseable critique" in e for e in out.errors)
    assert out.rationales is not None and len(out.rationales) == 2
    p = r.compare([grey(30)], [grey(200)], "add a hat", sources=[[grey(90)]])
    assert not p.valid.any() and "unparseable" in p.errors[0]


def test_bench_rational_native_pairwise(tmp_path):
    """``rewardkit bench -r rational``: the harness goes through the native compare (pairwise mode) on t2i and
    edit benchmarks (synthetic files with the real schemas; the scripted critic prefers the brighter image)."""
    from rewardkit.bench.harness import evaluate
    from rewardkit.bench.synthetic import write_synthetic_benchmarks
    from rewardkit.rewards.rational import RationalReward

    write_synthetic_benchmarks(tmp_path / "data")
    res = evaluate(RationalReward(judge=ScriptedTeacher()), "mmrb2/t2i,genaibench/edit", data_dir=tmp_path / "data",
                   cache_dir=None, limit=6, n_boot=0, progress=False)
    assert res.reward["mode"] == "pairwise", res.reward["mode_reason"]
    d = res.to_dict()["benchmarks"]
    assert sorted(d) == ["genaibench/edit", "mmrb2/t2i"] and not any(b["skipped"] for b in d.values())
    assert d["mmrb2/t2i"]["metrics"]["accuracy_with_ties"]["n_invalid"] == 0


def test_t2i_note():
    # catches the note's text lost: it says which score was ignored and why
    c = parse_pointwise(GOOD.replace("Score: N/A", "Score: 4", 1), t2i=True)
    assert c.notes == ["image_faithfulness score 4 ignored: text-to-image request (N/A)"]


def test_pairwise_reasons_and_the_na_refusal_message():
    t = ("Text Faithfulness: A follows it.\nScores: A = 4, B = 2.5\nImage Faithfulness: none.\nScores: A = N/A, B = N/A\n"
         "Physical and Visual Quality: same.\nScores: A=3, B=3\nText Rendering: n/a\nScores: N/A\n"
         "Summary: A wins.\nPreferred: Image A")
    # catches the per-dimension reasoning dropped from the parse (each section without its Scores line)
    assert parse_pairwise(t).reasons == {"text_faithfulness": "A follows it.", "image_faithfulness": "none.",
                                         "physical_quality": "same.", "text_rendering": "n/a"}
    # catches the N/A refusal losing its message
    with pytest.raises(ParseError, match=r"^N/A is not allowed here$"):
        parse_score("N/A", allow_na=False)


def test_parse_errors_name_their_dimension_and_the_summary_is_read():
    t = ("Text Faithfulness: A follows it.\nScores: A = 4, B = 2.5\nImage Faithfulness: none.\nScores: A = N/A, B = N/A\n"
         "Physical and Visual Quality: same.\nScores: A=3, B=3\nText Rendering: n/a\nScores: N/A\n"
         "Summary: A wins.\nPreferred: Image A")
    # catches the summary looked up under another name
    assert parse_pairwise(t).summary == "A wins."
    # catches the N/A-for-one-image error losing its dimension
    with pytest.raises(ParseError, match="one image only") as info:
        parse_pairwise(t.replace("A=3, B=3", "A = 3, B = N/A"))
    assert info.value.dimension == "physical_quality"
    # catches the missing-section error losing its text
    with pytest.raises(ParseError, match=r"^no 'Text Rendering:' section$") as info:
        parse_pairwise(t.replace("Text Rendering: n/a\n", ""))
    assert info.value.dimension == "text_rendering"
    # catches `and` for `or` in the empty-answer check: blank text and a non-string are both "empty answer"
    for empty in ("  \n", None):
        with pytest.raises(ParseError, match=r"^empty answer$"):
            parse_pointwise(empty)
