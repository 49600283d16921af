"""unifiedreward and vqascore on the judge engine: strict parsing (table-driven), the exact published prompts,
and the score arithmetic, with a scripted backend; vqascore against a direct forward of a tiny judge."""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.judges import JudgeBackend
from rewardkit.testing import random_images


class Scripted(JudgeBackend):
    """Returns canned answers / probabilities and records the conversations it was given."""

    kind = "scripted"

    def __init__(self, answers=(), probs=None):
        self.answers, self.probs, self.seen, self.choices = list(answers), probs, [], None

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        self.seen.extend(conversations)
        out = [[self.answers.pop(0)] for _ in conversations]
        return out

    def choice_probs(self, conversations, choices):
        self.seen.extend(conversations)
        self.choices = list(choices)
        rows, self.probs = self.probs[:len(conversations)], self.probs[len(conversations):]
        return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("text,want", [
    ("bird (object): 1\nFinal Score: 4", 4.0),
    ("Final Score: 3.5", 3.5),
    ("Final Score: **5**", 5.0),
    ("final score: 2.", 2.0),
    ("Final Score: 4/5\n", 4.0),
    ("Final Score: 1\nFinal Score: 1", 1.0),
    ("Final Score:\t5  \nThanks", 5.0),
])
def test_parse_final_score_accepts(text, want):
    from rewardkit.rewards.unifiedreward import parse_final_score

    assert parse_final_score(text) == (want, None)


@pytest.mark.parametrize("text,why", [
    ("", "empty"), (None, "empty"), ("   ", "empty"),
    ("The image is great. Score: 4", "no 'Final Score:'"),
    ("Final Score: five", "malformed"),
    ("Final Score: 3-4", "malformed"),
    ("Final Score: 4 out of 5", "malformed"),
    ("Final Score: 1e1", "malformed"),
    ("Final Score: nan", "malformed"),
    ("Final Score: -1", "malformed"),
    ("Final Score: 0", "outside"),
    ("Final Score: 6", "outside"),
    ("Final Score: 5.01", "outside"),
    ("Final Score: 8/10", "out of 10"),
    ("Final Score: 3\n... on reflection, Final Score: 4", "contradictory"),
    ("Final Score:", "malformed"),
])
def test_parse_final_score_refuses(text, why):
    from rewardkit.rewards.unifiedreward import parse_final_score

    v, reason = parse_final_score(text)
    assert v is None and why in reason


@pytest.mark.parametrize("text,want", [
    ("Image 1 is better.", 1.0), ("After comparing, Image 2 is better than Image 1.", 0.0),
    ("Both images are equally good.", 0.5), ("image 1 is better", 1.0),
    ("Image 1 is better. Indeed Image 1 is better.", 1.0),
    ("", None), ("I prefer the first one.", None), ("Image 1 is better. No wait, Image 2 is better.", None),
    ("Both images are equally good, but Image 2 is better.", None), (None, None),
])
def test_parse_pair_verdict(text, want):
    from rewardkit.rewards.unifiedreward import parse_pair_verdict

    v, reason = parse_pair_verdict(text)
    assert v == want and ((reason is None) == (want is not None))


def test_unifiedreward_pointwise_and_pairwise():
    from rewardkit.judges import load_template
    from rewardkit.rewards.unifiedreward import UnifiedReward

    ims = random_images(4, sizes=[(32, 32), (40, 24)])
    judge = Scripted(["a (object): 1\nFinal Score: 4", "Final Score: 9", "no idea", "Final Score: 2.5"])
    r = UnifiedReward(judge=judge)
    out = r(ims, ["a cat", "a dog", "a car", "a bowl"])
    assert out.valid.tolist() == [True, False, False, True]
    assert out.scores[0] == 4 and out.scores[3] == 2.5 and math.isnan(out.scores[1])
    assert "outside [1, 5]" in out.errors[1] and "no 'Final Score:'" in out.errors[2]
    assert out.rationales[2] == "no idea"
    conv = judge.seen[0]
    text = load_template("unifiedreward", "t2i").render("pointwise", prompt="a cat")
    assert conv == [{"role": "user", "content": [{"type": "image", "image": conv[0]["content"][0]["image"]},
                                                 {"type": "text", "text": text}]}]
    assert text.endswith("after 'Final Score:'.\nYour task is provided as follows:\nText Caption: [a cat]")
    # pairwise in both orders: (a,b) then (b,a); P(a) = (v_ab + 1 - v_ba) / 2
    judge.answers = ["Image 1 is better.", "Image 2 is better.",          # consistent: a wins -> 1.0
                     "Image 1 is better.", "Image 1 is better.",          # position bias -> 0.5
                     "Both images are equally good.", "Image 1 is better.",  # 0.5 and b first wins -> 0.25
                     "Image 1 is better.", "garbage"]                     # swapped order unreadable -> NaN
    judge.seen.clear()
    cmp = r.compare(ims, ims[::-1], "a cat")
    assert cmp.prob_a[:3].tolist() == [1.0, 0.5, 0.25] and not cmp.valid[3] and "swapped order" in cmp.errors[3]
    first = judge.seen[0][0]["content"]
    assert first[0]["image"] is not None and "Image 2 is better." in first[2]["text"] and len(judge.seen) == 8
    assert r.compare_is_symmetric
    one = UnifiedReward(judge=Scripted(["Image 2 is better."]), both_orders=False)
    assert one.compare(ims[:1], ims[1:2], "x").prob_a.tolist() == [0.0] and not one.compare_is_symmetric


