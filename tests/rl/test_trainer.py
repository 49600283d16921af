"""The DiffusionNFT trainer on the tiny SD3 pipeline: adapters, a 2-epoch run, E²PO conditioning, mixed precision,
LoRA loadable by diffusers, the CLI; kill-and-resume runs are slow (the 2-process gloo run: docs/test_commands.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from rewardkit.rl.config import NFTConfig  # noqa: E402
from tests.helpers.nft_runs import tiny_cfg  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread on a shared CPU; restore the session's setting afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


SMALL = {"sample": {"num_steps": 2, "resolution": 32, "batch_size": 4, "num_groups": 2, "group_size": 2}}


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_dirs):
    from rewardkit.rl.trainer import NFTTrainer

    return NFTTrainer(tiny_cfg(tmp_path_factory.mktemp("rl_unit"), tiny_dirs))


def _inputs(tr, b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tr.policy.latent_shape(b, 32), generator=g)
    cond = tr.policy.encode(["a photo of a cat", "a dog"][:b])
    return x, torch.tensor([0.9, 0.4])[:b], cond


def test_old_equals_reference_at_init_and_requires_grad_restored(trainer):
    pol = trainer.policy
    x, sig, cond = _inputs(trainer)
    with torch.no_grad():
        v_def = pol.velocity(pol.transformer, x, sig, cond)
        with pol.use_old():
            v_old = pol.velocity(pol.transformer, x, sig, cond)
        with pol.use_reference():
            v_ref = pol.velocity(pol.transformer, x, sig, cond)
    assert torch.equal(v_def, v_old) and torch.equal(v_old, v_ref)  # gaussian init: B = 0 in both adapters
    assert all(p.requires_grad for p in pol.adapter_params("default"))
    assert not any(p.requires_grad for p in pol.adapter_params("old"))
    assert not any(p.requires_grad for n, p in pol.transformer.named_parameters() if "lora_" not in n)
    # an exception inside a switch still restores the trained adapter
    with pytest.raises(RuntimeError):
        with pol.use_reference():
            raise RuntimeError("boom")
    assert all(p.requires_grad for p in pol.adapter_params("default"))
    assert pol.transformer.active_adapters() == ["default"]
    assert len(trainer.trainable) == len(trainer.old_params) > 0


def test_soft_update_on_real_adapters(trainer):
    from rewardkit.rl import nft

    with torch.no_grad():
        saved = [p.clone() for p in trainer.trainable], [p.clone() for p in trainer.old_params]
        for p in trainer.trainable:
            p.fill_(2.0)
        for p in trainer.old_params:
            p.fill_(1.0)
        nft.soft_update_(trainer.old_params, trainer.trainable, 0.25)
        assert all(torch.allclose(p, torch.full_like(p, 1.75)) for p in trainer.old_params)
        for p, s in zip(trainer.trainable, saved[0]):
            p.copy_(s)
        for p, s in zip(trainer.old_params, saved[1]):
            p.copy_(s)


def test_plan_is_rank_independent_and_groups_are_complete(trainer):
    chosen, batches = trainer._plan(5)
    chosen2, batches2 = trainer._plan(5)
    assert chosen == chosen2 and batches == batches2
    members = [m for b in batches for m in b]
    assert len(members) == trainer.cfg.sample.num_groups * trainer.cfg.sample.group_size
    assert all(sum(1 for p, _ in members if p == c) == trainer.cfg.sample.group_size for c in chosen)
    assert trainer._plan(6)[0] != chosen or trainer._plan(6)[1] != batches


@pytest.mark.slow
def test_two_epoch_run_changes_lora_and_writes_outputs(tmp_path, tiny_dirs):
    from rewardkit.rl.trainer import NFTTrainer

    tr = NFTTrainer(tiny_cfg(tmp_path / "run", tiny_dirs, eval_every=2, eval_num_prompts=4,
                             sample={"eval_num_steps": 3}))
    before = [p.detach().clone() for p in tr.trainable]
    summary = tr.train()
    assert summary["global_step"] == 2 and summary["epoch"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.trainable))
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    baseline, epochs = recs[0], [r for r in recs[1:] if "final" not in r]
    assert baseline["epoch"] == 0 and math.isfinite(baseline["eval/reward/pickscore/mean"])  # before any step
    assert [r["epoch"] for r in epochs] == [1, 2]
    for r in epochs:
        assert math.isfinite(r["total_loss"]) and math.isfinite(r["policy_loss"]) and r["invalid_rewards"] == 0
        assert sum(r["r/hist"]) == 8 and 0 <= r["zero_std_group_ratio"] <= 1
        assert "reward/pickscore/mean" in r and r["reward/pickscore/std"] > 0
    assert epochs[1]["kl_div"] > 0  # the trained adapter moved away from the base model after step 1
    assert "eval/reward/total/mean" not in epochs[0] and math.isfinite(epochs[1]["eval/reward/pickscore/mean"])
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000
    # evaluation: the held-out prompts, never the training ones; a PNG grid per evaluation beside curves.png
    from PIL import Image

    from rewardkit.rl.prompts import BUILTIN_PROMPTS

    assert tr.eval_prompts == BUILTIN_PROMPTS["geneval_tiny_eval"][:4] and not set(tr.eval_prompts) & set(tr.prompts)
    for e in (0, 2):
        assert Image.open(tmp_path / "run" / f"eval-epoch-{e:06d}.png").size == (4 * 32, 32)
    assert not (tmp_path / "run" / "eval-epoch-000001.png").exists()
    # per optimizer step, the official names (steps.jsonl and TensorBoard, read back with its own reader)
    steps = [json.loads(ln) for ln in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    for key in ("old_kl_div", "kl_div", "unweighted_policy_loss", "policy_loss", "total_loss", "old_deviate",
                "x0_norm_max", "grad_norm"):
        ev = acc.Scalars(f"train/{key}")
        assert [e.step for e in ev] == [1, 2], key
        assert [e.value for e in ev] == pytest.approx([r[key] for r in steps], rel=1e-6), key
    assert [e.value for e in acc.Scalars("train/old_kl_div")][0] == 0.0  # old adapter = base model before step 1
    assert [e.step for e in acc.Scalars("reward/pickscore/max")] == [1, 2]
    assert [e.value for e in acc.Scalars("reward/total/min")] == pytest.approx([r["reward/total/min"] for r in epochs])
    assert [e.step for e in acc.Scalars("eval/reward/pickscore/mean")] == [0, 2]
    assert {"train/top_reward_images", "train/bottom_reward_images", "eval/images"} <= set(tags["images"])
    # the LoRA loads into a plain diffusers pipeline and equals our EMA weights
    import diffusers
    from safetensors.torch import load_file

    lora = tmp_path / "run" / "lora" / "pytorch_lora_weights.safetensors"
    sd = load_file(str(lora))
    assert sd and all(k.startswith("transformer.") for k in sd)
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(tiny_dirs["sd3"])
    pipe.load_lora_weights(str(lora.parent), weight_name=lora.name)  # diffusers < 0.37 needs the name offline
    loaded = {n: p for n, p in pipe.transformer.named_parameters() if "lora_B" in n}
    assert loaded and any(float(p.abs().max()) > 0 for p in loaded.values())
    ema_b = [e for (n, _), e in zip(tr.policy.adapter_named_params("default"), tr.ema) if "lora_B" in n]
    assert sorted(float(e.abs().sum()) for e in ema_b) == pytest.approx(sorted(float(p.abs().sum()) for p in loaded.values()), rel=1e-6)
    ck = tmp_path / "run" / "checkpoints"
    assert (ck / "latest").read_text() == "epoch-000002" and not list(ck.glob("*.tmp"))
    # running the finished run again trains nothing and keeps its summary (it used to rewrite it with nulls)
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(final["reward_mean"])
    again = NFTTrainer(tiny_cfg(tmp_path / "run", tiny_dirs, eval_every=2, eval_num_prompts=4, resume="auto",
                                sample={"eval_num_steps": 3})).train()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert again["reward_mean"] == final["reward_mean"] and json.loads(lines[-1]) == final and len(lines) == len(recs)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_step_on_cpu(tmp_path, tiny_dirs, precision):
    from rewardkit.rl.trainer import NFTTrainer

    tr = NFTTrainer(tiny_cfg(tmp_path, tiny_dirs, mixed_precision=precision, num_epochs=1,
                             train={"ema": False}, **SMALL))
    before = [p.detach().clone() for p in tr.trainable]
    rec = tr.run_epoch()
    assert math.isfinite(rec["total_loss"]) and math.isfinite(rec["grad_norm"])
    assert all(p.dtype == torch.float32 for p in tr.trainable)  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.trainable))
    if precision == "fp16":
        assert tr.scaler.is_enabled() and rec["grad_scale"] > 0


def test_e2po_conditions_keep_reference_member_unperturbed(tmp_path, tiny_dirs):
    from rewardkit.rl.trainer import NFTTrainer

    tr = NFTTrainer(tiny_cfg(tmp_path, tiny_dirs, e2po={"enabled": True, "num_variants": 2, "steps": 5},
                             num_epochs=1, **SMALL))
    deltas, logs = tr._explore(0)
    chosen, batches = tr._plan(0)
    assert set(deltas) == set(chosen)
    assert math.isfinite(logs["e2po/clip_l/anchor_sim_mean"])
    batch = [(chosen[0], 0), (chosen[0], 1), (chosen[1], 1), (chosen[1], 0)]
    c_orig, c_opt = tr._conditions(batch, deltas)
    assert torch.equal(c_orig.embeds[0], c_opt.embeds[0]) and torch.equal(c_orig.pooled[3], c_opt.pooled[3])
    assert not torch.equal(c_orig.embeds[1], c_opt.embeds[1]) and not torch.equal(c_orig.pooled[2], c_opt.pooled[2])
    # only CLIP-L (the first 16 features of the CLIP part, the first 16 pooled features) moves; T5 rows never
    d = (c_opt.embeds[1] - c_orig.embeds[1]).abs()
    assert float(d[:16, :16].max()) > 0 and float(d[:16, 16:].max()) == 0 and float(d[16:].max()) == 0
    assert float((c_opt.pooled[1] - c_orig.pooled[1])[16:].abs().max()) == 0
    # delta is zero outside the content tokens
    ids = tr.policy.tokenize_clip([tr.prompts[chosen[0]]])
    from rewardkit.rl.exploration import content_token_mask

    mask = content_token_mask(ids, *tr.policy.clip_ids("clip_l"))[0]
    dl = deltas[chosen[0]]["clip_l"][0]
    assert float(dl[~mask].abs().max()) == 0 and float(dl[mask].abs().max()) > 0
    assert float(dl.abs().max()) <= tr.cfg.e2po.delta_max
    rec = tr.run_epoch()  # a full E²PO epoch: perturbed rollouts, training on C_orig
    assert math.isfinite(rec["total_loss"]) and "reward/total/mean_perturbed" in rec


def test_invalid_rewards_raise_or_drop(trainer, monkeypatch):
    buf = {"prompt": torch.tensor([0, 0, 1, 1, 0, 0, 1, 1]), "variant": torch.zeros(8, dtype=torch.long),
           "rewards": [{"total": torch.tensor([1.0, float("nan"), 2.0, 3.0, 0.5, 1.5, 2.5, 2.0], dtype=torch.float64),
                        "components": {}, "dimensions": {}, "errors": [None, "bad image", None, None, None, None, None, None]}]}
    with pytest.warns(UserWarning, match="left out"):
        r, valid, logs = trainer._advantages(buf)
    assert logs["invalid_rewards"] == 1 and not bool(valid[1]) and int(valid.sum()) == 7
    monkeypatch.setattr(trainer.cfg, "invalid_rewards", "raise")
    with pytest.raises(RuntimeError, match="bad image"):
        trainer._advantages(buf)


def test_config_validation_and_presets():
    from rewardkit.errors import ConfigError
    from rewardkit.config import build_config
    from rewardkit.rl.config import PRESETS, preset

    cfg = NFTConfig()
    assert (cfg.train.lr, cfg.train.beta, cfg.train.kl_coef, cfg.lora.r, cfg.sample.num_steps) == (3e-4, 1.0, 1e-4, 32, 10)
    e = build_config(NFTConfig, preset("e2po_geneval_k4")).e2po
    assert (e.enabled, e.num_variants, e.lambda_div, e.steps, e.mu, e.rho) == (True, 4, 100.0, 300, 0.8, 0.4)
    for name in PRESETS:
        build_config(NFTConfig, preset(name)).validate()
    bad = build_config(NFTConfig, {"e2po": {"enabled": True, "num_variants": 5}})
    with pytest.raises(ValueError, match="multiple of e2po.num_variants"):
        bad.validate()
    with pytest.raises(ConfigError):
        build_config(NFTConfig, {"train": {"lrr": 1.0}})
    # optimizer settings that would silently train wrong: NaN / inf / negative; a negative max_grad_norm makes
    # clip_grad_norm_ multiply the gradients by a negative factor (gradient ascent)
    for train, what in [({"lr": float("nan")}, "train.lr"), ({"lr": float("inf")}, "train.lr"), ({"lr": 0.0}, "train.lr"),
                        ({"max_grad_norm": -1.0}, "max_grad_norm"), ({"max_grad_norm": float("nan")}, "max_grad_norm"),
                        ({"max_grad_norm": 0.0}, "max_grad_norm"), ({"weight_decay": float("nan")}, "weight_decay"),
                        ({"adam_beta2": 1.0}, "adam_beta"), ({"adam_eps": 0.0}, "adam_eps")]:
        with pytest.raises(ValueError, match=what):
            build_config(NFTConfig, {"train": train}).validate()
    build_config(NFTConfig, {"train": {"max_grad_norm": float("inf")}}).validate()   # inf: no clipping
    # the NFT step's settings fail at start: a typo'd adv_mode / beta <= 0 / adv_clip_max 0 used to fail after
    # the first epoch's sampling (adv_clip_max 0: NaN r, then ZeroDivisionError in the step log), a typo'd
    # decay_type after its training
    for train, what in [({"adv_mode": "postive_only"}, "train.adv_mode"), ({"decay_type": "linear"}, "decay_type"),
                        ({"decay_type": 3}, "decay_type"), ({"beta": 0.0}, "train.beta"),
                        ({"adv_clip_max": 0.0}, "adv_clip_max"), ({"adv_clip_max": float("nan")}, "adv_clip_max"),
                        ({"kl_coef": -1e-4}, "kl_coef"), ({"ema_decay": 1.5}, "ema_decay"),
                        ({"timestep_fraction": 0.0}, "timestep_fraction")]:
        with pytest.raises(ValueError, match=what):
            build_config(NFTConfig, {"train": train}).validate()
    for ok in ({"adv_mode": "one_only"}, {"kl_coef": 0.0}):
        build_config(NFTConfig, {"train": ok}).validate()
    # the official decay_type numbers: the str field read `train.decay_type=2` as "2", which the schedule refused
    # after the first epoch; they are the names now
    for num, name in ((0, "copy"), ("1", "linear_to_0_5"), (2, "delayed_linear_to_0_999")):
        cfg = build_config(NFTConfig, {"train": {"decay_type": num}})
        cfg.validate()
        assert cfg.train.decay_type == name
    for w in (float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="finite number"):
            build_config(NFTConfig, {"rewards": {"pickscore": w}}).validate()


def test_cli_help_and_print_config(capsys):
    from rewardkit.cli import main

    with pytest.raises(SystemExit):
        main(["rl", "nft", "--help"])
    assert "DiffusionNFT" in capsys.readouterr().out
    assert main(["rl", "nft", "--config", str(ROOT / "recipes/nft/tiny.yaml"), "--print-config",
                 "train.lr=0.01"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.01" in out and "pretrained: tiny:sd3" in out
    assert main(["rl", "nft", "--preset", "e2po_pickscore_k3", "--print-config"]) == 0
    assert "num_variants: 3" in capsys.readouterr().out


def test_recipe_headers_are_launch_commands():
    for path in sorted((ROOT / "recipes" / "nft").glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("#"), path
        text = path.read_text()
        assert f"--config recipes/nft/{path.name}" in text, path


def _run_cli(args, env_extra=None, timeout=600):
    """`rewardkit rl nft ARGS` as a process of its own, forked from this one (tests/helpers/forked.py: the same
    entry point and a real SIGKILL, without a fresh interpreter importing torch and diffusers again)."""
    from tests.helpers.forked import run_forked

    return run_forked(["rl", "nft", *map(str, args)], env={"OMP_NUM_THREADS": "1", **(env_extra or {})}, cwd=ROOT,
                      timeout=timeout)


def _run_in_process(args) -> int:
    """`rewardkit rl nft ARGS` through the console script's entry point in this process: the runs a test compares
    with a killed one (the one run that must be a process of its own) cost no Python start-up each."""
    from rewardkit.cli import main

    return main(["rl", "nft", *[str(a) for a in args]])


def _common(tiny_dirs, out):
    return ["--config", str(ROOT / "recipes/nft/tiny.yaml"), f"output_dir={out}", f"model.pretrained={tiny_dirs['sd3']}",
            f"reward_kwargs.pickscore.model={tiny_dirs['clip']}", "sample.num_steps=2", "num_epochs=3",
            "save_every=1", "progress=false"]


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_identical(tmp_path, tiny_dirs):
    from safetensors.torch import load_file

    from rewardkit.rl.trainer import latest_checkpoint

    # the uninterrupted run and the resume in this process (as `rewardkit rl nft` runs them); the killed run a real
    # process of its own (forked), SIGKILLed by the trainer's test hook
    assert _run_in_process(_common(tiny_dirs, tmp_path / "ref")) == 0
    killed = _run_cli(_common(tiny_dirs, tmp_path / "k"), env_extra={"REWARDKIT_TEST_KILL_AFTER_EPOCH": "2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert latest_checkpoint(tmp_path / "k").name == "epoch-000001"  # epoch 2 died before its checkpoint
    assert _run_in_process(_common(tiny_dirs, tmp_path / "k")) == 0
    a = load_file(str(latest_checkpoint(tmp_path / "ref") / "adapters.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "k") / "adapters.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    epochs = [json.loads(ln)["epoch"] for ln in (tmp_path / "k" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [0, 1, 2, 3, 3]  # the baseline evaluation, epochs 1-3 once each (2 dropped and
    # replayed), then the final summary


# The 2-process gloo run (replicas identical at the end, world size 2, every step trained) is checked on
# docs/rl.md's own torchrun line: docs/test_commands.py::test_run_every_unmarked_doc_command (one launch for both).


def test_rewards_is_a_set_replaced_by_each_layer_and_edited_by_dotted_overrides(tmp_path, capsys):
    """preset -> --config -> key=value -> train_nft(**kw): a `rewards` mapping replaces the one before it (it
    used to merge: `rewards={remote: 1}` trained on PickScore + remote); `rewards.NAME=W` edits one entry;
    other mappings (train, reward_kwargs) still merge key by key."""
    import yaml

    from rewardkit.cli import main
    from rewardkit.config import build_config, parse_overrides

    assert build_config(NFTConfig, NFTConfig(), {"rewards": {"remote": 1.0}}).rewards == {"remote": 1.0}
    assert build_config(NFTConfig, None, {"rewards": {"remote": 1.0}}).rewards == {"remote": 1.0}
    dotted = parse_overrides(["rewards.remote=0.5"], patches=True)
    assert build_config(NFTConfig, None, dotted).rewards == {"pickscore": 1.0, "remote": 0.5}
    assert build_config(NFTConfig, None, parse_overrides(["rewards={remote: 2}"], patches=True)).rewards == {"remote": 2}
    # the markers never leak: plain dicts all the way down (yaml.safe_dump refuses dict subclasses)
    deep = build_config(NFTConfig, None, parse_overrides(["reward_kwargs.clipscore.options.model=x"], patches=True))
    assert type(deep.reward_kwargs["clipscore"]["options"]) is dict
    assert yaml.safe_dump(deep.reward_kwargs) and type(parse_overrides(["a.b=1"])["a"]) is dict
    cfg = build_config(NFTConfig, {"train": {"lr": 0.1}, "reward_kwargs": {"a": {"x": 1}}},
                       {"train": {"beta": 0.5}, "reward_kwargs": {"a": {"y": 2}}})
    assert (cfg.train.lr, cfg.train.beta, cfg.reward_kwargs) == (0.1, 0.5, {"a": {"x": 1, "y": 2}})
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rewards: {clipscore: 2.0}\n")
    assert main(["rl", "nft", "--preset", "multi_reward", "--config", str(recipe), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rewards"] == {"clipscore": 2.0}
    assert main(["rl", "nft", "--preset", "multi_reward", "--print-config", "rewards.clipscore=3",
                 "reward_kwargs.clipscore.options.model=x"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["rewards"] == {"pickscore": 1.0, "hpsv2": 1.0, "clipscore": 3}
    assert out["reward_kwargs"] == {"pickscore": {"scale": 1 / 26},  # the preset's (flow_grpo scales) merged
                                    "clipscore": {"model": "openai/clip-vit-large-patch14", "convention": "logits100",
                                                  "options": {"model": "x"}}}


def test_replacing_rewards_drops_the_earlier_layers_options_of_rewards_no_longer_named(capsys):
    """`--preset pickscore rewards={clipscore: 1}`: the preset's PickScore options (scale 1/26) went with the set
    they belonged to; they used to stay (reward_kwargs merges, and no override can remove an entry), so the
    trainer refused to start ("reward_kwargs for rewards not in `rewards`: ['pickscore']")."""
    import yaml

    from rewardkit.cli import main
    from rewardkit.config import build_config, parse_overrides
    from rewardkit.rl.config import preset

    assert main(["rl", "nft", "--preset", "pickscore", "--print-config", "rewards={clipscore: 1}"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert (out["rewards"], out["reward_kwargs"]) == ({"clipscore": 1}, {})
    # kept: options of a reward still in the set, and options the replacing layer (or a later one) gives
    cfg = build_config(NFTConfig, preset("multi_reward"), {"rewards": {"pickscore": 1.0, "remote": 1.0},
                                                           "reward_kwargs": {"remote": {"url": "u"}}})
    assert cfg.reward_kwargs == {"pickscore": {"scale": 1 / 26}, "remote": {"url": "u"}}
    # a dotted edit of the set keeps every option; a later layer's option for an unnamed reward stays (an error
    # at start, naming it, as before)
    dotted = build_config(NFTConfig, preset("multi_reward"), parse_overrides(["rewards.remote=1"], patches=True))
    assert set(dotted.reward_kwargs) == {"pickscore", "clipscore"}
    late = build_config(NFTConfig, build_config(NFTConfig, preset("pickscore"), {"rewards": {"clipscore": 1}}),
                        {"reward_kwargs": {"hpsv2": {"model": "x"}}})
    assert late.reward_kwargs == {"hpsv2": {"model": "x"}}


def test_prompt_rows_reach_the_rewards_as_each_samples_metadata(tmp_path, tiny_dirs, monkeypatch):
    """A .jsonl prompt row is its samples' metadata (flow_grpo's convention, the prompt included): a GenEval-style
    reward that needs it gets the right row for every member of every group (it used to get {}, then the row
    without its prompt, which a GenEval server reading metadata["prompt"] lacks)."""
    from rewardkit import registry
    from rewardkit.reward import Reward, RewardOutput
    from rewardkit.rl.prompts import load_prompt_set
    from rewardkit.rl.trainer import NFTTrainer

    rows = [{"prompt": f"a photo of {n}", "tag": "counting", "count": i, "include": [{"class": n}]}
            for i, n in enumerate(["a cat", "two dogs", "a car", "a cup"])]
    path = tmp_path / "train_metadata.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # the whole row, prompt included: flow_grpo's GenevalPromptDataset (scripts/train_sd3.py:61-70 of
    # yifan123/flow_grpo; DiffusionNFT's train_nft_sd3.py:100-109) passes json.loads(line) as the metadata, and its
    # GenEval scorer sends the server the metadata alone (`del prompts`, flow_grpo/rewards.py:176-177)
    assert load_prompt_set(str(path)) == ([r["prompt"] for r in rows], rows)

    class NeedsMeta(Reward):
        name = "needs-meta"

        def __init__(self):
            super().__init__()
            self.seen = []

        def _score(self, batch):
            self.seen += list(zip(batch.prompts, batch.metadata))
            return RewardOutput(scores=torch.tensor([float(m["count"]) for m in batch.metadata]))

    reward = NeedsMeta()
    monkeypatch.setattr(registry, "resolve_name", lambda n: n)
    monkeypatch.setattr(registry, "load_reward", lambda name, **kw: reward)
    cfg = tiny_cfg(tmp_path / "run", tiny_dirs, prompts=str(path), rewards={"needs-meta": 1.0},
                   sample={"num_groups": 4})
    cfg.reward_kwargs = {}
    tr = NFTTrainer(cfg)
    buf = tr._sample_epoch(0, None)
    by_prompt = {r["prompt"]: r for r in rows}
    assert len(reward.seen) == 16 and all(meta == by_prompt[p] for p, meta in reward.seen)
    totals = torch.cat([r["total"] for r in buf["rewards"]])
    assert totals.tolist() == [float(rows[int(p)]["count"]) for p in buf["prompt"]]
    # the same plan seen from each of 2 processes (a group spread over them): every process's samples carry
    # their own prompt's row, and together they are the whole epoch
    seen = []
    tr.dist.world, tr.num_batches = 2, tr.num_batches // 2
    for rank in (0, 1):
        reward.seen.clear()
        tr.dist.rank = rank
        part = tr._sample_epoch(0, None)
        assert len(reward.seen) == 8 and all(meta == by_prompt[p] for p, meta in reward.seen)
        seen += part["prompt"].tolist()
    assert sorted(seen) == sorted(buf["prompt"].tolist())


def test_logged_loss_terms_are_the_official_quantities_under_the_official_names():
    """The official per-step log, transcribed from NVlabs/DiffusionNFT scripts/train_nft_sd3.py @ 24af555
    (lines 928-980: r, loss_terms["x0_norm" ...], adaptive weighting, ori_policy_loss, kl_div, old_kl_div,
    total_loss), on the same tensors as nft_loss + loss_terms. `unweighted_policy_loss` used to be our policy
    loss without the adaptive weight (another quantity under the official name)."""
    from rewardkit.rl.nft import nft_loss
    from rewardkit.rl.tracking import loss_terms

    g = torch.Generator().manual_seed(0)
    B, beta, adv_clip_max, kl_beta = 3, 0.1, 5.0, 1e-4
    x0, noise = torch.randn(B, 4, 8, 8, generator=g), torch.randn(B, 4, 8, 8, generator=g)
    forward_prediction, old_prediction, ref_forward_prediction = (torch.randn(B, 4, 8, 8, generator=g) for _ in range(3))
    t = torch.tensor([0.9, 0.5, 0.2])
    advantages = torch.tensor([2.0, -7.0, 0.5])
    t_expanded = t.view(-1, 1, 1, 1)
    xt = (1 - t_expanded) * x0 + t_expanded * noise
    # ---- transcription (config.beta = beta, config.train.adv_clip_max = adv_clip_max, config.train.beta = kl_beta)
    loss_terms_ref = {}
    advantages_clip = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    normalized_advantages_clip = (advantages_clip / adv_clip_max) / 2.0 + 0.5
    r = torch.clamp(normalized_advantages_clip, 0, 1)
    loss_terms_ref["x0_norm"] = torch.mean(x0**2).detach()
    loss_terms_ref["x0_norm_max"] = torch.max(x0**2).detach()
    loss_terms_ref["old_deviate"] = torch.mean((forward_prediction - old_prediction) ** 2).detach()
    loss_terms_ref["old_deviate_max"] = torch.max((forward_prediction - old_prediction) ** 2).detach()
    positive_prediction = beta * forward_prediction + (1 - beta) * old_prediction.detach()
    implicit_negative_prediction = (1.0 + beta) * old_prediction.detach() - beta * forward_prediction
    x0_prediction = xt - t_expanded * positive_prediction
    weight_factor = torch.abs(x0_prediction.double() - x0.double()).mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001)
    positive_loss = ((x0_prediction - x0) ** 2 / weight_factor).mean(dim=tuple(range(1, x0.ndim)))
    negative_x0_prediction = xt - t_expanded * implicit_negative_prediction
    negative_weight_factor = torch.abs(negative_x0_prediction.double() - x0.double()).mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001)
    negative_loss = ((negative_x0_prediction - x0) ** 2 / negative_weight_factor).mean(dim=tuple(range(1, x0.ndim)))
    ori_policy_loss = r * positive_loss / beta + (1.0 - r) * negative_loss / beta
    policy_loss = (ori_policy_loss * adv_clip_max).mean()
    loss = policy_loss
    loss_terms_ref["policy_loss"] = policy_loss.detach()
    loss_terms_ref["unweighted_policy_loss"] = ori_policy_loss.mean().detach()
    kl_div_loss = ((forward_prediction - ref_forward_prediction) ** 2).mean(dim=tuple(range(1, x0.ndim)))
    loss += kl_beta * torch.mean(kl_div_loss)
    loss_terms_ref["kl_div"] = torch.mean(((forward_prediction - ref_forward_prediction) ** 2).mean(dim=tuple(range(1, x0.ndim)))).detach()
    loss_terms_ref["old_kl_div"] = torch.mean(((old_prediction - ref_forward_prediction) ** 2).mean(dim=tuple(range(1, x0.ndim)))).detach()
    loss_terms_ref["total_loss"] = loss.detach()
    # ---- ours
    ours_r = (advantages.clamp(-adv_clip_max, adv_clip_max) / adv_clip_max / 2 + 0.5).clamp(0, 1)
    our_loss, metrics = nft_loss(forward_prediction, old_prediction, ref_forward_prediction, x0, xt, t, ours_r,
                                 beta=beta, adv_clip_max=adv_clip_max, kl_coef=kl_beta)
    got = loss_terms(forward_prediction, old_prediction, ref_forward_prediction, x0, our_loss, metrics, adv_clip_max)
    for k in ("x0_norm", "x0_norm_max", "old_deviate", "old_deviate_max", "unweighted_policy_loss", "kl_div",
              "old_kl_div", "total_loss"):
        assert got[k] == pytest.approx(float(loss_terms_ref[k]), rel=1e-6), k
    # the official logged policy_loss is the same tensor as `loss` (the KL is added in place): ours leaves it out
    assert float(loss_terms_ref["policy_loss"]) == pytest.approx(float(loss_terms_ref["total_loss"]), rel=1e-9)
    assert got["policy_loss"] + kl_beta * got["kl_div"] == pytest.approx(float(loss_terms_ref["policy_loss"]), rel=1e-6)
    assert got["policy_loss_plain_mse"] != pytest.approx(got["unweighted_policy_loss"], rel=0.1)  # the old meaning


def test_resume_drops_a_half_written_log_record(tmp_path):
    """Bug: a kill while metrics.jsonl / steps.jsonl took a record left half a line, on which every resume then
    failed (json.loads in the truncation on resume). Half a record is dropped like a record after the checkpoint."""
    from types import SimpleNamespace

    from rewardkit.rl.trainer import NFTTrainer

    (tmp_path / "metrics.jsonl").write_text('{"epoch": 0, "eval/reward/total/mean": 0.5}\n'
                                            '{"epoch": 1, "reward/total/mean": 1.0}\n{"epoch": 2, "rew')
    (tmp_path / "steps.jsonl").write_text('{"step": 1, "total_loss": null}\n{"step": 2, "total_loss": 0.25}\n{"st')
    tr = SimpleNamespace(out=tmp_path, dist=SimpleNamespace(main=True), epoch=1, global_step=1)
    NFTTrainer._truncate_metrics(tr)
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"epoch": 0, "eval/reward/total/mean": 0.5}, {"epoch": 1, "reward/total/mean": 1.0}]
    assert [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()] == [
        {"step": 1, "total_loss": None}]
    assert NFTTrainer._last_epoch_record(tr) == {"epoch": 1, "reward/total/mean": 1.0}


@pytest.mark.slow
def test_kill_mid_epoch_and_resume_is_bitwise_identical(tmp_path, tiny_dirs):
    """Two optimizer steps per epoch, a checkpoint after every step (save_every_steps=1), SIGKILL after step 3
    (the middle of epoch 2): the resumed run continues the epoch from its saved rollouts, r and training
    generator, and ends with bitwise the same weights, optimizer and records as an uninterrupted run."""
    from safetensors.torch import load_file

    from rewardkit.rl.trainer import latest_checkpoint

    args = [*_common(tiny_dirs, tmp_path / "x")[:-3], "num_epochs=2", "eval_every=0", "train.steps_per_epoch=2",
            "train.batch_size=2", "save_every=0", "progress=false", "report_to=none"]
    assert _run_in_process([*args, f"output_dir={tmp_path / 'ref'}"]) == 0  # in this process, as above
    run = [*args, f"output_dir={tmp_path / 'k'}", "save_every_steps=1"]
    killed = _run_cli(run, env_extra={"REWARDKIT_TEST_KILL_AFTER_STEP": "3"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert latest_checkpoint(tmp_path / "k").name == "epoch-000001-step-00000003"
    assert _run_in_process(run) == 0
    for f in ("adapters.safetensors", "optimizer.safetensors"):
        a = load_file(str(latest_checkpoint(tmp_path / "ref") / f))
        b = load_file(str(latest_checkpoint(tmp_path / "k") / f))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    strip = lambda p: [{k: v for k, v in json.loads(ln).items() if not k.startswith("time/") and k != "lora_dir"}
                       for ln in p.read_text().splitlines()]
    assert strip(tmp_path / "k" / "metrics.jsonl") == strip(tmp_path / "ref" / "metrics.jsonl")
    assert strip(tmp_path / "k" / "steps.jsonl") == strip(tmp_path / "ref" / "steps.jsonl")
    assert [r["step"] for r in strip(tmp_path / "k" / "steps.jsonl")] == [1, 2, 3, 4]


def test_rl_extra_is_checked_before_any_reward_loads(tmp_path, monkeypatch):
    """Without the rl extra, `rl nft` used to build (download) the reward first, then fail on diffusers."""
    from rewardkit import registry
    from rewardkit.errors import MissingDependencyError
    from rewardkit.rl import trainer as T

    def missing(module, extra=None, purpose=None):
        raise MissingDependencyError(module, extra, purpose)

    loaded = []
    monkeypatch.setattr(T, "require", missing)
    monkeypatch.setattr(registry, "load_reward", lambda *a, **k: loaded.append(a))
    with pytest.raises(MissingDependencyError, match=r"diffusers(.|\n)*rewardkit-vision\[rl\]"):
        T.NFTTrainer(NFTConfig(output_dir=str(tmp_path), cpu=True))
    assert loaded == []


def test_resuming_with_another_world_size_says_how_to_start_over(trainer, tmp_path):
    ck = tmp_path / "checkpoints" / "epoch-000001"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text(json.dumps({"world_size": 2, "epoch": 1, "global_step": 1}))
    with pytest.raises(ValueError, match=r"2 processes.*new output_dir.*resume=never"):
        trainer.load_checkpoint(ck)


@pytest.fixture(scope="module")
def saved_checkpoint(trainer):
    """A checkpoint written by the real trainer path (``NFTTrainer.save_checkpoint``) of the module's trainer."""
    return trainer.save_checkpoint()


