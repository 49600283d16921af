"""Calibration statistics for any reward: `rewardkit calibrate --reward`, and composite axes reading them."""

from __future__ import annotations

import json

import pytest
import torch

from rewardkit import load_reward
from rewardkit.calibration import apply_calibration, calibration_stats, load_calibration
from rewardkit.cli import main
from rewardkit.errors import ConfigError
from rewardkit.testing import random_images

PROMPTS = ["a red apple", "two birds on a branch", "a green bowl", "a city at night", "a cat", "a blue car"]


def test_stats_by_hand():
    st = calibration_stats(torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan")]), quantiles=(0.5,))
    assert st["n"] == 4 and st["mean"] == 2.5 and st["std"] == pytest.approx(1.118033988, rel=1e-7)
    assert st["min"] == 1.0 and st["max"] == 4.0 and st["quantiles"] == {"0.5": 2.5}
    z = apply_calibration(torch.tensor([2.5, 3.618033988]), st, "calibration")
    assert torch.allclose(z, torch.tensor([0.0, 1.0]), atol=1e-6)


@pytest.fixture()
def items(tmp_path):
    for i, im in enumerate(random_images(6, sizes=[(32, 32), (40, 48)])):
        im.save(tmp_path / f"{i}.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    rows = [{"prompt": p, "image": f"{i}.png"} for i, p in enumerate(PROMPTS)] + [{"prompt": "x", "image": "bad.png"}]
    f = tmp_path / "calib.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_calibrate_any_reward(tiny_clip_dir, items, tmp_path, capsys):
    out = tmp_path / "stats" / "clip.json"
    assert main(["calibrate", "--reward", "clipscore", "--model", str(tiny_clip_dir), "--data", str(items),
                 "--set", "convention=cosine", "-o", str(out), "--batch-size", "4", "--no-progress"]) == 3
    stats = load_calibration(out)
    reward = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    direct = reward([str(items.parent / f"{i}.png") for i in range(6)], PROMPTS).scores
    assert stats["n"] == 6 and stats["n_invalid"] == 1  # the corrupt file is one invalid sample, not a crash
    assert stats["mean"] == pytest.approx(float(direct.double().mean()), abs=1e-6)
    assert stats["std"] == pytest.approx(float(direct.double().std(unbiased=False)), abs=1e-6)
    assert stats["reward"] == "clipscore" and stats["config"]["convention"] == "cosine"
    assert "1 of 7 images invalid" in capsys.readouterr().err
    assert main(["calibrate", "--reward", "clipscore", "--data", str(items)]) == 2
    assert "needs --output" in capsys.readouterr().err


def test_composite_axis_reads_calibration_file(tiny_clip_dir, tmp_path):
    from rewardkit.compose.composite import Composite

    stats = tmp_path / "pick.json"
    stats.write_text(json.dumps({"mean": 2.0, "std": 4.0, "n": 10}))
    pick = load_reward("pickscore", model=str(tiny_clip_dir))
    comp = Composite(axes=[{"name": "preference", "calibration": str(stats)}], normalize="fixed",
                     rewards={"preference": pick})
    imgs = random_images(3)
    raw = pick(imgs, PROMPTS[:3]).scores
    torch.testing.assert_close(comp(imgs, PROMPTS[:3]).scores, (raw - 2.0) / 4.0)
    with pytest.raises(ConfigError, match="not both"):
        Composite(axes=[{"name": "preference", "calibration": str(stats), "mean": 1, "std": 1}],
                  normalize="fixed", rewards={"preference": pick})
    with pytest.raises(ConfigError, match="calibration file not found"):
        Composite(axes=[{"name": "preference", "calibration": str(tmp_path / "nope.json")}],
                  normalize="fixed", rewards={"preference": pick})