def test_vqascore_scripted():
    from rewardkit.rewards.vqascore import VQAScore

    judge = Scripted(probs=[[0.8, 0.2], [float("nan"), float("nan")], [0.1, 0.9]])
    r = VQAScore(judge=judge, probability="yes_no")  # a backend with renormalised choice_probs only
    out = r(random_images(3), ["a red apple", "a cat", "two birds"])
    assert judge.choices == ["Yes", "No"]
    assert out.scores[0].item() == pytest.approx(0.8) and out.scores[2].item() == pytest.approx(0.1)
    assert not out.valid[1] and "no probability" in out.errors[1]
    assert judge.seen[0][0]["content"][1]["text"] == 'Does this figure show "a red apple"? Please answer Yes or No.'


def test_vqascore_matches_a_direct_forward(tiny_qwen2_5_vl_dir):
    """probability="yes_no": P(Yes)/(P(Yes)+P(No)) at the first answer position of the same tiny model, by hand
    (the full-vocabulary default: tests/judges/test_choice_probs.py)."""
    import transformers

    from rewardkit.models.vlm import load_processor
    from rewardkit.rewards.vqascore import VQAScore

    r = VQAScore(judge=f"transformers:{tiny_qwen2_5_vl_dir}", judge_kwargs={"device": "cpu"}, probability="yes_no")
    ims = random_images(2, sizes=[(40, 40), (56, 28)], seed=3)
    prompts = ["a red apple", "two birds"]
    got = r(ims, prompts)
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tiny_qwen2_5_vl_dir)).eval()
    proc = load_processor(str(tiny_qwen2_5_vl_dir))
    yes, no = (proc.tokenizer.encode(t, add_special_tokens=False)[0] for t in ("Yes", "No"))
    for i, (im, p) in enumerate(zip(ims, prompts)):
        msgs = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": f'Does this figure show "{p}"? Please answer Yes or No.'}]}]
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        enc = proc(text=[text], images=[im], return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0, -1].float()
        want = torch.softmax(logits[[yes, no]], 0)[0]
        assert got.scores[i].item() == pytest.approx(want.item(), abs=1e-4)


class _Deterministic(JudgeBackend):
    """Answers from the pixels: pointwise 'Final Score' = 1 + 4 * brightness; pairwise: the brighter image."""

    kind = "deterministic"

    @staticmethod
    def _b(im) -> float:
        import numpy as np

        return float(np.asarray(im, dtype=np.float32).mean() / 255.0)

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        out = []
        for conv in conversations:
            ims = [c["image"] for c in conv[-1]["content"] if c.get("type") == "image"]
            if len(ims) == 1:
                out.append([f"Final Score: {1 + 4 * self._b(ims[0]):.3f}"])
            else:
                out.append(["Image 1 is better." if self._b(ims[0]) >= self._b(ims[1]) else "Image 2 is better."])
        return out

    def choice_probs(self, conversations, choices):
        raise NotImplementedError


def test_bench_runs_unifiedreward_natively(tmp_path):
    from rewardkit.bench import evaluate
    from rewardkit.bench.synthetic import write_synthetic_benchmarks
    from rewardkit.rewards.unifiedreward import UnifiedReward

    write_synthetic_benchmarks(tmp_path / "data", n_pairs=6, n_groups=2)
    res = evaluate(UnifiedReward(judge=_Deterministic()), ["mmrb2/t2i", "genaibench/t2i"], data_dir=tmp_path / "data",
                   cache_dir=None, n_boot=0, progress=False)
    assert res.reward["mode"] == "pairwise"
    for b in ("mmrb2/t2i", "genaibench/t2i"):
        r = res.benchmarks[b]
        assert r.counts["n_invalid_judgements"] == 0 and r.counts["symmetric_compare"]
        assert 0.0 <= r.metrics[r.primary].value <= 1.0 and r.metrics["order_agreement"].value == 1.0
    scalar = evaluate(UnifiedReward(judge=_Deterministic()), ["mmrb2/t2i"], data_dir=tmp_path / "data",
                      cache_dir=None, n_boot=0, progress=False, mode="scalar")
    assert scalar.benchmarks["mmrb2/t2i"].counts["n_invalid_samples"] == 0


def test_unifiedreward_decoding_defaults():
    """zoo.md: greedy decoding, 512 new tokens (t2i; the 2.0 / edit templates: 4096), compare() asks both orders by
    default."""
    from rewardkit.rewards.unifiedreward import UnifiedRewardConfig

    from rewardkit.rewards.unifiedreward import UnifiedReward

    cfg = UnifiedRewardConfig()
    assert cfg.max_new_tokens is None and cfg.reencode == "auto" and cfg.both_orders is True  # None: the template's

    class Recording(Scripted):
        def generate(self, conversations, **kw):
            self.kw = kw
            return super().generate(conversations, **kw)

    judge = Recording(["Final Score: 4"])
    UnifiedReward(judge=judge)(random_images(1), "a cat")
    assert judge.kw["temperature"] == 0.0 and judge.kw["max_new_tokens"] == 512
