"""Issue 9, item 6: safetensors only on every load path. Each path is walked with a directory whose file
for that path exists only in a pickle-based format; every one must end in a clear error, and nothing may
reach ``torch.load`` (peft's fallback for ``adapter_model.bin`` included)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rewardkit import load_reward
from rewardkit.models.preference import HEAD_NAME, PreferenceModel
from rewardkit.models.vlm import PickledWeightsError

pytest.importorskip("peft")


def _pickle_instead(st_file: Path, pickled_name: str) -> None:
    """Replace a safetensors file by a torch.save pickle of the same tensors (what old checkpoints have)."""
    from safetensors.torch import load_file

    torch.save(load_file(str(st_file)), st_file.parent / pickled_name)
    st_file.unlink()


@pytest.fixture(autouse=True)
def no_unpickling(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("torch.load was called: rewardkit must never unpickle what it loads")

    monkeypatch.setattr(torch, "load", refuse)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("st-only")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        full = PreferenceModel.from_backbone("tiny:qwen2_5_vl").save_pretrained(root / "full")
        lora = PreferenceModel.from_backbone("tiny:qwen2_5_vl")
        lora.configure_trainable(lora={"r": 2, "alpha": 4})
        lora = lora.save_pretrained(root / "lora")
    return {"full": full, "lora": lora}


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / src.name))


def test_intact_models_load(saved):
    for d in saved.values():
        assert isinstance(PreferenceModel.from_pretrained(d), PreferenceModel)


def test_backbone_checkpoint(tiny_qwen2_5_vl_dir, tmp_path):
    d = _copy(Path(tiny_qwen2_5_vl_dir), tmp_path)
    for f in d.glob("*.safetensors"):
        _pickle_instead(f, "pytorch_model.bin")
    with pytest.raises(PickledWeightsError, match="pytorch_model.bin.*never unpickles"):
        PreferenceModel.from_backbone(str(d))


def test_preference_full_backbone(saved, tmp_path):
    d = _copy(saved["full"], tmp_path)
    for f in (d / "backbone").glob("*.safetensors"):
        _pickle_instead(f, "pytorch_model.bin")
    with pytest.raises(PickledWeightsError, match="never unpickles"):
        load_reward("preference", model=str(d))


def test_preference_lora_adapter_bin_only(saved, tmp_path):
    """peft would torch.load adapter_model.bin when the safetensors file is missing."""
    d = _copy(saved["lora"], tmp_path)
    _pickle_instead(d / "adapter" / "adapter_model.safetensors", "adapter_model.bin")
    with pytest.raises(PickledWeightsError, match="LoRA adapter is only present as adapter_model.bin"):
        load_reward("preference", model=str(d))


def test_preference_head(saved, tmp_path):
    d = _copy(saved["full"], tmp_path)
    _pickle_instead(d / HEAD_NAME, "head.pt")
    with pytest.raises(PickledWeightsError, match="reward head is only present as head.pt"):
        PreferenceModel.from_pretrained(d)


def test_preference_processor_side_file(saved, tmp_path):
    d = _copy(saved["full"], tmp_path)
    (d / "processor" / "tokenizer.json").unlink()
    torch.save({"vocab": {"a": 1}}, d / "processor" / "tokenizer.pkl")
    with pytest.raises(PickledWeightsError, match="processor directory holds pickle-format file.*tokenizer.pkl"):
        PreferenceModel.from_pretrained(d)


def test_clip_checkpoint_and_processor(tiny_clip_dir, tmp_path):
    d = _copy(Path(tiny_clip_dir), tmp_path)
    torch.save({"x": torch.zeros(1)}, d / "preprocessor.pkl")
    with pytest.raises(PickledWeightsError, match="preprocessor.pkl"):
        load_reward("clipscore", model=str(d), device="cpu")
    (d / "preprocessor.pkl").unlink()
    for f in d.glob("*.safetensors"):
        _pickle_instead(f, "pytorch_model.bin")
    with pytest.raises(PickledWeightsError, match="never unpickles"):
        load_reward("clipscore", model=str(d), device="cpu")


def test_soup_input_adapter(saved, tmp_path):
    """Soup inputs (rewardkit/compose/soup.py) already refuse a pickle-only adapter."""
    from rewardkit.compose.soup import read_adapter

    d = _copy(saved["lora"] / "adapter", tmp_path)
    _pickle_instead(d / "adapter_model.safetensors", "adapter_model.bin")
    with pytest.raises(FileNotFoundError, match="never unpickles"):
        read_adapter(d)
