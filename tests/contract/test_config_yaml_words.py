"""YAML means what the docs say: `no` / `off` / `yes` / `on` given to a string field are words, and every
documented enum value reaches its field unchanged through a YAML file and through `--set KEY=VALUE`."""

from __future__ import annotations

import dataclasses

import pytest

from rewardkit.compose.composite import CompositeConfig
from rewardkit.config import build_config, load_config, parse_overrides, safe_load_yaml
from rewardkit.errors import ConfigError
from rewardkit.rewards.clipscore import CLIPScoreConfig
from rewardkit.rewards.evr import EVRConfig
from rewardkit.rewards.ocr import OCRConfig
from rewardkit.rewards.preference import PreferenceRewardConfig

trainer = pytest.importorskip("rewardkit.train.trainer")

# (config class, dotted key, every documented value)
ENUMS = [
    (trainer.PreferenceTrainConfig, "mixed_precision", ["no", "bf16", "fp16"]),
    (trainer.PreferenceTrainConfig, "model.head", ["linear", "mlp", "uncertainty"]),
    (trainer.PreferenceTrainConfig, "model.dtype", ["float32", "bfloat16", "float16"]),
    (trainer.PreferenceTrainConfig, "data.layout", ["auto", "ab", "chosen_rejected", "pickapic"]),
    (trainer.PreferenceTrainConfig, "optim.schedule", ["cosine", "constant"]),
    (trainer.PreferenceTrainConfig, "loss.kind", ["bt", "rao_kupper", "davidson", "uncertainty"]),
    (trainer.PreferenceTrainConfig, "resume", ["auto", "never"]),
    (CompositeConfig, "normalize", ["batch", "group", "fixed", "none"]),
    (CompositeConfig, "gating", ["intent", "none"]),
    (CompositeConfig, "detectors.mode", ["veto", "additive", "off"]),
    (CLIPScoreConfig, "convention", ["hessel", "logits100", "cosine"]),
    (PreferenceRewardConfig, "normalize", ["none", "calibration", "quantile"]),
    (OCRConfig, "whitespace", ["remove", "collapse"]),
    (OCRConfig, "match", ["full", "substring"]),
    (OCRConfig, "normalize_by", ["target", "max"]),
    (EVRConfig, "verifier", ["binary", "soft", "none"]),
    (EVRConfig, "all_rejected", ["invalid", "unverified_mean", "zero"]),
    (EVRConfig, "aggregate", ["geometric", "arithmetic"]),
    (EVRConfig, "output", ["normalized", "raw"]),
    (EVRConfig, "compare_mode", ["pairwise", "scores"]),
]
CASES = [(cls, key, v) for cls, key, values in ENUMS for v in values]


def _get(cfg, key):
    for part in key.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def _nested(key, value):
    out = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


@pytest.mark.parametrize("cls,key,value", CASES, ids=[f"{c.__name__}.{k}={v}" for c, k, v in CASES])
def test_enum_value_through_yaml_file_and_set(cls, key, value, tmp_path):
    lines, indent = [], ""
    parts = key.split(".")
    for p in parts[:-1]:
        lines.append(f"{indent}{p}:")
        indent += "  "
    lines.append(f"{indent}{parts[-1]}: {value}")  # unquoted, as a user writes it
    f = tmp_path / "c.yaml"
    f.write_text("\n".join(lines) + "\n")
    assert _get(load_config(cls, f), key) == value
    assert _get(load_config(cls, None, [f"{key}={value}"]), key) == value
    assert _get(build_config(cls, None, parse_overrides([f"{key}={value}"])), key) == value


@pytest.mark.parametrize("word", ["no", "off", "yes", "on", "No", "OFF", "Yes", "ON", "y", "n"])
def test_yaml_11_boolean_words_stay_words(word):
    assert safe_load_yaml(f"a: {word}") == {"a": word}
    assert parse_overrides([f"a={word}"]) == {"a": word}
    assert parse_overrides([f"x.mode={word}"]) == {"x": {"mode": word}}


def test_real_booleans_and_boolean_fields():
    assert safe_load_yaml("a: true\nb: False\nc: [TRUE, false]") == {"a": True, "b": False, "c": [True, False]}
    for word, want in [("yes", True), ("on", True), ("true", True), ("no", False), ("off", False), ("false", False)]:
        cfg = load_config(trainer.PreferenceTrainConfig, None, [f"lora.enabled={word}"])
        assert cfg.lora.enabled is want
    with pytest.raises(ConfigError, match="expected bool"):
        load_config(trainer.PreferenceTrainConfig, None, ["lora.enabled=maybe"])


def test_documented_values_pass_validation():
    # mixed_precision: no is accepted by the trainer's own check (it used to arrive as False and be refused)
    cfg = load_config(trainer.PreferenceTrainConfig, None, ["mixed_precision=no"])
    trainer._validate(cfg)
    assert dataclasses.asdict(cfg)["mixed_precision"] == "no"
