"""Judge-backed rewards never read "no usable probability" as "No", never cache it, and share one judge-failure
policy (``on_judge_error``: auto / nan / raise). Logic on a scripted backend (no model, no server)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image

from rewardkit import load_reward
from rewardkit.judges.base import JudgeBackend
from rewardkit.judges.openai_backend import JudgeServerError

NAN = float("nan")
IMG = Image.new("RGB", (16, 16), (200, 30, 30))


class Scripted(JudgeBackend):
    """P(yes) by keyword in the last text: "UNANSWERED" -> NaN row (labels absent / NaN / -inf log-probs),
    "OFFSCALE" -> a row outside [0, 1], "UNNORMED" -> a row not summing to 1, "NOPE" -> 0.1, else 0.9.
    ``fail_on``: a keyword whose presence anywhere in a choice_probs call raises (a server down after retries)."""

    kind = "scripted"

    def __init__(self, fail_on=None, generations=None):
        self.fail_on = fail_on
        self.calls = 0
        self.asked: list[str] = []
        self.generations = generations or {}

    def choice_probs(self, conversations, choices):
        self.calls += 1
        rows = []
        for conv in conversations:
            text = " ".join(c["text"] for c in conv[-1]["content"] if c.get("type") == "text")
            self.asked.append(text)
            if self.fail_on and self.fail_on in text:
                raise JudgeServerError("http://127.0.0.1:1/v1 failed after 5 attempts; last error: HTTP 503")
            if "UNANSWERED" in text:
                rows.append([NAN, NAN])
            elif "OFFSCALE" in text:
                rows.append([1.5, -0.5])
            elif "UNNORMED" in text:
                rows.append([0.2, 0.2])
            elif "NOPE" in text:
                rows.append([0.1, 0.9])
            else:
                rows.append([0.9, 0.1])
        return torch.tensor(rows)

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        if self.fail_on == "generate":
            raise JudgeServerError("http://127.0.0.1:1/v1 failed after 5 attempts; last error: HTTP 503")
        out = []
        for conv in conversations:
            text = conv[-1]["content"][-1]["text"]
            key = next((k for k in self.generations if k in text), None)
            out.append([self.generations.get(key, "Reason: looks right.\nScore: 4")] * n)
        return out


def tree(*questions):
    return [{"id": i + 1, "question": q, "parents": p} for i, (q, p) in enumerate(questions)]


# ------------------------------------------------------------------------------- item 1: rubric trees
@pytest.mark.parametrize("kind", ["faithfulness", "constraints"])
@pytest.mark.parametrize("marker", ["UNANSWERED", "OFFSCALE", "UNNORMED"])
def test_rubric_unanswered_question_is_nan_with_reason(kind, marker):
    judge = Scripted()
    key = "questions" if kind == "faithfulness" else "constraint_questions"
    t_bad = tree(("Is there a cat?", []), (f"Is the cat {marker} black?", [1]), ("Is it sunny?", [2]))
    t_ok = tree(("Is there a cat?", []), ("Is the cat NOPE black?", [1]), ("Is it sunny?", []))
    meta = [{key: t_bad, "intent": "strict"}, {key: t_ok, "intent": "strict"}]
    r = load_reward(kind, judge=judge)
    out = r([IMG, IMG], "a cat", metadata=meta)
    # before the fix: question 2 read as "No", score 1/3, valid, no reason
    assert math.isnan(out.scores[0]) and not out.valid[0]
    assert "question(s) 2 ('Is the cat " in out.errors[0] and marker in out.errors[0]
    assert out.details[0]["unanswered"] == ["2"] and out.details[0]["p_yes"]["2"] is None
    # its child (3) was not asked: only 1, 2 of sample 0 and 1, 2, 3 of sample 1
    assert sum("sunny" in a for a in judge.asked) == 1
    assert out.scores[1] == pytest.approx(2 / 3) and out.valid[1]        # the rest of the batch is kept


def test_rubric_soft_scoring_unanswered_is_nan():
    out = load_reward("faithfulness", judge=Scripted(), scoring="soft")(
        [IMG], "x", metadata=[{"questions": tree(("UNANSWERED?", []), ("ok?", []))}])
    assert math.isnan(out.scores[0]) and "UNANSWERED" in out.errors[0]


# ------------------------------------------------------------------------------- item 1: detectors
def _det_template(tmp_path, applies_q="Does the prompt ask for text?"):
    p = tmp_path / "det.yaml"
    p.write_text(
        'version: "t"\nanswer_system: "inspect"\nanswer_prompt: "{question} Yes or No."\n'
        'applies_system: "read"\napplies_prompt: "Prompt: {prompt}. {question}"\nchoices: ["Yes", "No"]\n'
        "detectors:\n"
        "  a: {kind: pointwise, question: 'Is there Q_A?', applies_question: 'x', enabled_when: any}\n"
        f"  b: {{kind: pointwise, question: 'Is there Q_B?', applies_question: '{applies_q}', enabled_when: 'No'}}\n"
        "  r: {kind: reference, question: '{reference} vs {candidate} Q_R?', applies_question: 'x', enabled_when: any}\n")
    return str(p)


def test_detector_unanswered_applicability_is_not_cached(tmp_path):
    cache = tmp_path / "det.jsonl"
    judge = Scripted()
    det = load_reward("detectors", judge=judge, template=_det_template(tmp_path), detectors=["b"],
                      applicability_cache=str(cache))
    out = det([IMG], "a UNANSWERED prompt")   # the applies question carries the prompt: no usable probability
    # before the fix: read as "No" -> enabled (when=No) ... and cached as applies: false forever
    assert math.isnan(out.scores[0]) and "whether it applies" in out.errors[0]
    assert not cache.exists() or all("b" not in json.loads(line).get("applies", {})
                                     for line in cache.read_text().splitlines())
    assert det.enabled_for(["a UNANSWERED prompt"]) == [{"b": None}]
    # a later answer is cached
    out = det([IMG], "a NOPE prompt")
    assert out.scores[0] == 1.0 and json.loads(cache.read_text().splitlines()[-1])["applies"] == {"b": False}


def test_detector_cache_with_non_boolean_entries_is_asked_again(tmp_path):
    cache = tmp_path / "det.jsonl"
    cache.write_text(json.dumps({"prompt": "a NOPE prompt", "applies": {"b": None}}) + "\n")
    judge = Scripted()
    det = load_reward("detectors", judge=judge, template=_det_template(tmp_path), detectors=["b"],
                      applicability_cache=str(cache))
    assert det([IMG], "a NOPE prompt").scores[0] == 1.0 and judge.calls == 2   # asked again, then scored


def test_detector_cache_entries_count_only_for_their_template_and_judge(tmp_path):
    """Bug: the applicability cache stored the template id but never checked it: answers given under another
    template version (other applies questions) or by another judge were reused."""
    cache = tmp_path / "det.jsonl"
    judge = Scripted()
    det = load_reward("detectors", judge=judge, template=_det_template(tmp_path), detectors=["b"],
                      applicability_cache=str(cache))
    assert det([IMG], "a NOPE prompt").scores[0] == 1.0 and judge.calls == 2     # asked, cached, scored
    rec = json.loads(cache.read_text().splitlines()[-1])
    assert rec["template"] == det.template.id and rec["judge"] and rec["applies"] == {"b": False}
    again = Scripted()
    load_reward("detectors", judge=again, template=_det_template(tmp_path), detectors=["b"],
                applicability_cache=str(cache))([IMG], "a NOPE prompt")
    assert again.calls == 1                                   # same template and judge: the cached answer is used
    # another template version (its applies question now mentions the prompt as unanswerable): asked again
    (tmp_path / "v2").mkdir()
    v2 = _det_template(tmp_path / "v2", applies_q="Is it UNANSWERED?")
    Path(v2).write_text(Path(v2).read_text().replace('version: "t"', 'version: "t2"'))
    other = Scripted()
    out = load_reward("detectors", judge=other, template=v2, detectors=["b"], applicability_cache=str(cache))(
        [IMG], "a NOPE prompt")
    # the v2 applies question was asked (and is unanswered): NaN; before, the v1 answer was reused: score 1.0
    assert any("UNANSWERED" in a for a in other.asked) and math.isnan(out.scores[0])
    # another judge (same template): asked again
    class OtherJudge(Scripted):
        def describe(self):
            return {"kind": "scripted", "model": "another"}

    j2 = OtherJudge()
    load_reward("detectors", judge=j2, template=_det_template(tmp_path), detectors=["b"],
                applicability_cache=str(cache))([IMG], "a NOPE prompt")
    assert j2.calls == 2


def test_detector_unanswered_verdicts(tmp_path):
    tpl = _det_template(tmp_path)
    ref = Image.new("RGB", (16, 16), (0, 0, 200))

    class J(Scripted):
        def __init__(self, rows):
            super().__init__()
            self.rows = rows

        def choice_probs(self, conversations, choices):
            out = []
            for conv in conversations:
                text = " ".join(c["text"] for c in conv[-1]["content"] if c.get("type") == "text")
                n_img = sum(c.get("type") == "image" for c in conv[-1]["content"])
                key = "Q_A" if "Q_A" in text else ("Q_R%d" % (0 if text.startswith("The first") else 1))
                out.append(self.rows.get(key, [0.1, 0.9]))
                assert n_img in (1, 2)
            return torch.tensor(out)

    def run(rows, names):
        det = load_reward("detectors", judge=J(rows), template=tpl, detectors=names, applicability="always")
        return det([IMG], "p", metadata=[{"reference_image": ref}])

    out = run({"Q_A": [NAN, NAN]}, ["a"])                      # before the fix: "not fired", 0.0, valid
    assert math.isnan(out.scores[0]) and "Q_A" in out.errors[0] and math.isnan(out.dimensions["a"][0])
    out = run({"Q_A": [NAN, NAN], "Q_R0": [0.9, 0.1], "Q_R1": [0.9, 0.1]}, ["a", "r"])
    assert out.scores[0] == 1.0 and out.valid[0] and out.dimensions["r"][0] == 1.0   # fired: known anyway
    assert math.isnan(out.dimensions["a"][0]) and out.details[0]["unanswered"]
    out = run({"Q_R0": [0.1, 0.9], "Q_R1": [NAN, NAN]}, ["r"])    # one order says no: known not fired
    assert out.scores[0] == 0.0 and out.dimensions["r"][0] == 0.0
    out = run({"Q_R0": [0.9, 0.1], "Q_R1": [NAN, NAN]}, ["r"])    # yes + unanswered: unknown
    assert math.isnan(out.scores[0]) and "r (" in out.errors[0]


# ------------------------------------------------------------------------------- item 2: one policy
REWARDS = {
    "faithfulness": lambda j, **kw: load_reward("faithfulness", judge=j, **kw),
    "constraints": lambda j, **kw: load_reward("constraints", judge=j, **kw),
    "detectors": lambda j, **kw: load_reward("detectors", judge=j, applicability="always",
                                             detectors=["garbled_text"], **kw),
}
META = [{"questions": tree(("Is there a POISON cat?", [])), "constraint_questions": tree(("Is it POISON?", [])),
         "intent": "strict"},
        {"questions": tree(("Is there a cat?", [])), "constraint_questions": tree(("Is it clean?", [])),
         "intent": "strict"}]


class PoisonImage(Scripted):
    """Fails any call that holds the first sample (a detector question has no per-sample text: by image)."""

    def choice_probs(self, conversations, choices):
        for conv in conversations:
            ims = [c["image"] for c in conv[-1]["content"] if c.get("type") == "image"]
            if any(im.getpixel((0, 0)) == (1, 2, 3) for im in ims) or any(
                    "POISON" in c.get("text", "") for c in conv[-1]["content"] if c.get("type") == "text"):
                raise JudgeServerError("http://127.0.0.1:1/v1 failed after 5 attempts; last error: HTTP 503")
        return super().choice_probs(conversations, choices)


POISON = Image.new("RGB", (16, 16), (1, 2, 3))


@pytest.mark.parametrize("kind", sorted(REWARDS))
def test_judge_failure_policy_rubric_rewards(kind):
    r = REWARDS[kind](PoisonImage())
    # on_error="nan": no raise; the failing chunk is NaN + the error, the other chunk kept
    out = r([POISON, IMG], "a cat", metadata=META, batch_size=1, on_error="nan")
    assert math.isnan(out.scores[0]) and "judge call failed: JudgeServerError" in out.errors[0]
    assert out.valid[1] and math.isfinite(out.scores[1])
    with pytest.raises(JudgeServerError):                          # on_error="raise" (default): raises
        r([POISON, IMG], "a cat", metadata=META, batch_size=1)
    forced = REWARDS[kind](PoisonImage(), on_judge_error="nan")   # always NaN
    assert not forced([POISON], "a cat", metadata=META[:1]).valid[0]
    strict = REWARDS[kind](PoisonImage(), on_judge_error="raise")  # always raise
    with pytest.raises(JudgeServerError):
        strict([POISON], "a cat", metadata=META[:1], on_error="nan")
    with pytest.raises(ValueError, match="on_judge_error"):
        REWARDS[kind](PoisonImage(), on_judge_error="ignore")


def test_judge_failure_while_generating_missing_questions(tmp_path):
    class Counting(Scripted):
        n_generate = 0

        def generate(self, *a, **k):
            Counting.n_generate += 1
            return super().generate(*a, **k)

    r = load_reward("faithfulness", judge=Counting(fail_on="generate"), generate_missing=True)
    out = r([IMG, IMG, IMG], ["a cat", "a dog", "a cow"], on_error="nan",
            metadata=[None, None, {"questions": tree(("Is there a cow?", []))}])
    assert not out.valid[:2].any() and all("judge call failed" in e for e in out.errors[:2])
    assert Counting.n_generate == 1          # a down judge is not waited for once per sample
    assert out.valid[2] and out.scores[2] == 1.0
    with pytest.raises(JudgeServerError):
        r([IMG], "a cat")


def test_config_and_not_implemented_errors_always_raise():
    from rewardkit.judges import ChoiceError

    class Bad(Scripted):
        def choice_probs(self, conversations, choices):
            raise ChoiceError("'Yes' is two tokens")

    r = load_reward("faithfulness", judge=Bad())
    with pytest.raises(ChoiceError):
        r([IMG], "x", metadata=[{"questions": tree(("a?", []))}], on_error="nan")

    class Wrong(Scripted):
        def choice_probs(self, conversations, choices):
            return torch.full((len(conversations) + 1, 2), 0.5)   # wrong shape: a judge failure

    out = load_reward("faithfulness", judge=Wrong())([IMG], "x", metadata=[{"questions": tree(("a?", []))}],
                                                      on_error="nan")
    assert not out.valid[0] and "shape" in out.errors[0]


def test_evr_policy_follows_on_error_and_keeps_old_values():
    class Down(Scripted):
        def generate(self, *a, **k):
            raise JudgeServerError("http://127.0.0.1:1/v1 failed after 5 attempts; last error: HTTP 503")

    kw = dict(k=1, dimensions=("IC",), max_retries=0)
    evr = load_reward("evr", judge=Down(), **kw)
    out = evr([IMG], "edit", sources=[[IMG]], on_error="nan")     # before: raised despite on_error="nan"
    assert not out.valid[0] and "judge call failed: JudgeServerError" in out.errors[0]
    with pytest.raises(JudgeServerError):
        evr([IMG], "edit", sources=[[IMG]])
    assert not load_reward("evr", judge=Down(), on_judge_error="nan", **kw)([IMG], "edit", sources=[[IMG]]).valid[0]
    with pytest.raises(JudgeServerError):
        load_reward("evr", judge=Down(), on_judge_error="raise", **kw)([IMG], "edit", sources=[[IMG]], on_error="nan")
    ok = load_reward("evr", judge=Scripted(), **kw)([IMG], "edit", sources=[[IMG]])
    assert ok.valid[0] and ok.scores[0] == pytest.approx((4 / (1 + 1e-6) - 1) / 4, rel=1e-5)


def test_evr_pairwise_unanswered_has_reason():
    class J(Scripted):
        def choice_probs(self, conversations, choices):
            return torch.full((len(conversations), len(choices)), NAN)

    out = load_reward("evr", judge=J(), k=1, dimensions=("IC",)).compare([IMG], [IMG], "edit", sources=[[IMG]],
                                                                         on_error="nan")
    assert not out.valid[0] and "no usable probability" in out.errors[0]


def test_composite_forwards_policy_and_follows_its_own_on_error():
    from rewardkit.compose.composite import Composite

    cfg = {"axes": [{"name": "faith", "reward": "faithfulness"}], "normalize": "none"}
    comp = Composite(cfg, judge=PoisonImage())
    assert comp.rewards["faith"].config.on_judge_error == "auto"
    out = comp([POISON, IMG], "a cat", metadata=META, batch_size=1, on_error="nan")
    assert math.isnan(out.scores[0]) and out.errors[0].startswith("judge call failed (axis 'faith'): ")
    assert out.scores[1] == 1.0 and out.valid[1]
    with pytest.raises(JudgeServerError):                # the outermost call's on_error decides
        comp([POISON, IMG], "a cat", metadata=META, batch_size=1)
    forced = Composite({**cfg, "on_judge_error": "nan"}, judge=PoisonImage())
    assert forced.rewards["faith"].config.on_judge_error == "nan"
    assert not forced([POISON], "a cat", metadata=META[:1]).valid[0]
    kept = Composite({"axes": [{"name": "faith", "reward": "faithfulness", "options": {"on_judge_error": "raise"}}],
                      "normalize": "none", "on_judge_error": "nan"}, judge=PoisonImage())
    assert kept.rewards["faith"].config.on_judge_error == "raise"   # an axis's own option wins
    from rewardkit.errors import ConfigError
    with pytest.raises(ConfigError, match="on_judge_error"):
        Composite({**cfg, "on_judge_error": "skip"}, judge=PoisonImage())


# ------------------------------------------------------------------------------- the fault matrix: every judge reward
def judge_rewards() -> list[str]:
    """Every registered reward whose configuration has ``on_judge_error`` (the registry's metadata): a judge
    reward added later joins this matrix, and fails it until :data:`FAULTS` says how to call it."""
    import dataclasses

    from rewardkit.registry import get_reward_class, list_rewards

    out = []
    for name in list_rewards():
        cls = get_reward_class(name)
        if not cls.__module__.startswith("rewardkit."):  # an installed plugin is not this project's to cover
            continue
        if dataclasses.is_dataclass(cls.Config) and "on_judge_error" in {f.name for f in dataclasses.fields(cls.Config)}:
            out.append(name)
    return out


RATIONAL_OK = ("Text Faithfulness: the cat is there.\nScore: 4\nImage Faithfulness: none.\nScore: N/A\n"
               "Physical and Visual Quality: sharp.\nScore: 3\nText Rendering: none.\nScore: N/A\n"
               "Summary: fine.\nRefined Request: a cat")


class Down(JudgeBackend):
    """Every request whose conversation shows the POISON image fails (a server down after retries); others are
    answered: ``answer`` for generate, Yes 0.9 / No 0.1 for choice questions, P(Yes) 0.7 full-vocabulary. With
    ``isolates_rows`` it reports a failing request per row (as the OpenAI backend does) when asked to."""

    kind = "down"

    def __init__(self, answer="", isolates_rows=False):
        self.answer, self.isolates_rows = answer, isolates_rows

    @staticmethod
    def poisoned(conv):
        return any(c.get("type") == "image" and c["image"].getpixel((0, 0)) == (1, 2, 3)
                   for m in conv if isinstance(m.get("content"), list) for c in m["content"])

    def _rows(self, conversations, one, row_errors):
        out = []
        for conv in conversations:
            if self.poisoned(conv):
                if row_errors is None:
                    raise JudgeServerError("http://127.0.0.1:1/v1 failed after 5 attempts; last error: HTTP 503")
                row_errors.append("http://127.0.0.1:1/v1 failed after 5 attempts; last error: HTTP 503")
                out.append(None)
            else:
                if row_errors is not None:
                    row_errors.append(None)
                out.append(one(conv))
        return out

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None,
                 row_errors=None):
        rows = self._rows(conversations, lambda c: [self.answer] * n, row_errors)
        return [r or [] for r in rows]

    def choice_probs(self, conversations, choices, row_errors=None):
        rows = self._rows(conversations, lambda c: [0.9, 0.1] + [0.0] * (len(choices) - 2), row_errors)
        return torch.tensor([r or [NAN] * len(choices) for r in rows])

    def raw_choice_probs(self, conversations, choices, *, reasons=None, row_errors=None):
        rows = self._rows(conversations, lambda c: [0.7] + [0.0] * (len(choices) - 1), row_errors)
        if reasons is not None:
            reasons[:] = [None] * len(conversations)
        return torch.tensor([r or [NAN] * len(choices) for r in rows])


_TWO = [{"questions": tree(("Is there a cat?", [])), "constraint_questions": tree(("Is it clean?", [])),
         "intent": "strict"}] * 2
_AXES = {"axes": [{"name": "faith", "reward": "faithfulness"}], "normalize": "none"}
#: name -> (build(judge, **options), call kwargs besides images / prompt, generate answer)
FAULTS = {
    "faithfulness": (lambda j, **kw: load_reward("faithfulness", judge=j, **kw), {"metadata": _TWO}, ""),
    "constraints": (lambda j, **kw: load_reward("constraints", judge=j, **kw), {"metadata": _TWO}, ""),
    "detectors": (lambda j, **kw: load_reward("detectors", judge=j, applicability="always",
                                              detectors=["garbled_text"], **kw), {}, ""),
    "evr": (lambda j, **kw: load_reward("evr", judge=j, k=1, dimensions=("IC",), max_retries=0, **kw),
            {"sources": [[IMG], [IMG]]}, "Reason: looks right.\nScore: 4"),
    "unifiedreward": (lambda j, **kw: load_reward("unifiedreward", judge=j, **kw), {}, "Final Score: 4"),
    "vqascore": (lambda j, **kw: load_reward("vqascore", judge=j, **kw), {}, ""),
    "rational": (lambda j, **kw: load_reward("rational", judge=j, **kw), {}, RATIONAL_OK),
    "qwenvl": (lambda j, **kw: load_reward("qwenvl", judge=j, **kw), {}, "<Score>4</Score>"),
    "composite": (lambda j, **kw: load_reward("composite", _AXES, judge=j, **kw), {"metadata": _TWO}, ""),
    "weighted-sum": (lambda j, **kw: load_reward("weighted-sum", _AXES, judge=j, **kw), {"metadata": _TWO}, ""),
}


def test_fault_matrix_covers_every_judge_reward():
    assert set(judge_rewards()) == set(FAULTS), "a judge reward is missing from FAULTS (or FAULTS has a stale one)"


@pytest.mark.parametrize("name", judge_rewards())
def test_fault_matrix(name):
    """One policy for every judge reward: auto follows on_error, "nan" / "raise" force; a failing chunk is NaN +
    "judge call failed" and the others are kept; a backend failing one request at a time fails only its sample."""
    build, kw, answer = FAULTS[name]
    imgs = [POISON, IMG]
    r = build(Down(answer))
    out = r(imgs, "a cat", batch_size=1, on_error="nan", **kw)
    assert math.isnan(out.scores[0]) and not out.valid[0] and "judge call failed" in out.errors[0], out.errors
    assert "JudgeServerError" in out.errors[0] or "HTTP 503" in out.errors[0]
    assert out.valid[1] and math.isfinite(out.scores[1]), out.errors[1]
    with pytest.raises(JudgeServerError):                                 # auto + on_error="raise": raises
        r(imgs, "a cat", batch_size=1, **kw)
    forced = build(Down(answer), on_judge_error="nan")(imgs, "a cat", batch_size=1, **kw)
    assert not forced.valid[0] and forced.valid[1]
    with pytest.raises(JudgeServerError):
        build(Down(answer), on_judge_error="raise")(imgs, "a cat", batch_size=1, on_error="nan", **kw)
    with pytest.raises(ValueError, match="on_judge_error"):
        build(Down(answer), on_judge_error="ignore")
    # per-request isolation: both samples in one chunk, only the failing request's sample fails
    iso = build(Down(answer, isolates_rows=True))(imgs, "a cat", batch_size=2, on_error="nan", **kw)
    assert not iso.valid[0] and "HTTP 503" in iso.errors[0] and "judge call failed" in iso.errors[0]
    assert iso.valid[1] and math.isfinite(iso.scores[1]), iso.errors[1]


RATIONAL_PAIR = ("Text Faithfulness: A.\nScores: A = 4, B = 2\nImage Faithfulness: none.\nScores: N/A\n"
                 "Physical and Visual Quality: same.\nScores: A = 3, B = 3\nText Rendering: none.\nScores: N/A\n"
                 "Summary: A.\nPreferred: A")


def test_fault_matrix_rational_compare():
    a, b = [POISON, IMG], [IMG, IMG]
    r = load_reward("rational", judge=Down(RATIONAL_PAIR))
    out = r.compare(a, b, "a cat", batch_size=1, on_error="nan")
    assert not out.valid[0] and out.errors[0].startswith("judge call failed") and out.errors[1] is None
    assert out.prob_a[1] == 0.5          # each order prefers its slot A: one vote each way
    with pytest.raises(JudgeServerError):
        r.compare(a, b, "a cat", batch_size=1)
    iso = load_reward("rational", judge=Down(RATIONAL_PAIR, isolates_rows=True)).compare(a, b, "a cat", on_error="nan")
    assert not iso.valid[0] and "HTTP 503" in iso.errors[0] and iso.errors[1] is None
