"""``rewardkit.parrot.format``, PARROT's answer formats, function by function (no model): the score grammar and
its messages, the header pattern, sections and trailing fields, pointwise and pairwise parses with each error's
message and dimension, the prediction, stage 2's view, and the N/A-aware arithmetic. Expected values are written
by hand from the format in the module docstring. With ``tests/rewards/test_rational.py``, these are the tests
``scripts/mutation.sh parrot_format`` runs."""

from __future__ import annotations

import math

import pytest

from rewardkit.parrot import format as fmt
from rewardkit.parrot.format import (ParseError, consistency_view, mean_score, needs_refinement, parse_pairwise,
                                     parse_pointwise, parse_prediction, parse_score, to_unit)

POINT = ("Intro the parser ignores.\n"
         "## **Text Faithfulness** (1-4):\nthe cat is there\nbut small.\nScore: 3.5\n"
         "Image Faithfulness: no source.\n**Score**: N/A\n"
         "> Physical & Visual Quality : a little blur.\n- Score: **2**/4\n"
         "text   rendering: no text.\nSCORE: n/a\n"
         "Summary: blurry and small.\n"
         "Refined Request:   a sharp photo of a big cat  \n")

PAIR = ("Text Faithfulness: A follows it.\nScores: Image A: 4; Image B: 2.5\n"
        "Image Faithfulness: none.\nScores: A = N/A, B = N/A\n"
        "Physical Quality: same.\nScores: A=3, B=3\n"
        "Text Rendering: no text.\nScores: N/A\n"
        "Summary: A wins.\nPreferred: **Image A**.")


def err(fn, *args, **kw) -> ParseError:
    with pytest.raises(ParseError) as e:
        fn(*args, **kw)
    return e.value


def test_parse_error_is_a_value_error_with_a_dimension():
    e = ParseError("m")
    assert isinstance(e, ValueError) and str(e) == "m" and e.dimension is None
    assert ParseError("m", "text_rendering").dimension == "text_rendering"


def test_parse_score_grammar_bounds_and_messages():
    for text, want in (("1", 1.0), ("4", 4.0), ("4.0", 4.0), ("1.00", 1.0), ("3.5 / 4", 3.5), ("**3**/4.0", 3.0),
                       ("2/4.", 2.0), (" 2.25 ", 2.25), ("**3.5** .", 3.5)):
        got = parse_score(text)
        assert got == want and type(got) is float, text
    for text in ("N/A", "n/a", "N / A", "NA", "na", "**N/A**"):
        assert parse_score(text) is None, text
    assert parse_score("2", allow_na=False) == 2.0
    assert str(err(parse_score, "N/A", allow_na=False)) == "N/A is not allowed here"
    assert str(err(parse_score, ".5")) == "score 0.5 is outside [1, 4]"
    assert str(err(parse_score, "4.01")) == "score 4.01 is outside [1, 4]"
    assert str(err(parse_score, "0.99")) == "score 0.99 is outside [1, 4]"
    assert str(err(parse_score, "9")) == "score 9 is outside [1, 4]"
    long = "  about three, maybe four, it depends on what you ask  "
    assert str(err(parse_score, long)) == "score 'about three, maybe four, it depends on w' is not a number in [1, 4] or N/A"
    for bad in ("3/5", "1e0", "+3", "3,5", "３", "N/A/4x"):
        assert "is not a number in [1, 4] or N/A" in str(err(parse_score, bad)), bad


def test_header_pattern_by_hand():
    pat = fmt._header_re(("Foo Bar", "Baz"))
    for line in ("Foo Bar:", "foo   bar:", "## **Foo Bar** (1-4):", "> - Foo Bar :", "  Baz:", "**Baz**:",
                 "FOO\tBAR (why):"):
        assert pat.search("intro\n" + line + " text"), line
    for line in ("see Foo Bar:", "Foo Bars:", "FooBar:", "Foo Bar", "Baz (x) y:", "Foo.Bar:", "Qux:"):
        assert not pat.search("intro\n" + line + " text"), line
    assert [m.start() for m in pat.finditer("Baz: 1\nFoo Bar: 2\n")] == [0, 7]
    assert fmt._header_re(("A.B",)).search("a.b:") and not fmt._header_re(("A.B",)).search("aXb:")