def _as_written(saved_checkpoint, tmp_path, edit) -> Path:
    """A copy of the saved checkpoint whose stored config ``edit`` changed (as another version would write it)."""
    import shutil

    ck = tmp_path / "checkpoints" / saved_checkpoint.name
    shutil.copytree(saved_checkpoint, ck)
    state = json.loads((ck / "state.json").read_text())
    edit(state["config"])
    (ck / "state.json").write_text(json.dumps(state, indent=1))
    return ck


def test_an_older_checkpoint_without_a_later_option_resumes_when_the_run_keeps_its_default(
        trainer, saved_checkpoint, tmp_path, capsys):
    """Bug: a checkpoint written before `sample.eval_guidance_scale` existed (its saved `sample` section lacks it)
    was refused ("sample changed since it was written") although the run left that option at its default. The
    missing fields are filled in from the current defaults and named on stderr; the weights are loaded."""
    assert trainer.cfg.sample.eval_guidance_scale is None  # the default
    ck = _as_written(saved_checkpoint, tmp_path, lambda c: (c["sample"].pop("eval_guidance_scale"),
                                                            c["e2po"].pop("warn_band")))
    before = [p.detach().clone() for p in trainer.trainable]
    with torch.no_grad():
        for p in trainer.trainable:
            p.add_(1.0)  # so that the load is seen to restore the saved weights
    trainer.epoch, trainer.global_step = 7, 7
    trainer.load_checkpoint(ck)
    assert all(torch.equal(p, b) for p, b in zip(trainer.trainable, before))
    assert (trainer.epoch, trainer.global_step) == (0, 0)
    err = capsys.readouterr().err
    assert "sample.eval_guidance_scale" in err and "e2po.warn_band" in err and "default" in err, err


