"""The claims of docs/rl.md that had no test that could fail: the documented defaults and presets, start checks
before any model loads, ``resume: auto``, fp16 epochs (autocast, fp32 VAE, AdamW, clipping, logged keys), the
reward scorer's weighted sum, the side-by-side table's option names, ``report_to``'s library checks, and the
wandb run a resume continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rewardkit.reward import Reward, RewardOutput


# ============================================================================================== docs/rl.md
def test_rl_defaults_and_presets_are_the_documented_ones():
    """docs/rl.md "Defaults (DiffusionNFT's official code) and presets" and the E²PO knob table, row by row."""
    from rewardkit.config import build_config
    from rewardkit.rl.config import PRESETS, NFTConfig, preset

    c = NFTConfig()
    m, s, t, lo = c.model, c.sample, c.train, c.lora
    assert "stable-diffusion-3.5-medium" in m.pretrained and m.max_sequence_length == 128
    assert (s.num_steps, s.solver, s.resolution, s.group_size, s.num_groups) == (10, "dpm2", 512, 24, 48)
    assert (s.batch_size, t.batch_size, s.eval_num_steps, s.eval_solver) == (9, 9, 40, "euler")
    assert (lo.r, lo.alpha, lo.init) == (32, 64.0, "gaussian")
    assert len(lo.target_modules) == 8 and all(x.startswith("attn.") for x in lo.target_modules)
    assert c.mixed_precision == "fp16" and c.seed == 42 and c.invalid_rewards == "drop" and c.resume == "auto"
    assert (t.lr, t.adam_beta1, t.adam_beta2, t.weight_decay, t.adam_eps) == (3e-4, 0.9, 0.999, 1e-4, 1e-8)
    assert (t.beta, t.kl_coef, t.adv_clip_max, t.timestep_fraction) == (1.0, 1e-4, 5.0, 0.99)
    assert (t.decay_type, t.ema, t.ema_decay, t.max_grad_norm, t.steps_per_epoch) == ("linear_to_0_5", True, 0.9, 1.0, 1)
    e = c.e2po
    assert (e.enabled, e.num_variants, e.steps, e.lr, e.weight_decay, e.sigma_init, e.delta_max) == \
        (False, 12, 300, 1e-3, 0.01, 1e-4, 0.05)
    assert (e.lambda_div, e.mu, e.eps, e.rho, e.encoders, e.truncate_after_eos, e.warn_band) == \
        (50.0, 0.80, 0.01, 0.4, ["clip_l"], True, 0.1)
    assert set(PRESETS) == {"geneval", "pickscore", "hpsv2", "ocr", "multi_reward", "e2po_geneval_k12",
                            "e2po_geneval_k4", "e2po_pickscore_k3"}
    built = {name: build_config(NFTConfig, preset(name)) for name in PRESETS}
    assert {n: b.train.beta for n, b in built.items() if b.train.beta != 1.0} == {"ocr": 0.1, "multi_reward": 0.1}
    assert {n: b.train.decay_type for n, b in built.items() if b.train.decay_type != "linear_to_0_5"} == \
        {"ocr": "delayed_linear_to_0_999"}
    e2po = {n: (b.e2po.enabled, b.e2po.num_variants, b.e2po.lambda_div, b.sample.group_size % b.e2po.num_variants)
            for n, b in built.items() if b.e2po.enabled}
    assert e2po == {"e2po_geneval_k12": (True, 12, 50.0, 0), "e2po_geneval_k4": (True, 4, 100.0, 0),
                    "e2po_pickscore_k3": (True, 3, 50.0, 0)}
    assert set(built["multi_reward"].rewards) == {"pickscore", "hpsv2", "clipscore"}


def test_rl_start_checks_fail_before_any_model_loads(tmp_path):
    """docs/rl.md: a preset naming a reward rewardkit does not register fails at start with the list of known
    rewards; num_groups x group_size must be a multiple of processes x sample.batch_size. (The pipeline path does
    not exist: reaching it would be a different error.)"""
    from rewardkit.config import build_config
    from rewardkit.registry import RegistryError
    from rewardkit.rl.config import NFTConfig, preset
    from rewardkit.rl.trainer import NFTTrainer

    small = {"model": {"pretrained": str(tmp_path / "no-such-pipeline")}, "cpu": True, "output_dir": str(tmp_path / "o"),
             "sample": {"batch_size": 4, "num_groups": 2, "group_size": 4}, "train": {"batch_size": 4}}
    from rewardkit.config import _merge

    with pytest.raises(RegistryError, match=r"'no-such-reward'.*Known rewards: .*pickscore"):
        NFTTrainer(build_config(NFTConfig, _merge(small, {"rewards": {"no-such-reward": 1.0}})))
    with pytest.raises(ValueError, match="geneval needs model=.*rewardkit convert geneval"):  # registered; no weights
        NFTTrainer(build_config(NFTConfig, _merge(preset("geneval"), small)))
    with pytest.raises(ValueError, match="hpsv2 needs model=.*rewardkit convert hpsv2"):  # registered; no weights
        NFTTrainer(build_config(NFTConfig, _merge(preset("hpsv2"), small)))
    odd = _merge(small, {"sample": {"batch_size": 3}})
    with pytest.raises(ValueError, match="multiple of processes"):
        NFTTrainer(build_config(NFTConfig, odd))


@pytest.fixture(scope="module")
def rl_tiny_dirs(tmp_path_factory, tiny_clip_dir):
    pytest.importorskip("diffusers")
    from rewardkit.testing import save_tiny_checkpoint

    return {"sd3": str(save_tiny_checkpoint("sd3", tmp_path_factory.mktemp("rl_sd3"))), "clip": str(tiny_clip_dir)}


def _rl_cfg(out, dirs, **over):
    from rewardkit.config import _merge, build_config
    from rewardkit.rl.config import NFTConfig

    base = {"output_dir": str(out), "seed": 3, "cpu": True, "mixed_precision": "no", "progress": False,
            "resume": "never", "num_epochs": 1, "reward_workers": 1, "save_every": 1, "eval_every": 0,
            "model": {"pretrained": dirs["sd3"], "max_sequence_length": 8}, "lora": {"r": 4, "alpha": 8},
            "sample": {"num_steps": 2, "resolution": 32, "batch_size": 4, "num_groups": 2, "group_size": 2},
            "train": {"batch_size": 4, "lr": 1e-3, "ema": False},
            "rewards": {"pickscore": 1.0}, "reward_kwargs": {"pickscore": {"model": dirs["clip"], "device": "cpu"}}}
    return build_config(NFTConfig, _merge(base, over))


@pytest.mark.slow
def test_rl_resume_auto_continues_and_never_starts_over(tmp_path, rl_tiny_dirs):
    """docs/rl.md: running the same command again resumes from checkpoints/latest (metrics before it kept);
    `resume=never` starts over; `resume=<dir>` names a checkpoint, which must exist."""
    from rewardkit.rl.trainer import NFTTrainer

    def epochs():
        return [json.loads(x).get("epoch") if "final" not in x else "final"
                for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def run(**over):
            """Train; return (summary, the epochs this run computed itself)."""
            tr = NFTTrainer(_rl_cfg(tmp_path, rl_tiny_dirs, **over))
            ran, real = [], tr.run_epoch
            tr.run_epoch = lambda: (ran.append(tr.epoch + 1), real())[1]
            out = tr.train()
            return (out["epoch"], out["global_step"], ran)

        assert run(num_epochs=1) == (1, 1, [1]) and epochs() == [1, "final"]
        assert run(num_epochs=2, resume="auto") == (2, 2, [2]) and epochs() == [1, 2, "final"]  # epoch 1 not redone
        ckpt = tmp_path / "checkpoints" / "epoch-000001"
        assert ckpt.is_dir()
        assert run(num_epochs=1, resume="never") == (1, 1, [1]) and epochs() == [1, "final"]
        assert run(num_epochs=2, resume=str(ckpt)) == (2, 2, [2])
        with pytest.raises(FileNotFoundError, match="resume checkpoint not found"):
            NFTTrainer(_rl_cfg(tmp_path, rl_tiny_dirs, resume=str(tmp_path / "nope"))).train()
    finally:
        torch.set_num_threads(n_threads)


class _RecordingWandb:
    """A stand-in for the ``wandb`` module (not a rewardkit dependency) that records each ``wandb.init``'s keyword
    arguments and each run's ``log`` steps; a run's id is the one passed, else a new one, as wandb does."""

    def __init__(self):
        self.inits: list[dict] = []
        self.steps: list[list[int]] = []

    def init(self, **kw):
        from types import SimpleNamespace

        self.inits.append(kw)
        steps: list[int] = []
        self.steps.append(steps)
        return SimpleNamespace(id=kw.get("id") or f"new-{len(self.inits)}",
                               log=lambda values, step=None: steps.append(step), finish=lambda: None)


@pytest.mark.slow
def test_rl_resume_continues_the_wandb_run_it_was_saved_with(tmp_path, rl_tiny_dirs, monkeypatch):
    """Bug: a resumed run with report_to: wandb started a new wandb run (no run id was saved). The checkpoint
    keeps the run id; the resumed run passes it back (``wandb.init(id=..., resume="allow")``), and a resume
    without wandb keeps it for the next one. ``wandb`` is a recording double here (it is not installed)."""
    import sys

    from rewardkit.rl.trainer import NFTTrainer, latest_checkpoint

    wandb = _RecordingWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)

    def saved_id():
        return json.loads((latest_checkpoint(tmp_path) / "state.json").read_text()).get("wandb_run_id")

    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def run(**over):
            return NFTTrainer(_rl_cfg(tmp_path, rl_tiny_dirs, log_images_every=0, **over)).train()

        run(num_epochs=1, report_to=["wandb"])
        assert wandb.inits[0]["id"] is None and wandb.inits[0]["resume"] == "allow"
        assert saved_id() == "new-1" and wandb.steps[0] == [1, 1]  # the step's terms, the epoch's record
        run(num_epochs=2, resume="auto", report_to=["wandb"])
        assert wandb.inits[1]["id"] == "new-1" and wandb.inits[1]["resume"] == "allow"
        assert saved_id() == "new-1" and wandb.steps[1] == [2, 2]
        run(num_epochs=3, resume="auto", report_to=["none"])
        assert len(wandb.inits) == 2 and saved_id() == "new-1"  # kept for a later resume with wandb
    finally:
        torch.set_num_threads(n_threads)


def test_rl_trackers_pass_a_saved_wandb_run_id_back(tmp_path, monkeypatch):
    """The tracker opens wandb with the saved run id and ``resume="allow"`` (the wandb docs' "Resume a run"),
    and with no id on a fresh start (wandb makes one). ``wandb`` is a recording double here."""
    import sys

    from rewardkit.rl.tracking import Trackers

    wandb = _RecordingWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    assert Trackers(["wandb"], tmp_path, main=True).wandb.id == "new-1"
    assert Trackers(["wandb"], tmp_path, main=True, resume_step=3, wandb_id="abc123").wandb.id == "abc123"
    assert [(kw["id"], kw["resume"], kw["dir"]) for kw in wandb.inits] == [(None, "allow", str(tmp_path)),
                                                                          ("abc123", "allow", str(tmp_path))]
    Trackers(["wandb"], tmp_path, main=False, wandb_id="abc123")  # other processes open no tracker
    assert len(wandb.inits) == 2


@pytest.mark.slow
def test_rl_trackers_continue_the_same_wandb_run_with_real_wandb_offline(tmp_path, monkeypatch):
    """With wandb installed (it is in no rewardkit extra; skipped without it): offline, the resumed tracker's
    run has the id of the first one (checked with wandb 0.31.0)."""
    pytest.importorskip("wandb")
    from rewardkit.rl.tracking import Trackers

    for var, sub in (("WANDB_DIR", ""), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = Trackers(["wandb"], tmp_path, main=True, config={"seed": 1})
    run_id = first.wandb.id
    first.log({"x": 1.0}, 1)
    first.close()
    again = Trackers(["wandb"], tmp_path, main=True, config={"seed": 1}, resume_step=1, wandb_id=run_id)
    assert again.wandb.id == run_id
    again.log({"x": 2.0}, 2)
    again.close()
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))) == 2


def test_rl_fp16_epoch_autocast_fp32_vae_adamw_clipping_and_logged_keys(tmp_path, rl_tiny_dirs):
    """docs/rl.md: fp16 = autocast (the transformer's matmuls run in fp16) + GradScaler with fp32 master weights and
    an fp32 VAE; AdamW with the configured betas / weight decay / eps; gradients clipped to train.max_grad_norm
    before the step (grad_norm logs the norm before clipping); the epoch record has the documented keys."""
    from rewardkit.rl.trainer import NFTTrainer

    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest
    try:
        cfg = _rl_cfg(tmp_path, rl_tiny_dirs, mixed_precision="fp16", save_every=0, train={"max_grad_norm": 1e-4})
        tr = NFTTrainer(cfg)
        seen = {"transformer": set(), "vae": set()}
        lin = next(mod for n, mod in tr.policy.transformer.named_modules()
                   if isinstance(mod, torch.nn.Linear) and n.endswith("to_q.base_layer"))
        lin.register_forward_hook(lambda mod, i, o: seen["transformer"].add(o.dtype))
        tr.policy.vae.decoder.register_forward_hook(lambda mod, i, o: seen["vae"].add(o.dtype))
        norms = []

        def at_step(opt, args, kwargs):
            g = [p.grad.double().norm() for grp in opt.param_groups for p in grp["params"] if p.grad is not None]
            norms.append(float(torch.stack(g).norm()))

        tr.opt.register_step_pre_hook(at_step)
        group = tr.opt.param_groups[0]
        assert type(tr.opt) is torch.optim.AdamW
        assert (group["lr"], group["betas"], group["weight_decay"], group["eps"]) == (1e-3, (0.9, 0.999), 1e-4, 1e-8)
        rec = tr.run_epoch()
    finally:
        torch.set_num_threads(n_threads)
    assert seen == {"transformer": {torch.float16}, "vae": {torch.float32}}
    assert all(p.dtype == torch.float32 for p in tr.trainable)
    assert tr.scaler.is_enabled() and rec["grad_scale"] == tr.scaler.get_scale()
    assert len(norms) == 1 and norms[0] == pytest.approx(1e-4, rel=1e-3)   # clipped to max_grad_norm
    assert rec["grad_norm"] > 1e-3                                        # the norm before clipping
    documented = {"reward/pickscore/mean", "reward/pickscore/std", "zero_std_group_ratio", "invalid_rewards", "r/mean",
                  "r/hist", "total_loss", "policy_loss", "unweighted_policy_loss", "kl_div", "old_kl_div",
                  "old_deviate", "old_deviate_max", "x0_norm", "x0_norm_max", "policy_loss_plain_mse",
                  "reward/total/max", "reward/total/min", "grad_norm", "grad_scale", "old_decay", "time/e2po_s", "time/sample_s", "time/train_s"}
    assert documented <= set(rec), sorted(documented - set(rec))
    assert rec["old_decay"] == pytest.approx(min(0.001 * 1, 0.5))         # d = min(0.001 step, 0.5) after step 1


def test_rl_reward_scorer_weighted_sum_components_dimensions_and_nan(tmp_path, monkeypatch):
    """docs/rl.md "Rewards": each reward gets the decoded float NCHW images in [0, 1] and the prompts with
    on_error="nan"; the training reward is sum(weight * score); each component and each reward dimension is
    kept for the logs; a sample missing any component has no total (NaN) and its reason."""
    from rewardkit import registry
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import _RewardScorer

    class Fake(Reward):
        name = "fake"

        def __init__(self, offset):
            super().__init__()
            self.offset, self.seen = offset, []

        def __call__(self, images, prompts, **kw):
            self.seen.append((images, list(prompts), kw))
            v = images.mean(dim=(1, 2, 3)).double() + self.offset
            bad = images.mean(dim=(1, 2, 3)) < 0.05
            return RewardOutput(scores=torch.where(bad, float("nan"), v).float(),
                                errors=["too dark" if b else None for b in bad.tolist()],
                                dimensions={"half": (v / 2).float()})

        def _score(self, batch):  # unused: __call__ is overridden to see the call's arguments
            raise AssertionError

    fakes = {"ra": Fake(1.0), "rb": Fake(-3.0)}
    monkeypatch.setattr(registry, "resolve_name", lambda n: n)
    monkeypatch.setattr(registry, "load_reward", lambda name, **kw: fakes[name])
    cfg = NFTConfig(rewards={"ra": 2.0, "rb": -0.5})
    scorer = _RewardScorer(cfg, tmp_path, None)
    x = torch.stack([torch.full((3, 8, 8), v) for v in (0.2, 0.01, 0.7)])
    out = scorer(x, ["p0", "p1", "p2"])
    for f in fakes.values():
        images, prompts, kw = f.seen[-1]
        assert images is x and prompts == ["p0", "p1", "p2"] and kw.get("on_error") == "nan"
    m = torch.tensor([0.2, 0.01, 0.7], dtype=torch.float64)
    expected = 2.0 * (m + 1.0) - 0.5 * (m - 3.0)
    assert torch.allclose(out["total"][[0, 2]], expected[[0, 2]], atol=1e-6) and torch.isnan(out["total"][1])
    assert set(out["components"]) == {"ra", "rb"} and set(out["dimensions"]) == {"ra.half", "rb.half"}
    assert torch.allclose(out["components"]["ra"][[0, 2]], (m + 1.0)[[0, 2]], atol=1e-6)
    assert out["errors"] == [None, "ra: too dark", None]


# dropin's options (CFG, DDIM, integer timestep, init_lora): in the table by their real names; on a branch
# without them yet they are the only names allowed to be missing (empty this set once both branches are merged)
_OPTIONS_FROM_OTHER_BRANCHES: set[str] = set()


def test_rl_side_by_side_table_names_real_options():
    """docs/rl.md "Side by side with the official script": every option the "ours" column names is a field of
    NFTConfig (dotted paths into its sections), and every NFTConfig field appears somewhere in docs/rl.md."""
    import dataclasses
    import re

    from rewardkit.rl.config import NFTConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "rl.md").read_text(encoding="utf-8")
    section = text.split("### Side by side with the official script", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| official")]
    assert len(rows) > 40

    def fields(cls, prefix=""):
        out = set()
        for f in dataclasses.fields(cls):
            out.add(prefix + f.name)
            sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(sub):
                out |= fields(type(sub), prefix + f.name + ".")
        return out

    known = fields(NFTConfig)
    sections = {k for k in known if "." not in k}
    named = set()
    for row in rows:
        ours = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))][2]
        for tok in re.findall(r"`([a-z0-9_.]+)`", ours):
            if "." in tok and tok.split(".")[0] not in sections:
                continue
            if tok.split(".")[0] in sections or tok in known:
                # "train.lr, adam_beta1, ..." names the section's fields after the first
                named.add(tok)
        lead = re.match(r"`(\w+)\.\w+`", ours)
        if lead:
            for tok in re.findall(r", `?(\w+)`?", ours.split(":")[0]):
                if tok and not tok[0].isdigit() and f"{lead.group(1)}.{tok}" in known:
                    named.add(f"{lead.group(1)}.{tok}")
    missing = {n for n in named if n not in known and not n.endswith(".*")} - _OPTIONS_FROM_OTHER_BRANCHES
    assert not missing, sorted(missing)
    assert {"rewards", "eval_prompts", "report_to", "save_every_steps", "train.kl_coef", "sample.group_size"} <= named
    leaves = known - {k for k in known if any(o.startswith(k + ".") for o in known)}
    undocumented = {k for k in leaves if not re.search(rf"`({re.escape(k)}|{re.escape(k.split('.')[-1])})[`:]", text)}
    assert not undocumented, sorted(undocumented)


def test_rl_report_to_checks_its_libraries_before_any_model(tmp_path, monkeypatch, capsys):
    """docs/rl.md "Experiment tracking": report_to=wandb without wandb installed fails at start with the pip
    command; report_to accepts a comma-separated word; [none] alone; unknown trackers are refused."""
    import sys

    from rewardkit.config import build_config, parse_overrides
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.tracking import _wandb_mode, check_report_to

    cfg = build_config(NFTConfig, None, parse_overrides(["report_to=tensorboard,wandb"]))
    cfg.validate()
    assert cfg.report_to == ["tensorboard", "wandb"]
    for bad in (["mlflow"], ["none", "wandb"], None):  # (report_to: null was a TypeError, "internal error")
        with pytest.raises(ValueError, match="report_to"):
            NFTConfig(report_to=bad).validate()
    monkeypatch.setitem(sys.modules, "wandb", None)  # not importable
    from rewardkit.errors import MissingDependencyError

    # a MissingDependencyError (the CLI's exit 2) with wandb's own pip command; it was a plain ImportError, which
    # the CLI reports as "internal error ... please report it" (exit 1)
    with pytest.raises(MissingDependencyError, match="pip install wandb\n"):
        check_report_to(["wandb"])
    from rewardkit.cli import main

    assert main(["rl", "nft", f"output_dir={tmp_path / 'w'}", "report_to=null"]) == 2
    assert "report_to" in capsys.readouterr().err
    check_report_to(["none"])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert _wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _wandb_mode() == "disabled"
    with pytest.raises(ValueError, match="eval_num_prompts=4"):
        build_config(NFTConfig, {"eval_prompts": 4}).validate()  # the old meaning of eval_prompts