def test_pointwise_parse_reads_sections_fields_and_reasons():
    c = parse_pointwise(POINT)
    assert c.scores == {"text_faithfulness": 3.5, "image_faithfulness": None, "physical_quality": 2.0,
                        "text_rendering": None}
    assert c.reasons == {"text_faithfulness": "the cat is there\nbut small.", "image_faithfulness": "no source.",
                         "physical_quality": "a little blur.", "text_rendering": "no text."}
    assert c.summary == "blurry and small." and c.refined_request == "a sharp photo of a big cat" and c.notes == []
    assert c.applicable() == {"text_faithfulness": 3.5, "physical_quality": 2.0}
    # sections in another order, bounded by the next header whatever it is
    shuffled = ("Text Rendering: none.\nScore: 1\nPhysical and Visual Quality: ok.\nScore: 4\n"
                "Image Faithfulness: kept.\nScore: 3\nText Faithfulness: yes.\nScore: 2")
    c = parse_pointwise(shuffled)
    assert c.scores == {"text_faithfulness": 2.0, "image_faithfulness": 3.0, "physical_quality": 4.0,
                        "text_rendering": 1.0}
    assert c.reasons["physical_quality"] == "ok." and c.summary is None and c.refined_request is None
    # an empty refined request is none; the last of two summaries counts, to the next trailing field
    c = parse_pointwise(shuffled + "\nsummary: first\nSUMMARY: second\nline two\nRefined  Request:  \n")
    assert c.summary == "second\nline two" and c.refined_request is None
    # t2i: a number for image faithfulness becomes N/A with a note; an N/A there needs no note
    c = parse_pointwise(shuffled, t2i=True)
    assert c.scores["image_faithfulness"] is None and c.scores["text_faithfulness"] == 2.0
    assert c.notes == ["image_faithfulness score 3 ignored: text-to-image request (N/A)"]
    assert parse_pointwise(POINT, t2i=True).notes == []


def test_pointwise_errors_name_their_dimension():
    for empty in ("", " \n\t", None, 3):
        e = err(parse_pointwise, empty)
        assert str(e) == "empty answer" and e.dimension is None
    e = err(parse_pointwise, POINT.replace("Image Faithfulness:", "Image Fidelity:"))
    assert (str(e), e.dimension) == ("no 'Image Faithfulness:' section", "image_faithfulness")
    e = err(parse_pointwise, POINT + "Visual Quality: again.\nScore: 3\n")
    assert (str(e), e.dimension) == ("'Physical and Visual Quality' appears 2 times", "physical_quality")
    e = err(parse_pointwise, POINT.replace("Score: 3.5", "Score: 3.5\nScore: 3"))
    assert (str(e), e.dimension) == ("Text Faithfulness: 2 'Score:' lines (need exactly 1)", "text_faithfulness")
    e = err(parse_pointwise, POINT.replace("SCORE: n/a", "Scores: n/a"))
    assert (str(e), e.dimension) == ("Text Rendering: 0 'Score:' lines (need exactly 1)", "text_rendering")
    e = err(parse_pointwise, POINT.replace("**2**/4", "7"))
    assert (str(e), e.dimension) == ("Physical and Visual Quality: score 7 is outside [1, 4]", "physical_quality")


def test_pairwise_parse_forms_and_errors():
    r = parse_pairwise(PAIR)
    assert r.preferred == "A" and r.summary == "A wins."
    assert r.scores == {"text_faithfulness": (4.0, 2.5), "image_faithfulness": (None, None),
                        "physical_quality": (3.0, 3.0), "text_rendering": (None, None)}
    assert r.reasons == {"text_faithfulness": "A follows it.", "image_faithfulness": "none.",
                         "physical_quality": "same.", "text_rendering": "no text."}
    assert parse_pairwise(PAIR.replace("**Image A**.", "B"), t2i=True).preferred == "B"
    # an edit pair may score image faithfulness; a text-to-image pair may not
    numbered = PAIR.replace("A = N/A, B = N/A", "A = 2, B = 1")
    assert parse_pairwise(numbered).scores["image_faithfulness"] == (2.0, 1.0)
    e = err(parse_pairwise, numbered, t2i=True)
    assert (str(e), e.dimension) == ("Image Faithfulness: a text-to-image pair has no image faithfulness (N/A)",
                                     "image_faithfulness")
    for one in ("A = N/A, B = 2", "A = 2, B = N/A"):
        e = err(parse_pairwise, PAIR.replace("A=3, B=3", one))
        assert (str(e), e.dimension) == ("Physical and Visual Quality: N/A for one image only", "physical_quality")
    for rest in ("3", "garbage"):
        e = err(parse_pairwise, PAIR.replace("A=3, B=3", rest))
        assert (str(e), e.dimension) == (f"Physical and Visual Quality: scores {rest!r} are not 'A = x, B = y' "
                                         "(1-4 or N/A)", "physical_quality")
    e = err(parse_pairwise, PAIR.replace("A=3, B=3", "A = 3, B = 5"))
    assert (str(e), e.dimension) == ("Physical and Visual Quality: score 5 is outside [1, 4]", "physical_quality")
    e = err(parse_pairwise, PAIR.replace("Scores: N/A", "Scores: N/A\nScores: N/A"))
    assert (str(e), e.dimension) == ("Text Rendering: 2 'Scores:' lines (need exactly 1)", "text_rendering")
    e = err(parse_pairwise, PAIR.replace("Preferred: **Image A**.", ""))
    assert (str(e), e.dimension) == ("no 'Preferred:' line", None)
    verdict = "Neither, both are equally good in every way that matters"
    e = err(parse_pairwise, PAIR.replace("**Image A**.", verdict))
    assert str(e) == f"'Preferred: {verdict[:40]}' is not A or B" and e.dimension is None