def test_an_older_checkpoint_is_refused_when_the_run_sets_an_option_it_lacks(trainer, saved_checkpoint, tmp_path,
                                                                             monkeypatch):
    """A field the checkpoint lacks ran at its default then; a run that sets it otherwise would not continue
    the same run, so it is refused, naming the field, both values and the way out."""
    ck = _as_written(saved_checkpoint, tmp_path, lambda c: c["sample"].pop("eval_guidance_scale"))
    monkeypatch.setattr(trainer.cfg.sample, "eval_guidance_scale", 4.5)
    with pytest.raises(ValueError, match=r"sample\.eval_guidance_scale(.|\n)*4\.5(.|\n)*new output_dir"):
        trainer.load_checkpoint(ck)


def test_a_checkpoint_with_options_this_version_does_not_know_is_refused(trainer, saved_checkpoint, tmp_path):
    """A saved section with a field the current code lacks (written by a newer rewardkit) cannot be checked:
    refused, naming the field."""
    ck = _as_written(saved_checkpoint, tmp_path, lambda c: c["sample"].update(future_knob=3))
    with pytest.raises(ValueError, match=r"sample\.future_knob(.|\n)*newer"):
        trainer.load_checkpoint(ck)


def test_a_checkpoint_whose_option_had_another_value_is_still_refused(trainer, saved_checkpoint, tmp_path):
    """The refusal that protects results stays: a changed value of a field both versions know, named."""
    ck = _as_written(saved_checkpoint, tmp_path, lambda c: (c["sample"].update(num_steps=99),
                                                            c["sample"].pop("eval_guidance_scale")))
    with pytest.raises(ValueError, match=r"sample\.num_steps(.|\n)*changed since it was written"):
        trainer.load_checkpoint(ck)
    ck2 = _as_written(saved_checkpoint, tmp_path / "2", lambda c: c.update(seed=4))
    with pytest.raises(ValueError, match=r"seed(.|\n)*changed since it was written"):
        trainer.load_checkpoint(ck2)


