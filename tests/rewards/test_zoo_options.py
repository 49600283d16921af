"""Documented options of docs/zoo.md that had no test of their own: names and aliases in ``ls``, ImageReward's
``normalize``, aesthetic ignoring the prompt, the converted directory's manifest and dtype, hpsv3's sigma
dimensions, editreward's single source. Expected values are computed in the test, by hand or by a few lines of
reference."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rewardkit.testing import random_images  # noqa: E402


# ============================================================================================== zoo
ZOO_ALIASES = {"hps": "hpsv2", "hpsv2.1": "hpsv2", "laion-aesthetic": "aesthetic", "image-reward": "imagereward",
               "edit-reward": "editreward", "unified-reward": "unifiedreward", "vqa-score": "vqascore"}


def test_zoo_names_aliases_and_ls(capsys):
    from rewardkit import registry
    from rewardkit.cli import main

    for alias, name in ZOO_ALIASES.items():
        assert registry.resolve_name(alias) == name, alias
    assert main(["ls"]) == 0
    listed = capsys.readouterr().out
    for name in ("hpsv2", "aesthetic", "imagereward", "hpsv3", "editreward", "unifiedreward", "vqascore"):
        assert name in listed, name


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def test_imagereward_normalize_option(zoo_dir):
    from rewardkit.rewards.imagereward import ImageReward

    reward = ImageReward.tiny(str(zoo_dir))
    ims = random_images(3, seed=7)
    prompts = ["a cat", "a red car on a road", "two birds"]
    out = reward(ims, prompts)
    raw = out.dimensions["raw"]
    torch.testing.assert_close(out.scores, (raw - 0.16717) / 1.03334, atol=1e-4, rtol=1e-4)
    plain = ImageReward(model=reward.config.model, device="cpu", normalize=False)(ims, prompts)
    torch.testing.assert_close(plain.scores, raw, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain.dimensions["raw"], raw, atol=1e-5, rtol=1e-5)
    assert out.info["model"] == reward.config.model    # the model directory is recorded


def test_aesthetic_ignores_the_prompt(zoo_dir):
    from rewardkit.rewards.aesthetic import Aesthetic

    reward = Aesthetic.tiny(str(zoo_dir))
    ims = random_images(3, seed=8)
    alone = reward(ims).scores
    assert torch.equal(reward(ims, "a cat").scores, alone)
    assert torch.equal(reward(ims, ["x", "a long prompt about a dog", ""]).scores, alone)
    assert len(set(alone.tolist())) == 3            # not a constant
    assert reward.tasks == frozenset({"t2i"}) and reward(ims).info["model"] == reward.config.model


def test_converted_directory_manifest_and_dtype(zoo_dir):
    from rewardkit.convert import convert
    from rewardkit.rewards.hpsv2 import HPSv2
    from safetensors.torch import load_file

    reward = HPSv2.tiny(str(zoo_dir))
    out = Path(reward.config.model)
    src = zoo_dir / "HPS_v2.1_compressed.pt"
    man = json.loads((out / "rewardkit.json").read_text())
    assert man["reward"] == "hpsv2"
    assert man["source"] == {"file": src.name, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}
    weights = [load_file(p) for p in out.glob("*.safetensors")]
    assert weights and all(v.dtype == torch.float16 for w in weights for v in w.values() if v.is_floating_point())
    f32 = convert("hpsv2", src, zoo_dir / "hpsv2-f32", tokenizer=str(zoo_dir / "tiny-clip-tokenizer"),
                  vision_heads=2, text_heads=2, dtype="float32")
    weights = [load_file(p) for p in Path(f32).glob("*.safetensors")]
    assert weights and all(v.dtype == torch.float32 for w in weights for v in w.values() if v.is_floating_point())
    # scale=100 is the leaderboard's x100 of the same cosine; compare() is sigmoid(s_a - s_b)
    ims = random_images(4, seed=9)
    base = reward(ims, "a cat")
    hundred = HPSv2(model=str(out), device="cpu", scale=100)(ims, "a cat")
    torch.testing.assert_close(hundred.scores, 100 * base.scores, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(hundred.dimensions["cosine"], base.dimensions["cosine"])
    pair = reward.compare(ims[:2], ims[2:], "a cat")
    torch.testing.assert_close(pair.prob_a, torch.sigmoid(base.scores[:2] - base.scores[2:]), atol=1e-6, rtol=1e-5)


def test_hpsv3_sigma_and_log_sigma_dimensions(zoo_dir):
    """docs/zoo.md: HPSv3's `[:, 1]` (log sigma) is `out.dimensions["sigma"].log()` or `["log_sigma"]`."""
    from rewardkit.rewards.hpsv3 import HPSv3

    reward = HPSv3.tiny(str(zoo_dir))
    assert reward.dimensions == ("sigma", "log_sigma") and reward.tasks == frozenset({"t2i"})
    out = reward(random_images(2, sizes=[(40, 40), (64, 36)], seed=13), ["a cat", "a red car"])
    torch.testing.assert_close(out.dimensions["sigma"], out.dimensions["log_sigma"].exp())
    assert out.info["model"] == reward.config.model and out.info["reward"] == "hpsv3"


def test_editreward_single_source_only_and_its_dimensions(zoo_dir):
    """zoo.md: single-source edits only; dimensions instruction_following, visual_quality, log_sigma; the score
    is the mean of the two heads' mu."""
    from rewardkit.rewards.editreward import EditReward

    reward = EditReward.tiny(str(zoo_dir))
    ims = random_images(4, sizes=[(40, 40), (64, 36)], seed=15)
    out = reward(ims[:2], "add a hat", sources=[[ims[2]], [ims[3]]])
    assert set(out.dimensions) == {"instruction_following", "visual_quality", "log_sigma"}
    torch.testing.assert_close(out.scores, (out.dimensions["instruction_following"] + out.dimensions["visual_quality"]) / 2)
    two = reward(ims[:1], "add a hat", sources=[[ims[2], ims[3]]], on_error="nan")
    assert not two.valid[0] and "takes one" in two.errors[0]