def test_parse_prediction():
    for text, want in (("A", "A"), ("B", "B"), (" **B**. ", "B"), ("Image A", "A"), ("image **B**", "B"),
                       ("Preferred: B", "B"), ("PREFERRED:A.", "A"), ("**Image B**", "B")):
        assert parse_prediction(text) == want, text
    for text in ("a", "b", "Preferred: b", "image a", "A or B", "AB", "C", "", "Tie", None, 1):
        assert parse_prediction(text) is None, text


STAGE1 = ("Both are fine, but.\n"
          "Text Faithfulness: A has the dog; B does not.\nB is worse.\nScores: A = 3.5, B = 1\n"
          "Image Faithfulness:\nScores: A = 2, B = 4.0\n"
          "Physical and Visual Quality: equal.\nScores: N/A\n"
          "Text Rendering: none.\nScores: A = N/A, B = N/A\n"
          "Summary:  A, clearly.  \n"
          "Preferred: A\nthe label was A\n")


def test_consistency_view_by_hand():
    full = ("Text Faithfulness: A has the dog; B does not.\nB is worse.\nScores: A = 3.5, B = 1\n"
            "Image Faithfulness:\nScores: A = 2, B = 4\n"
            "Physical and Visual Quality: equal.\nScores: A = N/A, B = N/A\n"
            "Text Rendering: none.\nScores: A = N/A, B = N/A\n"
            "Summary: A, clearly.")
    assert consistency_view(STAGE1) == full and consistency_view(STAGE1, "full") == full
    assert consistency_view(STAGE1, "evidence_only") == (
        "Text Faithfulness: A has the dog; B does not.\nB is worse.\nImage Faithfulness:\n"
        "Physical and Visual Quality: equal.\nText Rendering: none.")
    assert consistency_view(STAGE1.replace("Summary:  A, clearly.  \n", "Summary:   \n")) == full.rsplit("\nSummary", 1)[0]
    assert consistency_view(STAGE1.replace("Summary:  A, clearly.  \n", "")) == full.rsplit("\nSummary", 1)[0]
    with pytest.raises(ValueError) as e:
        consistency_view(STAGE1, "blind")
    assert str(e.value) == "consistency view must be one of ('full', 'evidence_only'), got 'blind'"
    assert err(consistency_view, "no sections").dimension == "text_faithfulness"


def test_mean_to_unit_and_refinement_rule():
    assert mean_score({"a": 1.0, "b": None, "c": 4.0, "d": 2.5}) == 2.5
    assert math.isnan(mean_score({})) and math.isnan(mean_score({"a": None}))
    assert to_unit(1.0) == 0.0 and to_unit(4.0) == 1.0 and to_unit(2.5) == 0.5 and math.isnan(to_unit(math.nan))
    assert fmt.SCORE_MIN == 1.0 and fmt.SCORE_MAX == 4.0
    assert not needs_refinement({"a": 3.0, "b": None}) and needs_refinement({"a": 2.99})
    assert needs_refinement({"a": None, "b": 1.0, "c": 4.0})  # N/A skipped, the next one still counts
    assert needs_refinement({"a": 4.0, "b": math.nan})
    assert not needs_refinement({"a": 2.0}, threshold=2.0) and needs_refinement({"a": 2.0}, threshold=2.5)
    assert not needs_refinement({})
