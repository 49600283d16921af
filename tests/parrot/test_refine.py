"""Generate-critique-refine: the decision at the threshold (by hand), the loop on a callable generator with the
scripted critic, and end to end on the tiny SD3 pipeline with a tiny-Qwen rational critic (NaN critiques are
never "good" and never refined)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from rewardkit.parrot.testing import ScriptedTeacher
from rewardkit.refine import decide, refine


def test_decide_at_threshold():
    assert decide({"a": 3.0, "b": None, "c": 3.01}, "x") == "accepted"
    assert decide({"a": 2.99, "b": None}, "better") == "refined"
    assert decide({"a": 2.99, "b": None}, "  ") == "no_refined_request"
    assert decide({"a": None, "b": None}, "x") == "critique_failed"
    assert decide(None, "x") == "critique_failed"
    assert decide({"a": float("nan")}, "x") == "refined"  # NaN never counts as good
    assert decide({"a": 2.5, "b": 3.5}, "x", threshold=2.5) == "accepted"
    assert decide({"a": 3.5, "b": None}, "x", threshold=4.0) == "refined"


class BrightnessGenerator:
    """Draws a grey image whose brightness grows with the prompt's length (refined prompts are longer)."""

    def __init__(self, factor=6):
        self.calls = []
        self.factor = factor

    def __call__(self, prompts, *, sources=None, seed=None):
        self.calls.append(list(prompts))
        return [Image.fromarray(np.full((32, 32, 3), min(255, self.factor * len(p)), dtype=np.uint8), "RGB") for p in prompts]


def test_refine_loop_scripted_critic():
    from rewardkit.rewards.rational import RationalReward

    critic = RationalReward(judge=ScriptedTeacher())
    gen = BrightnessGenerator()
    prompts = ["a cat", "a very long and detailed prompt about a bright sunny beach"]  # 5 chars -> dark; 58 -> q 4
    res = refine(gen, prompts, critic=critic)
    r0, r1 = res.records
    assert r1["status"] == "accepted" and r1["refined_prompts"] == [] and res.images_after[1] is res.images_before[1]
    assert r0["status"] == "refined" and r0["refined_prompts"] == ["a cat, highly detailed, well lit"]
    assert gen.calls == [prompts, ["a cat, highly detailed, well lit"]]  # one batch per round
    assert r0["dimensions_before"]["text_faithfulness"] < 3.0 and r0["score_after"] > r0["score_before"]
    # two rounds: the refined prompt is refined again while still below the threshold
    res2 = refine(BrightnessGenerator(factor=3), ["a cat"], critic=critic, iterations=2)
    assert res2.records[0]["iterations"] == 2 and len(res2.records[0]["refined_prompts"]) == 2
    with pytest.raises(ValueError):
        refine(gen, prompts, critic=critic, iterations=0)


@pytest.mark.slow
def test_refine_tiny_sd3_and_tiny_qwen_critic(tiny_qwen2_5_vl_dir):
    pytest.importorskip("diffusers")
    import rewardkit
    from rewardkit.refine import DiffusersGenerator
    from rewardkit.testing import tiny_sd3_pipeline

    gen = DiffusersGenerator(tiny_sd3_pipeline(with_t5=False), num_inference_steps=2, height=32, width=32,
                             guidance_scale=1.0)
    critic = rewardkit.load_reward("rational", model=str(tiny_qwen2_5_vl_dir), device="cpu", max_new_tokens=8)
    res = refine(gen, ["a cat", "a dog"], critic=critic)
    assert [r["status"] for r in res.records] == ["critique_failed", "critique_failed"]
    assert all(r["score_before"] is None and r["error_before"] for r in res.records)
    assert len(res.images_before) == 2 and res.images_after[0] is res.images_before[0]


def test_refine_cli_callable_generator(tmp_path, monkeypatch, tiny_qwen2_5_vl_dir):
    import json

    from rewardkit.cli import main

    (tmp_path / "gcr_gen.py").write_text(
        "import numpy as np\nfrom PIL import Image\n"
        "def generate(prompts, sources=None, seed=None, level=9):\n"
        "    return [Image.fromarray(np.full((32, 32, 3), int(level), dtype=np.uint8), 'RGB') for p in prompts]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["refine", "--generator", "gcr_gen:generate", "--gen", "level=40", "--prompt", "a cat", "--prompt", "a dog",
               "--critic-model", str(tiny_qwen2_5_vl_dir), "--device", "cpu", "--set", "max_new_tokens=6",
               "-o", str(tmp_path / "out")])
    assert rc == 3  # no image could be critiqued (the tiny critic writes no parsable critique): not a success
    recs = [json.loads(x) for x in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recs] == ["critique_failed"] * 2 and recs[0]["error_before"]
    assert (tmp_path / "out" / "before" / "00001.png").is_file() and (tmp_path / "out" / "after" / "00000.png").is_file()


