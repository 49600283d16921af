"""`rewardkit soup` on rewardkit's own LoRA preference models (two runs of the tiny recipe): LoRA deltas
averaged exactly, the reward token's trained row and the head averaged, the soup loads as `preference` and
scores; pickle-only inputs refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("trl")

from rewardkit.cli import main  # noqa: E402
from rewardkit.compose.soup import read_adapter, soup_deltas  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "arena_rm" / "tiny.yaml"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from rewardkit.config import load_config
    from rewardkit.train.trainer import PreferenceTrainConfig, train_preference

    root = tmp_path_factory.mktemp("soup-pref")
    dirs = []
    for seed in (0, 1):
        cfg = load_config(PreferenceTrainConfig, RECIPE, [
            f"output_dir={root}/run{seed}", f"seed={seed}", "lora.enabled=true", "lora.r=4", "max_steps=2",
            "save_every=0", "progress=false", "data.synthetic_size=16", "eval_batch_size=16"])
        train_preference(cfg)
        dirs.append(root / f"run{seed}" / "model")
    return dirs


def _load(path):
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.slow
def test_soup_of_two_tiny_lora_preference_models(two_runs, tmp_path, capsys):
    a, b = two_runs
    out = tmp_path / "soup"
    assert main(["soup", str(a), str(b), "--weights", "0.25", "0.75", "--output", str(out)]) == 0
    assert "preference model" in capsys.readouterr().err
    # LoRA: exact weighted delta average
    ad_a, ad_b, ad_s = (read_adapter(p / "adapter") for p in (a, b, out))
    want, got = soup_deltas([ad_a, ad_b], [0.25, 0.75]), soup_deltas([ad_s], [1.0])
    assert set(want) == set(got) and len(want) > 0
    for m in want:
        torch.testing.assert_close(got[m], want[m], atol=1e-6, rtol=1e-5)
    # the reward token's row: the weighted average of the two trained rows (values, which peft calls "delta")
    (tok,) = ad_s.tokens
    assert not torch.equal(ad_a.tokens[tok], ad_b.tokens[tok])
    torch.testing.assert_close(ad_s.tokens[tok], 0.25 * ad_a.tokens[tok] + 0.75 * ad_b.tokens[tok])
    # the head: parameter average
    ha, hb, hs = _load(a / "head.safetensors"), _load(b / "head.safetensors"), _load(out / "head.safetensors")
    for k in ha:
        torch.testing.assert_close(hs[k], 0.25 * ha[k] + 0.75 * hb[k])
    assert not (out / "calibration.json").exists() and json.loads((out / "soup.json").read_text())["weights"] == [0.25, 0.75]

    # the soup is a preference model: it loads and scores, and its linear head on the souped backbone is the
    # head average applied to the soup's hidden state
    from rewardkit import load_reward
    from rewardkit.testing import random_images

    reward = load_reward("preference", model=str(out), device="cpu")
    res = reward(random_images(2, size=32), ["a bright image", "a dark image"])
    assert bool(res.valid.all()) and torch.isfinite(res.scores).all()
    assert main(["score", "-r", "preference", "-m", str(out), str(Path(__file__).resolve().parents[2] / "examples"
                 / "images" / "t2i_red_apple.png"), "-p", "a red apple", "--no-progress"]) == 0

    # weights that do not sum to 1: refused for the non-LoRA tensors (they need the base to be deltas)
    assert main(["soup", str(a), str(b), "--weights", "1", "1", "--output", str(tmp_path / "bad")]) == 2
    assert "sum to 1" in capsys.readouterr().err
    # a folder soup did not write is never replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["soup", str(a), str(b), "--output", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


@pytest.mark.slow
def test_soup_refuses_pickle_only_inputs(two_runs, tmp_path, capsys):
    a, _ = two_runs
    pick = tmp_path / "pickled"
    shutil.copytree(a / "adapter", pick)
    (pick / "adapter_model.safetensors").rename(pick / "adapter_model.bin")
    assert main(["soup", str(a / "adapter"), str(pick), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "adapter_model.bin" in err and "never unpickles" in err
    model = tmp_path / "pickled-model"
    shutil.copytree(a, model)
    (model / "head.safetensors").rename(model / "head.bin")
    assert main(["soup", str(a), str(model), "--output", str(tmp_path / "o2")]) == 2
    assert "never unpickles" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2").exists()
