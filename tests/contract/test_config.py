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


def _bomb(levels: int = 8, width: int = 10) -> str:
    """A "billion laughs" document: ``width ** levels`` references (10^8) in a few hundred bytes."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_before_construction(tmp_path, monkeypatch):
    """Bug: a YAML alias bomb (10^8 references) was constructed; anything walking it (the config builder, a
    JSON dump of a record) then ran out of time or memory. Refused from the parser's events, before anything is
    constructed: checked with a constructor that fails the test if called (not with a clock), so a check moved
    after ``yaml.load``, or one that walks the built object, fails here whatever the machine's load."""
    import yaml

    from rewardkit.config import MAX_YAML_NODES, YAMLConfigError, safe_load_yaml

    def constructed(*a, **k):
        raise AssertionError("the alias bomb reached the YAML constructor")

    p = tmp_path / "bomb.yaml"
    p.write_text(_bomb())
    with monkeypatch.context() as m:
        m.setattr(yaml, "load", constructed)
        with pytest.raises(ConfigError, match="expands to more than 1,000,000 nodes"):
            load_config(TrainConfig, p)
        with pytest.raises(YAMLConfigError, match="alias bomb"):
            safe_load_yaml(_bomb(levels=7))
    # ordinary anchors / merge keys are fine, counted at their expanded size (here 3 + 2 * 4 ... nodes)
    ok = "base: &b {lr: 0.1, steps: 3}\nrun1: {<<: *b, lr: 0.2}\nrun2: *b\n"
    assert safe_load_yaml(ok) == {"base": {"lr": 0.1, "steps": 3}, "run1": {"lr": 0.2, "steps": 3},
                                  "run2": {"lr": 0.1, "steps": 3}}
    assert MAX_YAML_NODES == 1_000_000
    # the count is exact: the root + 3 keys + l0 (1 + 10) + l1 (1 + 10 * 11) + l2 (1 + 10 * 111) = 1237 nodes
    assert safe_load_yaml(_bomb(levels=2), max_nodes=1237)["l2"][9][9][9] == "lol"
    with pytest.raises(YAMLConfigError):
        safe_load_yaml(_bomb(levels=2), max_nodes=1236)


def test_yaml_recursive_alias_is_a_config_error_not_an_internal_error(tmp_path, capsys):
    """Bug: a recursive alias (``a: &a {x: *a}``, a node that contains itself) loaded as a cyclic dict; the
    config builder walking it hit RecursionError: exit 1, "internal error ... please report it". Refused from
    the parser's events (exit 2). Deep nesting is libyaml's own refusal, a YAMLConfigError too."""
    from rewardkit.cli import main
    from rewardkit.config import YAMLConfigError, safe_load_yaml

    for text in ("reward_kwargs: &a {x: *a}\n", "train: &t [1, *t]\n", "a: &a\n  b: {c: [*a]}\n"):
        with pytest.raises(YAMLConfigError, match="recursive alias"):
            safe_load_yaml(text)
    rec = tmp_path / "rec.yaml"
    rec.write_text("reward_kwargs: &a {x: *a}\n")
    assert main(["rl", "nft", "--config", str(rec), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "recursive alias" in err and "please report" not in err
    with pytest.raises(YAMLConfigError, match="nesting depth"):
        safe_load_yaml("[" * 20000 + "]" * 20000)
    # an alias of a node closed before it (merge keys included) is still fine
    assert safe_load_yaml("a: &a {x: 1}\nb: {<<: *a, y: [*a]}\n") == {"a": {"x": 1}, "b": {"x": 1, "y": [{"x": 1}]}}


def test_yaml_long_string_aliased_many_times_is_an_alias_bomb():
    """Bug: scalars counted one node whatever their length, so a 100 KB string aliased 2,000 times (a 100 KB
    file, 2,001 nodes) passed and expanded to 200 MB wherever the config was walked or dumped. A scalar counts
    one node per 64 characters now."""
    from rewardkit.config import YAMLConfigError, safe_load_yaml

    doc = 'a: &a "' + "x" * 100_000 + '"\nb: [' + ", ".join(["*a"] * 2_000) + "]\n"
    with pytest.raises(YAMLConfigError, match="alias"):
        safe_load_yaml(doc)
    assert len(safe_load_yaml('a: &a "' + "x" * 1_000 + '"\nb: [*a, *a]\n')["b"][1]) == 1_000  # ordinary use


def test_yaml_tag_in_a_bench_spec_or_template_exits_2(tmp_path, capsys):
    """Bug: a YAML tag (``!!python/...``) in a benchmark spec or a judge template was a yaml error, not a
    ConfigError: exit 1 ("internal error ... please report it"). Now a ConfigError (exit 2) naming the file."""
    from rewardkit.cli import main
    from rewardkit.judges.templates import load_template

    marker = tmp_path / "pwned"
    evil = f"!!python/object/apply:os.system ['touch {marker}']"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: x\nversion: {evil}\n")
    assert main(["bench", "--reward", "clipscore", "--model", str(tmp_path), "--benchmark", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "spec.yaml" in err and "please report" not in err
    tpl = tmp_path / "tpl.yaml"
    tpl.write_text(f'version: "1"\nquestion: {evil}\n')
    with pytest.raises(ConfigError, match="tpl.yaml"):
        load_template("vqascore", str(tpl))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('version: "1"\n' + _bomb())
    with pytest.raises(ConfigError, match="alias"):
        load_template("vqascore", str(bomb))
    assert not marker.exists()
