"""UnifiedReward's edit, 2.0 and Think templates: strict parsers on hand-written answers (well-formed and
malformed), the conversations each template sends, and the score arithmetic, with a scripted backend; the edit
template through the conformance checks on a tiny real judge."""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.judges import JudgeBackend
from rewardkit.testing import random_images


class Scripted(JudgeBackend):
    """Returns canned answers in order and records the conversations it was given."""

    kind = "scripted"

    def __init__(self, answers=()):
        self.answers, self.seen = list(answers), []

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        self.seen.extend(conversations)
        return [[self.answers.pop(0)] for _ in conversations]

    def choice_probs(self, conversations, choices):
        raise NotImplementedError


def jpeg95(im):
    """UnifiedReward's vLLM client (vllm_qwen/vllm_request.py:53-58): convert("RGB"), JPEG quality 95; decoded."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    im.convert("RGB").save(buf, format="JPEG", quality=95)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def same_pixels(a, b):
    import numpy as np

    return a.size == b.size and np.array_equal(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB")))


def content(conv):
    """(images, text) of a one-turn conversation, checking its shape: images first, then one text."""
    assert len(conv) == 1 and conv[0]["role"] == "user"
    items = conv[0]["content"]
    assert all(c["type"] == "image" for c in items[:-1]) and items[-1]["type"] == "text"
    return [c["image"] for c in items[:-1]], items[-1]["text"]


# ------------------------------------------------------------------------------------------ edit: parser
@pytest.mark.parametrize("text,want", [
    ('{\n\n"reasoning" : "The hat was added.",\n"score" : [20, 25],\n}', [20.0, 25.0]),   # the prompt's own form
    ('{"reasoning": "ok", "score": [0, 25]}', [0.0, 25.0]),
    ('```json\n{"reasoning": "fine", "score": [12.5, 7]}\n```', [12.5, 7.0]),
    ('Here is my evaluation:\n{"score": [3, 4]}', [3.0, 4.0]),
    ('{"reasoning": "a {nested} brace", "score": [10, 11,],}', [10.0, 11.0]),
])
def test_parse_edit_scores_accepts(text, want):
    from rewardkit.rewards.unifiedreward import parse_edit_scores

    assert parse_edit_scores(text) == (want, None)


@pytest.mark.parametrize("text,why", [
    ("", "empty"), (None, "empty"), ("   \n", "empty"),
    ("The edit is good. 20/25", 'no "score"'),
    ('{"reasoning": "x", "score": [20]}', "list of two"),
    ('{"reasoning": "x", "score": [20, 21, 22]}', "list of two"),
    ('{"reasoning": "x", "score": 20}', "list of two"),
    ('{"reasoning": "x", "score": ["20", 21]}', "non-number"),
    ('{"reasoning": "x", "score": [true, 21]}', "non-number"),
    ('{"reasoning": "x", "score": [null, 21]}', "non-number"),
    ('{"reasoning": "x", "score": [26, 21]}', "outside [0, 25]"),
    ('{"reasoning": "x", "score": [-1, 21]}', "outside [0, 25]"),
    ('{"reasoning": "x", "score": [NaN, 21]}', "unreadable JSON"),
    ('{"reasoning": "x", "score": [Infinity, 21]}', "unreadable JSON"),
    ('{"reasoning": "x", "score": [1e400, 21]}', "outside"),
    ('{"reasoning": "x", "score": [' + "9" * 400 + ', 21]}', "outside"),   # an int no float holds
    ('{"reasoning": "x", "score": [20, 21]', "no JSON object"),
    ('"score": [20, 21]', "no JSON object"),
    ('{"reasoning": "x" "score": [20, 21]}', "unreadable JSON"),
    ('{"score": [20, 21]}\n... on reflection {"score": [5, 6]}', '"score" given 2 times'),
    ('{"reasoning": 3, "score": [20, 21]}', "reasoning is not a string"),
    ('{"reasoning": "x", "score": [20, 21], "overall": 25}', "unexpected keys"),
    ('{"score": [1, 2]} and one more }', "unreadable JSON"),
])
def test_parse_edit_scores_refuses(text, why):
    from rewardkit.rewards.unifiedreward import parse_edit_scores

    v, reason = parse_edit_scores(text)
    assert v is None and why in reason, reason


# ------------------------------------------------------------------------------------------ 2.0: parsers
ACS_OK = "Alignment Score (1-5): 2.694700002670288\nCoherence Score (1-5): 2.371500015258789\nStyle Score (1-5): 2.8025"


@pytest.mark.parametrize("text,want", [
    (ACS_OK, {"alignment": 2.694700002670288, "coherence": 2.371500015258789, "style": 2.8025}),
    ("**Alignment Score (1-5):** 5\n- Coherence Score (1-5): 4.\nStyle Score (1-5): **1**",
     {"alignment": 5.0, "coherence": 4.0, "style": 1.0}),
])
def test_parse_axis_scores_accepts(text, want):
    from rewardkit.rewards.unifiedreward import parse_axis_scores

    assert parse_axis_scores(text) == (want, None)


@pytest.mark.parametrize("text,why", [
    ("", "empty"), (None, "empty"),
    ("Alignment Score (1-5): 3\nCoherence Score (1-5): 3", "no 'Style Score'"),
    (ACS_OK.replace("2.8025", "six"), "malformed 'Style Score'"),
    (ACS_OK.replace("2.8025", "5.5"), "outside [1, 5]"),
    (ACS_OK.replace("2.8025", "0"), "outside [1, 5]"),
    (ACS_OK.replace("2.8025", "-3"), "malformed"),
    (ACS_OK.replace("2.8025", "3/5"), "malformed"),
    (ACS_OK.replace("2.8025", "nan"), "malformed"),
    (ACS_OK + "\nStyle Score (1-5): 4", "given 2 times"),
    (ACS_OK.replace("Alignment Score (1-5)", "Alignment Score"), "malformed 'Alignment Score'"),
    (ACS_OK.replace("2.8025", "3 (good)"), "malformed"),
])
def test_parse_axis_scores_refuses(text, why):
    from rewardkit.rewards.unifiedreward import parse_axis_scores

    v, reason = parse_axis_scores(text)
    assert v is None and why in reason, reason


PAIR_OK = ("Alignment Score:\n Image 1: 0.435699999332428\n Image 2: 0.564300000667572\n\n"
           "Coherence Score:\n Image 1: 0.4180000126361847\n Image 2: 0.5820000171661377\n\n"
           "Style Score:\n Image 1: 0.40790000557899475\n Image 2: 0.5921000242233276\n")


def test_parse_pair_axis_scores_accepts():
    from rewardkit.rewards.unifiedreward import parse_pair_axis_scores

    got, why = parse_pair_axis_scores(PAIR_OK)
    assert why is None and got["alignment"] == (0.435699999332428, 0.564300000667572)
    assert got["style"] == (0.40790000557899475, 0.5921000242233276)
    got, why = parse_pair_axis_scores(PAIR_OK.replace("0.4180000126361847", "1").replace("0.5820000171661377", "0"))
    assert why is None and got["coherence"] == (1.0, 0.0)


@pytest.mark.parametrize("text,why", [
    ("", "empty"), (None, "empty"),
    (PAIR_OK.replace("Style Score:", "Style:"), "no 'Style Score'"),
    (PAIR_OK + "\nStyle Score:\n Image 1: 0.5\n Image 2: 0.5\n", "given 2 times"),
    (PAIR_OK.replace("0.435699999332428", "0.9"), "do not sum to 1"),
    (PAIR_OK.replace("0.435699999332428", "1.4357").replace("0.564300000667572", "-0.4357"), "malformed"),
    (PAIR_OK.replace("0.435699999332428", "1.2"), "outside [0, 1]"),
    (PAIR_OK.replace(" Image 2: 0.564300000667572\n", ""), "malformed 'Alignment Score'"),
    (PAIR_OK.replace("Image 1: 0.4180000126361847", "Image 1: high"), "malformed 'Coherence Score'"),
    (PAIR_OK.replace("Image 1: 0.435699999332428\n Image 2: 0.564300000667572",
                     "Image 2: 0.564300000667572\n Image 1: 0.435699999332428"), "malformed"),
])
def test_parse_pair_axis_scores_refuses(text, why):
    from rewardkit.rewards.unifiedreward import parse_pair_axis_scores

    v, reason = parse_pair_axis_scores(text)
    assert v is None and why in reason, reason


# ------------------------------------------------------------------------------------------ Think: parser
@pytest.mark.parametrize("text,want,why", [
    ("<think>\n1. ...\nTotal score:\nImage 1: 31\nImage 2: 28\n</think>\n<answer>Image 1 is better</answer>", 1.0, None),
    ("<think>...</think><answer> Image 2 is better. </answer>", 0.0, None),
    ("<think>...</think><ANSWER>image 2 is better</ANSWER>", 0.0, None),
    ("", None, "empty"), (None, None, "empty"),
    ("<think>...</think>\nImage 1 is better", None, "no <answer>"),
    ("<think>...</think><answer>Image 1 is better", None, "unclosed"),
    ("<answer>Image 1 is better</answer><answer>Image 2 is better</answer>", None, "2 <answer> blocks"),
    ("<answer>Image 1 is better</answer> <answer>", None, "2 <answer> blocks"),
    ("<answer>Both images are equally good</answer>", None, "not 'Image 1 is better'"),
    ("<answer>Image 1 is better because it is sharper</answer>", None, "not 'Image 1 is better'"),
    ("<answer></answer>", None, "not 'Image 1"),
    ("<answer>Image 3 is better</answer>", None, "not 'Image 1"),
])
def test_parse_think_verdict(text, want, why):
    from rewardkit.rewards.unifiedreward import parse_think_verdict

    v, reason = parse_think_verdict(text)
    assert v == want and (reason is None if why is None else why in reason), reason


# ------------------------------------------------------------------------------------------ rewards
def test_edit_template_conversations_and_arithmetic():
    from rewardkit.errors import RewardInputError
    from rewardkit.judges import load_template
    from rewardkit.rewards.unifiedreward import UnifiedReward

    src, e1, e2, e3 = random_images(4, sizes=[(32, 32), (40, 24), (24, 40), (32, 32)], seed=7)
    judge = Scripted([
        '{\n"reasoning" : "done",\n"score" : [20, 16],\n}', '{"reasoning": "clean", "score": [25, 9]}',  # sample 0
        '{"reasoning": "x", "score": [30, 16]}', '{"reasoning": "clean", "score": [25, 25]}',            # 0..25 broken
        '{"reasoning": "x", "score": [0, 25]}', "I cannot tell.",                                         # no JSON
    ])
    r = UnifiedReward(judge=judge, template="edit")
    assert r.tasks == frozenset({"edit"}) and r.score_range == (0.0, 25.0) and r.requires_sources
    out = r([e1, e2, e3], ["add a hat", "make it red", "remove the dog"], sources=[[src], [src], [src]],
            on_error="nan")
    assert out.valid.tolist() == [True, False, False]
    assert float(out.scores[0]) == pytest.approx(math.sqrt(16 * 9))  # sqrt(min(SC) * min(PQ)) = 12
    d = {k: v.tolist() for k, v in out.dimensions.items()}
    assert d["editing_success"][0] == 20 and d["overediting"][0] == 16 and d["naturalness"][0] == 25
    assert d["artifacts"][0] == 9 and d["semantic_consistency"][0] == 16 and d["perceptual_quality"][0] == 9
    assert math.isnan(out.scores[1]) and "instruction-following answer: score [30.0, 16.0] outside [0, 25]" in out.errors[1]
    assert math.isnan(d["editing_success"][1]) and d["naturalness"][1] == 25  # the half the judge gave is kept
    assert "quality answer" in out.errors[2] and "instruction-following" not in out.errors[2]
    assert "I cannot tell." in out.rationales[2]
    # two conversations per sample: [source, edited] + instruction-following prompt, then [edited] + quality
    t = load_template("unifiedreward", "edit")
    ims, text = content(judge.seen[0])
    # sent as UnifiedReward-Edit's client sends them: JPEG quality 95 (not the lossless pixels)
    assert [same_pixels(a, b) for a, b in zip(ims, [jpeg95(src), jpeg95(e1)])] == [True, True] and len(ims) == 2
    assert not same_pixels(ims[1], e1)
    assert text == t.render("instruction_following", prompt="add a hat")
    assert text.endswith("\n\nEditing instruction:add a hat\n") and '{\n\n"reasoning" : "...",' in text
    ims2, text = content(judge.seen[1])
    assert len(ims2) == 1 and ims2[0] is ims[1]  # the edited image encoded once, sent in both conversations
    assert text == t.render("quality") and text.endswith("output score = [naturalness, artifacts]\n")
    assert [same_pixels(content(c)[0][-1], jpeg95(e)) for c, e in zip(judge.seen[2:], [e2, e2, e3, e3])] == [True] * 4
    with pytest.raises(RewardInputError, match="sources"):
        r([e1], "add a hat")
    with pytest.raises(RewardInputError):
        r([e1], "add a hat", sources=[[src, src]])  # one source per edit
    # no native pairwise prompt with a stated answer format: compare() uses the pointwise scores
    judge.answers = ['{"score": [25, 25]}', '{"score": [25, 16]}', '{"score": [9, 25]}', '{"score": [25, 25]}']
    cmp = r.compare([e1], [e2], "add a hat", sources=[[src]])
    assert not r.compare_is_symmetric
    assert float(cmp.prob_a[0]) == pytest.approx(torch.sigmoid(torch.tensor((20.0 - 15.0) / r.compare_temperature)).item())


def test_template_2_0_pointwise_and_pairwise():
    from rewardkit.judges import load_template
    from rewardkit.rewards.unifiedreward import UnifiedReward

    ims = random_images(2, seed=8)
    judge = Scripted([ACS_OK, "Alignment Score (1-5): 4"])
    r = UnifiedReward(judge=judge, template="2.0")
    out = r(ims, ["a cat", "a dog"], on_error="nan")
    want = (2.694700002670288 + 2.371500015258789 + 2.8025) / 3
    assert out.valid.tolist() == [True, False] and float(out.scores[0]) == pytest.approx(want)
    assert float(out.dimensions["style"][0]) == pytest.approx(2.8025) and math.isnan(out.dimensions["style"][1])
    assert "no 'Coherence Score'" in out.errors[1]
    t = load_template("unifiedreward", "2.0")
    sent, text = content(judge.seen[0])
    assert text == t.render("pointwise", prompt="a cat") and len(sent) == 1 and same_pixels(sent[0], jpeg95(ims[0]))
    assert content(judge.seen[0])[1].endswith("Style Score (1-5): Z\n\nYour task is provided as follows:\nText Caption: [a cat]")
    # pairwise, both orders: image 1's mean relative score per order, P(a) = (v_ab + 1 - v_ba) / 2
    swapped = PAIR_OK.replace("0.435699999332428", "0.6").replace("0.564300000667572", "0.4")
    judge.answers, judge.seen = [PAIR_OK, swapped], []
    cmp = r.compare(ims[:1], ims[1:], "a cat")
    v_ab = (0.435699999332428 + 0.4180000126361847 + 0.40790000557899475) / 3
    v_ba = (0.6 + 0.4180000126361847 + 0.40790000557899475) / 3
    assert float(cmp.prob_a[0]) == pytest.approx(0.5 * (v_ab + 1 - v_ba)) and r.compare_is_symmetric
    sent, text = content(judge.seen[0])
    assert text == t.render("pairwise", prompt="a cat")
    assert [same_pixels(a, jpeg95(b)) for a, b in zip(sent, ims)] == [True, True]
    assert content(judge.seen[1])[0] == sent[::-1]
    judge.answers = [PAIR_OK, PAIR_OK.replace("0.435699999332428", "0.9")]
    bad = r.compare(ims[:1], ims[1:], "a cat", on_error="nan")
    assert not bad.valid[0] and "swapped order" in bad.errors[0] and "do not sum to 1" in bad.errors[0]


def test_template_think_is_pairwise_only():
    from rewardkit.judges import load_template
    from rewardkit.rewards.unifiedreward import UnifiedReward

    ims = random_images(2, seed=9)
    judge = Scripted(["<think>a</think><answer>Image 1 is better</answer>",
                      "<think>b</think><answer>Image 2 is better</answer>"])
    r = UnifiedReward(judge=judge, template="think", max_new_tokens=1024)
    cmp = r.compare(ims[:1], ims[1:], "a cat")
    assert cmp.prob_a.tolist() == [1.0] and cmp.valid.all()
    text = load_template("unifiedreward", "think").render("pairwise", prompt="a cat")
    assert content(judge.seen[0]) == ([ims[0], ims[1]], text) and "<answer>Image 1 is better</answer>" in text
    judge.answers = ["<answer>Image 1 is better</answer>", "<answer>Image 1 is better</answer> <answer>"]
    bad = r.compare(ims[:1], ims[1:], "a cat", on_error="nan")
    assert not bad.valid[0] and "2 <answer> blocks" in bad.errors[0]
    with pytest.raises(NotImplementedError, match="compare"):
        r(ims[:1], "a cat")


def test_template_options_are_checked(tmp_path):
    from rewardkit.rewards.unifiedreward import UnifiedReward

    bad = tmp_path / "bad.yaml"
    bad.write_text('version: "x"\ntask: "t2i"\npointwise_format: "stars"\npointwise: "{prompt}"\nscore_min: 1\n'
                   'score_max: 5\n')
    with pytest.raises(ValueError, match="pointwise_format"):
        UnifiedReward(judge=Scripted(), template=str(bad))
    bad.write_text('version: "x"\ntask: "t2i"\npointwise_format: "edit_json"\ninstruction_following: "{prompt}"\n'
                   'quality: "q"\nscore_min: 0\nscore_max: 25\n')
    with pytest.raises(ValueError, match="edit_json"):
        UnifiedReward(judge=Scripted(), template=str(bad))
    assert UnifiedReward(judge=Scripted()).tasks == frozenset({"t2i"})  # the default template is unchanged


@pytest.mark.slow
def test_edit_template_conformance_on_a_tiny_judge(tmp_path):
    """The edit instance passes every conformance check on a tiny random Qwen2.5-VL judge (its answers do
    not parse: every sample is NaN + reason, never a default score)."""
    from rewardkit.conformance import CHECKS
    from rewardkit.rewards.unifiedreward import UnifiedReward

    base = UnifiedReward.tiny(str(tmp_path))
    r = UnifiedReward(judge=base.judge, template="edit", max_new_tokens=2)
    for name, check in CHECKS.items():
        check(r)
    src, e = random_images(2, seed=10)
    out = r([e], "add a hat", sources=[[src]], on_error="nan")
    assert not out.valid[0] and "answer" in out.errors[0]


class _BrightEdit(JudgeBackend):
    """Edit answers from the pixels: every score = 25 * brightness of the last image of the conversation."""

    kind = "bright-edit"

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        import numpy as np

        out = []
        for conv in conversations:
            ims, _ = content(conv)
            v = 25.0 * float(np.asarray(ims[-1], dtype=np.float32).mean() / 255.0)
            out.append([f'{{\n"reasoning" : "by brightness",\n"score" : [{v:.4f}, {v:.4f}],\n}}'])
        return out

    def choice_probs(self, conversations, choices):
        raise NotImplementedError


def test_bench_runs_the_edit_template(tmp_path):
    """`rewardkit bench`'s harness on the synthetic edit benchmarks: sources reach the judge, every sample
    parses (no invalid judgement), the edit template scores pointwise."""
    from rewardkit.bench import evaluate
    from rewardkit.bench.synthetic import write_synthetic_benchmarks
    from rewardkit.rewards.unifiedreward import UnifiedReward

    write_synthetic_benchmarks(tmp_path / "data", n_pairs=6, n_groups=2)
    res = evaluate(UnifiedReward(judge=_BrightEdit(), template="edit"), ["genaibench/edit"],
                   data_dir=tmp_path / "data", cache_dir=None, n_boot=0, progress=False)
    r = res.benchmarks["genaibench/edit"]
    assert r.counts["n_invalid_samples"] == 0 and r.counts["n_scored_now"] > 0, r.counts
    assert 0.0 <= r.metrics[r.primary].value <= 1.0


class _Recording(Scripted):
    def generate(self, conversations, **kw):
        self.kw = kw
        return super().generate(conversations, **kw)


@pytest.mark.parametrize("template, tokens, jpeg", [("t2i", 512, False), ("think", 512, False),
                                                     ("2.0", 4096, True), ("edit", 4096, True)])
def test_decoding_follows_each_templates_scripts(template, tokens, jpeg):
    """t2i / think: transformers generate(max_new_tokens=512) on the images as opened; 2.0 / edit: UnifiedReward's
    vLLM client, JPEG quality 95 and "max_tokens": 4096 (vllm_qwen/vllm_request.py:53-58, 111-116)."""
    from rewardkit.rewards.unifiedreward import UnifiedReward

    ims = random_images(2, sizes=[(48, 40), (40, 48)], seed=14)
    judge = _Recording(["x"] * 4)
    r = UnifiedReward(judge=judge, template=template)
    if template == "edit":
        out = r(ims[:1], "add a hat", sources=[ims[1:]], on_error="nan")
        sent = content(judge.seen[0])[0]
        want = [ims[1], ims[0]]
    elif template == "think":
        out = r.compare(ims[:1], ims[1:], "a cat", on_error="nan")
        sent, want = content(judge.seen[0])[0], ims
    else:
        out = r(ims[:1], "a cat", on_error="nan")
        sent, want = content(judge.seen[0])[0], ims[:1]
    assert judge.kw["max_new_tokens"] == tokens and judge.kw["temperature"] == 0.0
    assert [same_pixels(a, jpeg95(b) if jpeg else b) for a, b in zip(sent, want)] == [True] * len(want)
    assert out.info["max_new_tokens"] == tokens and out.info["images"] == ("jpeg95" if jpeg else "none")


def test_decoding_overrides():
    from rewardkit.rewards.unifiedreward import UnifiedReward, jpeg_roundtrip

    ims = random_images(1, size=40, seed=15)
    judge = _Recording(["x"] * 4)
    UnifiedReward(judge=judge, template="edit", reencode="none", max_new_tokens=512)(
        ims, "add a hat", sources=[ims], on_error="nan")
    assert judge.kw["max_new_tokens"] == 512 and same_pixels(content(judge.seen[0])[0][1], ims[0])  # as decoded
    judge.seen = []
    UnifiedReward(judge=judge, reencode="jpeg50")(ims, "a cat", on_error="nan")
    assert same_pixels(content(judge.seen[0])[0][0], jpeg_roundtrip(ims[0], 50))
    assert not same_pixels(jpeg_roundtrip(ims[0], 50), jpeg95(ims[0]))
    for bad in ("png", "jpeg0", "jpeg101", "JPEG95"):
        with pytest.raises(ValueError, match="reencode must be"):
            UnifiedReward(judge=Scripted(), reencode=bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        UnifiedReward(judge=Scripted(), max_new_tokens=0)


# Each template prompt, rendered for one caption, byte for byte as the upstream script builds it: the sha256 of the
# upstream expression (CodeGoat24/UnifiedReward, commit / file / line below) evaluated with the caption (and, for
# the edit scripts, the instruction) set to PROMPT, read with ast. The expected side is upstream's bytes, never the
# template file: a changed word, space or escape fails.
UPSTREAM_PROMPTS = [  # (template, field, commit, file:line, sha256 of the rendered prompt)
    ("t2i", "pointwise", "ff6f520", "inference_qwen/image_generation/qwen_point_score_image_generation.py:31",
     "58efc81edecf0f7e4d6e76e084805e861711e1bebceda0f621f4180f0a886224"),
    ("t2i", "pairwise", "ff6f520", "inference_qwen/image_generation/qwen_pair_rank_image_generation.py:35",
     "ce57635beb580b0ff31c5990b575283b79c5c7a7559f63e5cc25e6da428736b0"),
    ("2.0", "pointwise", "a759534", "inference_qwen/UnifiedReward-2.0-inference/point_score_ACS_image_generation.py:30",
     "e1d5c342975dc956dbfe6d86cacd13ae28397a5ed4cf0e28ecd03035e415bd6c"),
    ("2.0", "pairwise", "a759534", "inference_qwen/UnifiedReward-2.0-inference/pair_score_image_generation.py:34",
     "7bbd77880fd45646ab1b467655740eb1297df0bb74085edc2b53441fa77456cd"),
    ("think", "pairwise", "ff6f520",
     "UnifiedReward-Think/benchmark_evaluation/GenAI-Bench-Image/test_qwen25_cot_genAI_bench_image.py:56",
     "d456a5fe86d776636ccbf38f9bdaf013a4131ec6afd5d23ccceb9e5963d28e56"),
    ("edit", "instruction_following", "57aabd3", "UnifiedReward-Edit/edit_pointwise_instruction_following.py:28",
     "49aaba7f72002df52266d92bccabb9ccc48ced6520afebc76ae5744a38fc73fb"),
    ("edit", "quality", "57aabd3", "UnifiedReward-Edit/edit_pointwise_quality.py:28",
     "ddb40baa511dbf2fd619474e5a0fcd043c6325f976bfc8fd1f8b9fbf4c521113"),
]
PROMPT = 'a red "cat" {x}'  # quotes and braces: an escaping or str.format slip changes the bytes


@pytest.mark.parametrize("name,field,commit,where,sha", UPSTREAM_PROMPTS)
def test_templates_render_the_upstream_prompt_bytes(name, field, commit, where, sha):
    import hashlib

    from rewardkit.judges import load_template

    text = load_template("unifiedreward", name).render(field, prompt=PROMPT)
    assert hashlib.sha256(text.encode()).hexdigest() == sha, (name, field, commit, where)


# --------------------------------------------------------------- unifiedreward parsers
@pytest.mark.parametrize("digit", ["\uff14", "\u0664", "\u096a"])  # fullwidth, Arabic-Indic, Devanagari four
def test_unifiedreward_parsers_take_ascii_digits_only(digit):
    """Bug: the parsers used Python's Unicode-aware \\d, so 'Final Score: ４' read as 4.0 (EVR's parser, by
    contrast, takes ASCII digits only)."""
    from rewardkit.rewards.unifiedreward import parse_axis_scores, parse_final_score, parse_pair_axis_scores

    assert parse_final_score(f"Final Score: {digit}")[0] is None
    assert parse_final_score("Final Score: 4") == (4.0, None)
    acs = "Alignment Score (1-5): {}\nCoherence Score (1-5): 3\nStyle Score (1-5): 5"
    assert parse_axis_scores(acs.format(digit))[0] is None
    assert parse_axis_scores(acs.format("4"))[0] == {"alignment": 4.0, "coherence": 3.0, "style": 5.0}
    pair = ("Alignment Score:\n Image 1: {}\n Image 2: 0.4\n\nCoherence Score:\n Image 1: 0.5\n Image 2: 0.5\n\n"
            "Style Score:\n Image 1: 1\n Image 2: 0")
    assert parse_pair_axis_scores(pair.format(f"0.{digit}"))[0] is None
    assert parse_pair_axis_scores(pair.format("0.6"))[0] == {"alignment": (0.6, 0.4), "coherence": (0.5, 0.5),
                                                              "style": (1.0, 0.0)}


@pytest.mark.parametrize("text", [
    '{"sc\\u006fre": [25, 25], "score": [1, 2]}',         # a second "score" the raw-text count cannot see
    '{"score": [1, 2], "reasoning": "a", "reasoning": "b"}',
])
def test_parse_edit_scores_refuses_duplicate_keys(text):
    """Bug: json.loads keeps the last of duplicated keys silently: '{"sc\\u006fre": [25, 25], "score": [1, 2]}'
    read as [1, 2] although the answer gives "score" twice."""
    from rewardkit.rewards.unifiedreward import parse_edit_scores

    vals, why = parse_edit_scores(text)
    assert vals is None and "twice" in why


def test_parse_edit_scores_adversarial_answers():
    from rewardkit.rewards.unifiedreward import parse_edit_scores

    assert parse_edit_scores('```json\n{"reasoning": "ok",\n"score" : [20, 16],\n}\n```') == ([20.0, 16.0], None)
    for bad in ('{"score": [20, 16]} {"score2": 1}',          # two JSON objects
                '{"reasoning": {"score": [1, 2]}}',          # nested score
                '{"score": [NaN, 2]}', '{"score": [Infinity, 2]}', '{"score": [25.5, 2]}', '{"score": [true, 2]}',
                '{"score": ["4", 2]}', '{"score": [4]}', '{"score": [1' + "0" * 400 + ', 2]}',
                '{"score": [1, 2], "extra": 1}', '"score": ' + "[" * 100_000):
        vals, why = parse_edit_scores(bad)
        assert vals is None and why, bad[:60]


def test_parse_think_verdict_is_linear_in_the_answer_length(monkeypatch):
    """Bug: the lazy <answer>(.*?)</answer> search ran before the count of opening tags: 12 000 unclosed
    '<answer>' took ~5 s (quadratic; 8 000: 2.4 s on this machine). The count now refuses them first: checked
    with a block search that fails the test if it runs on such an answer (not with a clock)."""
    from rewardkit.rewards import unifiedreward
    from rewardkit.rewards.unifiedreward import parse_think_verdict

    class NoSearch:
        def findall(self, text):
            raise AssertionError("the quadratic <answer> block search ran on an answer with many opening tags")

    with monkeypatch.context() as m:
        m.setattr(unifiedreward, "_ANSWER", NoSearch())
        v, why = parse_think_verdict("<think>" + "<answer>" * 12_000)
    assert v is None and "12000 <answer> blocks" in why
    v, why = parse_think_verdict("<answer>" * 3 + "<answer>Image 1 is better</answer>")
    assert v is None and "4 <answer> blocks" in why
    assert parse_think_verdict("<think>x</think>\n<answer>Image 2 is better.</answer>") == (0.0, None)
    assert parse_think_verdict("<answer>Image 1 is better")[0] is None
    assert parse_think_verdict("no tags")[1] == "no <answer>...</answer> block"


@pytest.mark.parametrize("prompt", ["{prompt}", "a {0} b {x!r} c %s {{}}", "line 1\nline 2 }", "{__class__}"])
def test_unifiedreward_templates_render_prompts_with_braces_verbatim(prompt):
    from rewardkit.judges import load_template

    for name in ("t2i", "2.0", "think", "edit"):
        t = load_template("unifiedreward", name)
        for key in ("pointwise", "pairwise", "instruction_following"):
            if key in t.fields:
                text = t.render(key, prompt=prompt)
                assert prompt in text and "{{" not in text.replace(prompt, "")
        if "quality" in t.fields:  # no placeholder: the JSON example's braces come out single
            assert '{\n\n"reasoning"' in t.render("quality")
