from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest

from rewardkit.config import build_config, load_config, parse_overrides, save_config
from rewardkit.errors import ConfigError


@dataclass
class Optim:
    lr: float = 1e-4
    betas: tuple = (0.9, 0.999)


@dataclass
class TrainConfig:
    model: str = "x"
    steps: int = 10
    bf16: bool = False
    dropout: float | None = None
    optim: Optim = field(default_factory=Optim)


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: qwen\nsteps: 5\noptim:\n  lr: 0.001\n")
    cfg = load_config(TrainConfig, p, ["steps=7", "optim.lr=2e-5", "bf16=true", "dropout=0.1"])
    assert cfg == TrainConfig(model="qwen", steps=7, bf16=True, dropout=0.1, optim=Optim(lr=2e-5))
    assert isinstance(cfg.optim.lr, float)
    save_config(cfg, tmp_path / "out.yaml")
    assert load_config(TrainConfig, tmp_path / "out.yaml") == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_unknown_keys_listed_at_once(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("modle: qwen\nstepz: 5\noptim:\n  lrr: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, p, ["extra=1"])
    msg = str(info.value)
    for key in ("modle (did you mean model?)", "stepz (did you mean steps?)", "optim.lrr (did you mean optim.lr?)", "extra"):
        assert key in msg, msg


def test_type_errors_and_bad_syntax(tmp_path):
    with pytest.raises(ConfigError, match="steps: expected int"):
        build_config(TrainConfig, {"steps": "many"})
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(TrainConfig, tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(TrainConfig, tmp_path / "list.yaml")


@pytest.mark.parametrize("payload", [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/apply:builtins.open ['{marker}', 'w']",
])
def test_yaml_is_safe_loaded(tmp_path, payload):
    """A YAML payload that would create a file if constructed: the file must not appear (observable effect)."""
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.yaml"
    p.write_text(f"model: {payload.format(marker=marker)}\n")
    with pytest.raises(ConfigError, match="could not determine a constructor"):  # refused, named as a config error
        load_config(TrainConfig, p)
    # the same payload as a CLI override is kept as an inert string, never constructed
    cfg = load_config(TrainConfig, None, [f"model={payload.format(marker=marker)}"])
    assert isinstance(cfg.model, str) and "python/object" in cfg.model
    assert not marker.exists()


def test_reward_config_overrides_rejected_with_names():
    from rewardkit.reward import Reward, RewardConfig, RewardOutput

    @dataclass
    class C(RewardConfig):
        scale: float = 1.0

    class R(Reward):
        name = "r"
        Config = C

        def _score(self, batch):
            return RewardOutput(scores=[self.config.scale] * len(batch))

    assert R(scale=2).config.scale == 2.0
    with pytest.raises(ConfigError, match="scal \\(did you mean scale"):
        R(scal=2)