def test_saved_config_check_fills_whole_sections_and_nested_fields_from_the_current_defaults():
    """The check itself on dicts as ``state.json`` holds them: a whole section added later (all defaults) is
    filled in; a list or mapping value is compared whole (``rewards`` is a set, not a section of fields)."""
    import dataclasses

    from rewardkit.rl.checkpoints import check_saved_config

    keys = ("seed", "prompts", "sample", "lora", "e2po", "rewards", "train")
    cfg = NFTConfig(seed=5)
    saved = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert check_saved_config(saved, cfg, keys, Path("ck")) == []
    del saved["e2po"], saved["train"]["ema_decay"]
    assert check_saved_config(saved, cfg, keys, Path("ck")) == ["e2po", "train.ema_decay"]
    cfg.e2po.enabled = True
    with pytest.raises(ValueError, match=r"e2po \(not in the checkpoint"):
        check_saved_config(saved, cfg, keys, Path("ck"))
    cfg.e2po.enabled = False
    saved["rewards"] = {"pickscore": 1.0, "hpsv2": 1.0}
    with pytest.raises(ValueError, match=r"rewards \(\{'pickscore': 1.0, 'hpsv2': 1.0\} in the checkpoint"):
        check_saved_config(saved, cfg, keys, Path("ck"))


