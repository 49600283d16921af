"""Rubric rewards: question trees and parent gating by hand, reward logic on a scripted backend, and the
real path end to end on the tiny Qwen2.5-VL judge (answers equal one-at-a-time judge calls)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.compose.rubric import (QuestionTree, RubricCache, answer_trees, classify_intents, generate_trees,
                                      parse_intent, parse_question_list, tree_score)
from rewardkit.judges.base import JudgeBackend

NAN = float("nan")


# ---------------------------------------------------------------- trees
def tree_4():
    # 1 -> 2 -> 3, and 4 standalone
    return QuestionTree.from_list([
        {"id": 1, "question": "Is there a cat?", "parents": [0]},
        {"id": 2, "question": "Is the cat black?", "parents": [1]},
        {"id": 3, "question": "Is the black cat asleep?", "parents": [2]},
        {"id": 4, "question": "Is it daytime?", "parents": []},
    ])


def test_tree_levels_and_validation():
    t = tree_4()
    assert [[q.id for q in lvl] for lvl in t.levels] == [["1", "4"], ["2"], ["3"]]
    with pytest.raises(ValueError, match="unknown parent"):
        QuestionTree.from_list([{"id": 1, "question": "a?", "parents": [7]}])
    with pytest.raises(ValueError, match="cycle"):
        QuestionTree.from_list([{"id": 1, "question": "a?", "parents": [2]}, {"id": 2, "question": "b?", "parents": [1]}])
    with pytest.raises(ValueError, match="duplicate"):
        QuestionTree.from_list([{"id": 1, "question": "a?"}, {"id": 1, "question": "b?"}])
    flat = QuestionTree.from_list(["Is there a dog?", "Is it red?"])
    assert [q.id for q in flat.questions] == ["1", "2"] and len(flat.levels) == 1


def test_tree_score_parent_gating_by_hand():
    t = tree_4()
    # 2 fails, so 3 counts as "no" even if an answer says yes: (1 yes, 2 no, 3 no, 4 yes) = 2/4
    assert tree_score(t, {"1": True, "2": False, "3": True, "4": True}) == 0.5
    assert tree_score(t, {"1": True, "2": True, "3": True, "4": False}) == 0.75
    assert tree_score(t, {"1": False, "4": True}) == 0.25          # 2, 3 unasked
    assert math.isnan(tree_score(t, {}))                          # asked questions with no answer: unknown
    assert math.isnan(tree_score(t, {"1": True, "2": None, "4": True}))   # 2 unanswered: 2 and 3 unknown
    assert tree_score(t, {"1": False, "4": None}) != tree_score(t, {"1": False, "4": None})  # NaN
    with pytest.raises(ValueError):
        tree_score(QuestionTree([]), {})


def test_parsers():
    t = parse_question_list('Sure!\n```json\n[{"id": 1, "question": "Is there a cat?", "parents": []}]\n```')
    assert t.questions[0].text == "Is there a cat?"
    assert len(parse_question_list('{"questions": ["A?", "B?"]}')) == 2
    with pytest.raises(ValueError):
        parse_question_list("no json here")
    t = parse_question_list('Here: [{"id": 1, "question": "A?"}] (note [1] refers to the subject)')
    assert len(t) == 1                                   # prose with brackets after the list is ignored
    assert parse_intent("Strict.") == "strict"
    assert parse_intent("**Open** - the user leaves it to the model, not strict") == "open"
    assert parse_intent("The prompt is neutral.") == "neutral"
    with pytest.raises(ValueError):
        parse_intent("either strict or open")
    with pytest.raises(ValueError):
        parse_intent("unsure")


def test_cache_roundtrip_last_record_wins(tmp_path):
    p = tmp_path / "q.jsonl"
    c = RubricCache(p)
    c.put("a cat", questions=tree_4().to_list())
    c.put("a cat", intent="strict")
    c.put("a dog", questions=[], error="unparsed")
    again = RubricCache(p)
    assert again.get("a cat")["intent"] == "strict" and len(again.tree("a cat")) == 4
    assert again.tree("a dog") is None and len(again) == 2
    p.write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(ValueError, match=":2: not JSON"):
        RubricCache(p)


# ---------------------------------------------------------------- scripted backend (logic tests)
class ScriptedJudge(JudgeBackend):
    """Answers by rule so the reward logic can be checked by hand: P(yes) = 0.9 when the image's red mean
    exceeds 128 and the question contains "red", or the question contains "always"; 0.1 otherwise. For two
    images, P(yes) = 0.9 only when the question says "{first}" is the base and the first image is the red one
    (so reference detectors can be made order-dependent). Text-only questions: yes iff "painting" in the prompt.
    Records every call."""

    kind = "scripted"

    def __init__(self, generations=None, reference_rule="position"):
        self.reference_rule = reference_rule
        self.calls = []
        self.generations = generations or {}

    @staticmethod
    def _red(im):
        return float(np.asarray(im)[..., 0].mean()) > 128

    def choice_probs(self, conversations, choices):
        self.calls.append(conversations)
        rows = []
        for conv in conversations:
            content = conv[-1]["content"]
            imgs = [c["image"] for c in content if c.get("type") == "image"]
            text = " ".join(c["text"] for c in content if c.get("type") == "text")
            if not imgs:
                yes = "painting" in text
            elif len(imgs) == 1:
                yes = "always" in text or ("red" in text and self._red(imgs[0]))
            elif self.reference_rule == "position":   # position-biased: "yes" in one order only
                yes = self._red(imgs[0]) and not self._red(imgs[1])
            else:                                      # content: yes iff the named candidate is red
                cand = imgs[1] if text.startswith("The first image is the base") else imgs[0]
                yes = self._red(cand)
            rows.append([0.9, 0.1] if yes else [0.1, 0.9])
        return torch.tensor(rows)

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        out = []
        for conv in conversations:
            text = conv[-1]["content"][-1]["text"]
            key = next((k for k in self.generations if k in text), None)
            out.append([self.generations.get(key, "I cannot help with that.")] * n)
        return out


RED, BLUE = Image.new("RGB", (16, 16), (220, 0, 0)), Image.new("RGB", (16, 16), (0, 0, 220))
TREE = [{"id": 1, "question": "Is there anything red?", "parents": []},
        {"id": 2, "question": "Is the red thing always there?", "parents": [1]},
        {"id": 3, "question": "Is it always sunny?", "parents": []},
        {"id": 4, "question": "Is the red thing shiny?", "parents": [2]},
        {"id": 5, "question": "Is the sky green?", "parents": [3]}]


def test_answer_trees_level_batching_and_gating():
    judge = ScriptedJudge()
    t = QuestionTree.from_list(TREE)
    probs = answer_trees(judge, [RED, BLUE], [t, t], question_format="{question} Yes or No?", system="sys")
    # RED: 1 yes, 3 yes -> 2 (always) yes, 5 no -> 4 (red) yes ; BLUE: 1 no, 3 yes -> 5 no; 2, 4 never asked
    assert {k: v > 0.5 for k, v in probs[0].items()} == {"1": True, "3": True, "2": True, "5": False, "4": True}
    assert {k: v > 0.5 for k, v in probs[1].items()} == {"1": False, "3": True, "5": False}
    assert [len(c) for c in judge.calls] == [4, 3, 1]              # one call per level, across images
    conv = judge.calls[0][0]
    assert conv[0] == {"role": "system", "content": "sys"}
    assert conv[1]["content"][0]["type"] == "image"                # image first: shared prefix
    assert tree_score(t, {k: v > 0.5 for k, v in probs[0].items()}) == 4 / 5
    assert tree_score(t, {k: v > 0.5 for k, v in probs[1].items()}) == 1 / 5


def test_faithfulness_scores_by_hand(tmp_path):
    from rewardkit import load_reward

    cache = tmp_path / "faith.jsonl"
    RubricCache(cache).put("a red ball", questions=TREE)
    judge = ScriptedJudge()
    reward = load_reward("faithfulness", judge=judge, questions=str(cache))
    out = reward([RED, BLUE, RED, BLUE], ["a red ball", "a red ball", "no tree for me", "meta tree"],
                 metadata=[None, None, None, {"questions": ["Is it always blue?", "Is it red?"]}])
    assert torch.allclose(out.scores[:2], torch.tensor([0.8, 0.2]))
    assert torch.isnan(out.scores[2]) and "no faithfulness questions" in out.errors[2]
    assert float(out.scores[3]) == 0.5                              # flat metadata tree: always yes, red no
    assert out.dimensions["n_asked"].tolist()[:2] == [5.0, 3.0]
    soft = load_reward("faithfulness", judge=judge, questions=str(cache), scoring="soft")
    # RED asked all 5: 0.9 * 4 + 0.1 = 3.7 / 5 ; BLUE asked 1, 3, 5: 0.1 + 0.9 + 0.1 = 1.1 / 5
    assert torch.allclose(soft([RED, BLUE], "a red ball").scores, torch.tensor([3.7 / 5, 1.1 / 5]))


def test_generation_and_intent_offline(tmp_path):
    from rewardkit import load_reward
    from rewardkit.judges import load_template

    gen = ScriptedJudge(generations={
        "a red ball": json.dumps(TREE), "garbled prompt": "not a list",
        "Classify the intent of the prompt below with exactly one word:\n": "strict"})
    tmpl = load_template("rubric", "faithfulness")
    cache = generate_trees(gen, ["a red ball", "garbled prompt"], tmpl, cache=RubricCache(tmp_path / "g.jsonl"))
    assert len(cache.tree("a red ball")) == 5
    assert cache.tree("garbled prompt") is None and "unparsed" in cache.get("garbled prompt")["error"]
    ci = classify_intents(gen, ["p1"], load_template("rubric", "constraints"))
    assert ci.get("p1")["intent"] == "strict"
    # generate_missing: trees made on first sight and written to the cache file
    reward = load_reward("faithfulness", judge=gen, questions=str(tmp_path / "lazy.jsonl"), generate_missing=True)
    assert float(reward([RED], "a red ball").scores[0]) == pytest.approx(0.8)
    assert RubricCache(tmp_path / "lazy.jsonl").tree("a red ball") is not None


def test_constraints_gated_by_intent(tmp_path):
    from rewardkit import load_reward

    cache = RubricCache(tmp_path / "c.jsonl")
    cache.put("a red ball on white", intent="strict", questions=[{"id": 1, "question": "Is it red only?"}])
    cache.put("anything red", intent="open", questions=[{"id": 1, "question": "Is it red only?"}])
    cache.put("failed", intent=None, intent_error="unparsed intent answer")
    reward = load_reward("constraints", judge=ScriptedJudge(), questions=str(cache.path))
    out = reward([RED, RED, RED, BLUE], ["a red ball on white", "anything red", "failed", "anything red"],
                 metadata=[None, None, None, {"intent": "strict"}])
    assert out.scores[0] == 1.0
    assert torch.isnan(out.scores[1]) and "intent is 'open'" in out.errors[1]
    assert torch.isnan(out.scores[2]) and "unparsed intent" in out.errors[2]
    assert out.scores[3] == 0.0                                      # metadata overrides the cached label
    assert reward.intent_for(["a red ball on white", "anything red", "failed", "?"]) == ["strict", "open", None, None]
    ungated = load_reward("constraints", judge=ScriptedJudge(), questions=str(cache.path), only_strict=False)
    assert ungated([RED], "anything red").scores[0] == 1.0


def test_detectors_pointwise_reference_and_applicability(tmp_path):
    from rewardkit import load_reward

    judge = ScriptedJudge()
    det = load_reward("detectors", judge=judge, template=str(_detector_template(tmp_path)))
    # "red_text" (pointwise) always applies; "drift" (reference) applies when the prompt asks for a painting
    out = det([RED, BLUE, RED, RED], ["a style painting", "a style painting", "a photo", "a style painting"],
              metadata=[{"reference_image": BLUE}, {"reference_image": RED}, None, {}])
    # sample 0: red_text fires (red); drift: (ref BLUE, cand RED) -> first not red -> no; order 2 (RED, BLUE) -> yes
    #           -> one order only: no hit
    assert out.dimensions["red_text"].tolist()[:3] == [1.0, 0.0, 1.0]
    assert out.dimensions["drift"][0] == 0.0
    # sample 1: ref RED, cand BLUE: order 1 (RED, BLUE) yes, order 2 (BLUE, RED) no -> no hit; red_text no
    assert out.scores[1] == 0.0 and out.dimensions["drift"][1] == 0.0
    assert torch.isnan(out.dimensions["drift"][2])                  # not enabled for a photo prompt
    assert out.scores[0] == 1.0 and out.scores[2] == 1.0
    assert torch.isnan(out.scores[3]) and "no 'reference_image'" in out.errors[3]
    assert det.cache.get("a style painting")["applies"] == {"drift": True}
    assert det.cache.get("a photo")["applies"] == {"drift": False}
    forced = det([BLUE], "a photo", metadata=[{"detectors": ["red_text"]}])
    assert forced.scores[0] == 0.0 and torch.isnan(forced.dimensions["drift"][0])
    # a content-consistent judge says yes in both orders: the reference detector fires
    content = load_reward("detectors", judge=ScriptedJudge(reference_rule="content"),
                          template=str(_detector_template(tmp_path)), detectors=["drift"])
    hit = content([RED, BLUE], "a style painting", metadata=[{"reference_image": BLUE}, {"reference_image": RED}])
    assert hit.dimensions["drift"].tolist() == [1.0, 0.0] and hit.scores.tolist() == [1.0, 0.0]
    assert len(hit.details[0]["p_yes"]["drift"]) == 2               # asked in both orders
    always = load_reward("detectors", judge=judge, template=str(_detector_template(tmp_path)),
                         applicability="always", missing_reference="skip")
    assert torch.isnan(always([BLUE], "a photo").dimensions["drift"][0])  # skipped: no reference given


def _detector_template(tmp_path):
    p = tmp_path / "det.yaml"
    p.write_text(
        'version: "test-1"\n'
        'answer_system: "inspect"\nanswer_prompt: "{question} Yes or No."\n'
        'applies_system: "read"\napplies_prompt: "Prompt: {prompt}. {question}"\nchoices: ["Yes", "No"]\n'
        "detectors:\n"
        "  red_text: {kind: pointwise, question: 'Is there red text?', applies_question: 'x', enabled_when: any}\n"
        "  drift: {kind: reference, question: '{reference} is the base; does {candidate} drift?',"
        " applies_question: 'Is a style requested?', enabled_when: 'Yes'}\n")
    return p


# ---------------------------------------------------------------- end to end on the tiny Qwen2.5-VL judge
@pytest.fixture(scope="module")
def tiny_judge(tiny_qwen2_5_vl_dir):
    from rewardkit.judges import load_judge

    return load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")


def test_faithfulness_end_to_end_tiny_judge(tiny_judge, tmp_path):
    from rewardkit import load_reward
    from rewardkit.compose.rubric import yes_no_conversation
    from rewardkit.testing import random_images

    imgs = random_images(3, sizes=[(32, 32), (56, 40), (48, 48)], seed=3)
    prompt = "a red apple on a table"
    cache = RubricCache(tmp_path / "t.jsonl")
    tree = [{"id": 1, "question": "Is there an apple?", "parents": []},
            {"id": 2, "question": "Is the apple red?", "parents": [1]},
            {"id": 3, "question": "Is there a table?", "parents": []}]
    cache.put(prompt, questions=tree)
    reward = load_reward("faithfulness", judge=tiny_judge, questions=str(cache.path))
    fmt, system = reward.template["answer_prompt"], reward.template["answer_system"]
    # reference: each level-0 question asked alone, one conversation per call
    direct = {(i, q): float(tiny_judge.choice_probs([yes_no_conversation([im], fmt.format(question=t), system)],
                                                    ["Yes", "No"])[0, 0])
              for i, im in enumerate(imgs) for q, t in (("1", tree[0]["question"]), ("3", tree[2]["question"]))}
    vals = sorted(direct.values())
    thr = (vals[2] + vals[3]) / 2                  # splits the random answers: some yes, some no
    reward = load_reward("faithfulness", judge=tiny_judge, questions=str(cache.path), threshold=thr)
    before = tiny_judge.stats["images_encoded"]
    out = reward(imgs, prompt)
    assert tiny_judge.stats["images_encoded"] - before == 3        # each image through the vision tower once
    for i in range(3):
        got = out.details[i]["p_yes"]
        for q in ("1", "3"):
            assert got[q] == pytest.approx(direct[(i, q)], abs=1e-4)
        asked_2 = "2" in got
        assert asked_2 == (direct[(i, "1")] > thr)                 # child asked only when its parent passed
        # the score by hand for this tree (2's parent is 1; an unasked question counts as "no"): the fraction of
        # yes among the three questions
        y1, y3 = direct[(i, "1")] > thr, direct[(i, "3")] > thr
        y2 = asked_2 and got["2"] > thr
        assert float(out.scores[i]) == pytest.approx((y1 + (y1 and y2) + y3) / 3)
    assert out.valid.all() and out.info["template"] == "rubric/faithfulness@1"


def test_composite_stage2_recipe_on_tiny_judge(tiny_judge, tiny_clip_dir, tmp_path):
    """The Stage 2 recipe's reward section on tiny checkpoints, one judge shared by every rubric reward."""
    from pathlib import Path

    import yaml

    from rewardkit.compose import build_composite
    from rewardkit.testing import random_images

    recipe = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "arena_rubric" / "stage2.yaml").read_text())
    section = recipe["reward"]
    prompts = ["a red apple on a table", "two birds on a branch", "a green bowl", "a blue car"]
    cache = RubricCache(tmp_path / "q.jsonl")
    for p in prompts:
        cache.put(p, questions=[{"id": 1, "question": f"Does the image show {p}?"}], intent="strict")
    section["judge"] = None
    section["axes"][0]["options"] = {"model": str(tiny_clip_dir), "device": "cpu"}
    for ax in section["axes"][1:]:
        ax["options"]["questions"] = str(cache.path)
    section["detectors"]["options"]["applicability_cache"] = ""
    comp = build_composite(recipe, section="reward", judge=tiny_judge)
    assert [getattr(r, "judge", tiny_judge) is tiny_judge for r in comp.rewards.values()] == [True] * 4
    imgs = random_images(4, sizes=[(32, 32), (48, 40), (40, 56), (64, 64)], seed=5)
    meta = [{"intent": "strict", "reference_image": imgs[1]}, {"intent": "open", "reference_image": imgs[0]},
            {"intent": "neutral", "reference_image": imgs[3]}, {"intent": "strict", "reference_image": imgs[2]}]
    out = comp(imgs, prompts, metadata=meta)
    assert out.valid.all(), out.errors
    d = out.dimensions
    # by hand (not with compose.functions, which the composite calls): composites default to the RL z-score
    # convention, (x - mean) / (population std + 1e-4); the strength-1 veto removes the positive part of z
    raw = d["preference/raw"].double()
    zp = ((raw - raw.mean()) / (raw.std(unbiased=False) + 1e-4)).float()
    assert torch.allclose(d["preference/z"], zp, atol=1e-5)
    zpv = torch.where(d["detectors/fired"] > 0, zp.clamp(max=0), zp)
    zc = torch.where(d["constraint/gate"] > 0, d["constraint/z"], torch.zeros(4))
    assert torch.allclose(out.scores, zpv + d["faithfulness/z"] + zc, atol=1e-5)
    assert d["constraint/gate"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert torch.isnan(d["constraint/raw"][1])                     # not asked for an open prompt
    for name in ("garbled_text", "unrequested_text", "photoreal_drift"):
        assert f"detectors/{name}" in d
