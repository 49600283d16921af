"""The examples in examples/ run as documented."""

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_runs(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["quickstart.py"])
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "'valid': False" in out and "not a recognised image format" in out
    assert "P(image 0 preferred over image 1) =" in out


def test_reward_finetune_sd3_runs(capsys, tmp_path):
    """ReFL / DRaFT-1 on the tiny SD3 pipeline: gradients from pickscore's score_tensor through the last
    denoising step and the VAE into LoRA adapters; the seeded run raises the evaluation reward."""
    import re

    import pytest

    pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    ns = runpy.run_path(str(EXAMPLES / "reward_finetune_sd3.py"), run_name="example")
    result = ns["main"](["--train-steps", "8", "--output", str(tmp_path / "lora")])
    out = capsys.readouterr().out
    assert len(re.findall(r"^step \d+/8: reward -?\d+\.\d+$", out, flags=re.M)) == 8
    assert result["after"] > result["before"], result
    assert (tmp_path / "lora" / "lora.safetensors").is_file()
