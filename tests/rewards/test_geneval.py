"""The ``geneval`` reward on its tiny instance: metadata errors are NaN with the reason, the per-sample details
carry GenEval's record keys, the three forms, the colour path (clip_benchmark's zero-shot recipe written out
here), and registry / flow_grpo-style calls."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from rewardkit.rewards import geneval_rules as rules  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402

RECORD_KEYS = {"tag", "prompt", "correct", "reason", "metadata", "details", "strict_correct", "score",
               "strict_reason", "colors"}


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    from rewardkit.rewards.geneval import GenEval

    return GenEval.tiny(str(tmp_path_factory.mktemp("geneval")))


@pytest.fixture(scope="module")
def images():
    return random_images(2, seed=5, sizes=[(64, 48)])


def _single(name):
    return {"tag": "single_object", "include": [{"class": name, "count": 1}], "prompt": f"a photo of a {name}"}


def test_missing_or_malformed_metadata_is_nan_with_the_reason_not_zero(reward, images):
    out = reward(images + images[:1], ["a", "b", "c"],
                 metadata=[{}, {"tag": "counting", "include": [{"class": "unicorn", "count": 2}]}, _single("cat")])
    assert out.valid.tolist() == [False, False, True]
    assert "needs the prompt's GenEval metadata" in out.errors[0]
    assert "unicorn" in out.errors[1] and "80 object names" in out.errors[1]
    assert torch.isnan(out.scores[:2]).all() and out.details[0] is None


def test_details_are_genevals_record_and_forms_pick_a_dimension(reward, images):
    out = reward(images, ["x", "y"], metadata=[_single("person"), _single("airplane")])
    for i, d in enumerate(out.details):
        assert set(d) == RECORD_KEYS
        assert json.loads(d["metadata"]) == [_single("person"), _single("airplane")][i]
        kept = json.loads(d["details"])
        assert all(name in rules.OBJECT_NAMES and all(len(b) == 5 for b in boxes) for name, boxes in kept.items())
        name = json.loads(d["metadata"])["include"][0]["class"]
        assert d["correct"] == (len(kept.get(name, [])) >= 1)
        assert d["correct"] or d["reason"] == f"expected {name}>=1, found 0"
        assert float(out.dimensions["accuracy"][i]) == float(d["correct"])
        assert float(out.dimensions["strict_accuracy"][i]) == float(d["strict_correct"])
        assert float(out.dimensions["score"][i]) == pytest.approx(d["score"])
    assert torch.equal(out.scores, out.dimensions["accuracy"])


def test_colour_verdicts_follow_clip_zero_shot(reward, images):
    """Colour asked of every class the detector kept: the verdict and the reported colour come from CLIP
    zero-shot as clip_benchmark computes it (templates embedded, normalised, averaged, normalised; argmax of the
    image embedding against the 10 colours), written out here on the HF CLIP model."""
    from PIL import Image

    from rewardkit.models.zoo import openai_clip_pixels
    from rewardkit.rewards._geneval_detect import detect, per_class

    first = reward(images[:1], ["x"], metadata=[_single("person")])
    kept = json.loads(first.details[0]["details"])
    if not kept:
        pytest.skip("the tiny detector kept nothing on this image")
    name = next(iter(kept))
    md = {"tag": "colors", "include": [{"class": name, "count": 1, "color": "red"}], "prompt": "p"}
    out = reward(images[:1], ["x"], metadata=[md])
    color = out.details[0]["colors"][name][0]
    assert out.details[0]["correct"] == (color == "red")
    # by hand: the most confident kept object of that class, its mask over #999, its box
    res = detect(reward.detector, images[:1], scale=tuple(reward.config.img_scale))[0]
    boxes, rows = per_class(res, 80)
    c = rules.OBJECT_NAMES.index(name)
    r = int(boxes[c][:, 4].argmax())
    mask = res["masks"][rows[c][r]].numpy()
    crop = Image.composite(images[0], Image.new("RGB", images[0].size, "#999"),
                           Image.fromarray(mask)).crop(tuple(int(round(v)) for v in boxes[c][r][:4]))
    model, tok = reward.clip.model, reward.clip.processor.tokenizer
    with torch.no_grad():
        weights = []
        for col in rules.COLORS:
            texts = [f"a photo of a {col} {name}", f"a photo of a {col}-colored {name}", f"a photo of a {col} object"]
            enc = tok(texts, padding=True, return_tensors="pt")
            t = model.get_text_features(**enc)
            t = getattr(t, "pooler_output", t)
            t = torch.nn.functional.normalize(t, dim=-1).mean(0)
            weights.append(t / t.norm())
        img = model.get_image_features(pixel_values=openai_clip_pixels([crop], model.config.vision_config.image_size))
        img = torch.nn.functional.normalize(getattr(img, "pooler_output", img), dim=-1)
    assert rules.COLORS[int((100 * img @ torch.stack(weights, 1)).argmax())] == color


def test_loaded_by_name_with_flow_grpo_metadata(reward, images):
    from rewardkit.registry import get_reward_class, resolve_name

    assert resolve_name("geneval") == "geneval" and get_reward_class("geneval") is type(reward)
    md = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                         {"class": "dog", "count": 1, "position": ["right of", 0]}],
          "prompt": "a photo of a dog right of a teddy bear"}
    x = torch.stack([torch.from_numpy(__import__("numpy").asarray(im).copy()).permute(2, 0, 1) for im in images])
    out = reward(x.float() / 255.0, [md["prompt"]] * 2, metadata=[md, md])
    assert out.valid.all() and set(out.dimensions) == {"accuracy", "strict_accuracy", "score"}


def test_bad_options_are_refused(tmp_path):
    from rewardkit.rewards.geneval import GenEval

    with pytest.raises(ValueError, match="form must be"):
        GenEval(model=str(tmp_path), form="strict")
    with pytest.raises(ValueError, match="needs model"):
        GenEval()