def test_documented_single_and_multi_process_tiny_commands_use_separate_folders():
    """README / docs/rl.md / the recipe headers / `rl nft --help`: a single-process and a torchrun command on
    the same recipe shared one output_dir, so the second resumed a checkpoint of another world size and failed."""
    import re

    import yaml

    sources = [ROOT / "docs" / "rl.md", ROOT / "README.md", ROOT / "rewardkit" / "commands" / "rl.py",
               *sorted((ROOT / "recipes" / "nft").glob("*.yaml"))]
    dirs: dict[tuple[str, bool], set[str]] = {}
    for src in sources:
        for line in src.read_text(encoding="utf-8").splitlines():
            m = re.search(r"((?:torchrun|rewardkit) .*rl nft .*)", line.lstrip("# "))
            if not m or "--config" not in m.group(1):
                continue
            words = m.group(1).split("  #")[0].replace("`", " ").split()
            recipe = words[words.index("--config") + 1]
            if not (ROOT / recipe).is_file():  # a placeholder such as recipes/nft/NAME.yaml
                continue
            out = [w.split("=", 1)[1] for w in words if w.startswith("output_dir=")]
            if not out:
                out = [yaml.safe_load((ROOT / recipe).read_text())["output_dir"]]
            multi = words[0] == "torchrun"
            dirs.setdefault((recipe, multi), set()).add(out[-1])
    shared = {r: dirs[(r, False)] & dirs[(r, True)] for r, multi in dirs if multi and (r, False) in dirs}
    assert any((r, True) in dirs for r, _ in dirs) and not any(shared.values()), shared