def test_after_image_is_critiqued_against_the_users_prompt_not_the_refined_one():
    """Before and after answer the same question. The user asks for text ('a sign saying "OPEN"'); the
    critic's refined request drops the quotes. Against the refined request the after-critique would have no
    text-rendering dimension (N/A) and a different mean; against the user's request it keeps it (scripted:
    2 when the request quotes text). The critic is asked with the user's prompt both times."""
    from rewardkit.rewards.rational import RationalReward

    class Teacher(ScriptedTeacher):
        def _pointwise(self, im, request, edit):
            return super()._pointwise(im, request, edit).replace(
                f"Refined Request: {request}, highly detailed, well lit",
                "Refined Request: a bright shop front with a large sign over the door, crisp daylight")

    asked = []

    class Critic(RationalReward):
        def __call__(self, images, prompts, **kw):
            asked.append(list(prompts))
            return super().__call__(images, prompts, **kw)

    user = 'a sign saying "OPEN"'
    res = refine(BrightnessGenerator(factor=5), [user], critic=Critic(judge=Teacher()))
    r = res.records[0]
    assert r["status"] == "refined" and r["refined_prompts"] == [
        "a bright shop front with a large sign over the door, crisp daylight"]
    assert asked == [[user], [user]] and res.info["critiqued_against"] == "user_prompt"
    # by hand: after = 81 chars * 5 = 255 (capped) -> q = 4; text rendering 2 (quoted text asked for)
    assert r["dimensions_after"] == {"text_faithfulness": 4.0, "image_faithfulness": None,
                                     "physical_quality": 4.0, "text_rendering": 2.0}
    assert r["score_after"] == pytest.approx(((4 + 4 + 2) / 3 - 1) / 3)


def test_refine_cli_exits_3_when_a_regenerated_image_could_not_be_critiqued(tmp_path, monkeypatch, capsys):
    """The first critique parses (status "refined"), the critique of the regenerated image does not: that image
    was not critiqued (score_after NaN, error_after set), so the command is not a success (exit 3), as for
    ``critique_failed`` (it exited 0: only the first critique's status was counted)."""
    import json

    import rewardkit
    from rewardkit.cli import main
    from rewardkit.rewards.rational import RationalReward

    class Teacher(ScriptedTeacher):
        calls = 0

        def generate(self, conversations, **kw):
            Teacher.calls += 1
            out = super().generate(conversations, **kw)
            return out if Teacher.calls == 1 else [["no critique here"] * len(o) for o in out]

    (tmp_path / "gcr_gen2.py").write_text(
        "import numpy as np\nfrom PIL import Image\n"
        "def generate(prompts, sources=None, seed=None):\n"
        "    return [Image.fromarray(np.full((32, 32, 3), 30, dtype=np.uint8), 'RGB') for p in prompts]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(rewardkit, "load_reward", lambda name, **kw: RationalReward(judge=Teacher()))
    rc = main(["refine", "--generator", "gcr_gen2:generate", "--prompt", "a cat", "-o", str(tmp_path / "out")])
    recs = [json.loads(x) for x in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert recs[0]["status"] == "refined" and recs[0]["error_after"] and recs[0]["score_after"] is None
    assert rc == 3


def test_refine_defaults_threshold_three_and_one_iteration():
    """docs/parrot.md: regenerate when an applicable dimension is below 3.0 (`threshold=`); one iteration."""
    from rewardkit.parrot.testing import ScriptedTeacher
    from rewardkit.refine import refine
    from rewardkit.rewards.rational import RationalReward

    critic = RationalReward(judge=ScriptedTeacher())
    # "a cat" at brightness 25 * 5 = 125: q = round(2 * (1 + 3 * 125 / 255)) / 2 = 2.5 on both applicable dims
    res = refine(BrightnessGenerator(factor=25), ["a cat"], critic=critic)
    assert res.records[0]["status"] == "refined"                      # 2.5 < 3.0
    res = refine(BrightnessGenerator(factor=25), ["a cat"], critic=critic, threshold=2.5)
    assert res.records[0]["status"] == "accepted"                     # 2.5 >= 2.5
    # factor 3: "a cat" -> q 1.0; the refined request (32 characters, brightness 96) -> q 2.0, still below 3.0,
    # yet the default runs one iteration only
    res = refine(BrightnessGenerator(factor=3), ["a cat"], critic=critic)
    assert res.records[0]["iterations"] == 1 and len(res.records[0]["refined_prompts"]) == 1
