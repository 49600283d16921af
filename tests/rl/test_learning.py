"""The DiffusionNFT trainer learns: on the tiny random SD3 pipeline, a reward on the decoded images moves the
evaluation images its way (and the opposite reward the other way).

Why the setup is what it is (measured on the tiny pipeline, seed 3; see docs/rl.md "Testing your own setup"):

- The tiny random VAE (one block, ``GroupNorm`` over all channels) normalises a latent's level away: the mean
  brightness of all three colours barely depends on the latents (sample std 6e-4; shifting a latent channel by 1
  moves it by < 0.013, both signs the same way), which is why a brightness reward gave no signal. The blue mean is
  the most linear in the latents: a 0.3 shift of latent channel 0 moves it by 7 sample stds, either way.
- The NFT gradient points the right way (no sign bug): at the start of a run, the cosine between minus the NFT
  loss gradient (32 samples, every rollout timestep) and the gradient of the mean blue of differentiably sampled
  images is 0.90 (with r flipped, -0.90), but one micro-batch's gradient (fresh noise, one timestep) only 0.2-0.77,
  and the timestep 0.009 of a 2-step schedule 0.10. So: 3 sampling steps (sigmas 1, 0.75, 0.009), 16 px, one
  optimizer step per epoch on the whole epoch's gradient, lr 2e-2, and a LoRA that can shift the output's level
  and follow the pooled text (``proj_out``, ``norm_out.linear``, the text embedder, besides the attention
  projections). With 4 optimizer steps per epoch at lr 1e-1 the reward wandered (both signs of the reward first
  lowered the blue; at 32 px the mean moved by < 1e-3 in 8 epochs).
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from rewardkit.reward import Reward, RewardOutput  # noqa: E402

pytestmark = pytest.mark.slow

CHANNEL = 2  # blue
TARGETS = {"bright": 1.0, "dark": -1.0}
# the attention projections, and the paths that shift the output's level and carry the pooled text
LORA_TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "proj_out", "norm_out.linear",
                "text_embedder.linear_1", "text_embedder.linear_2"]


class ChannelMean(Reward):
    """The mean of one colour channel of the decoded image (float tensors, no uint8 rounding), times ``sign``."""

    name = "test-channel-mean"
    uses_prompt = False

    def __init__(self, config=None, channel: int = CHANNEL, sign: float = 1.0):
        super().__init__()
        self.channel, self.sign = channel, sign

    @property
    def supports_tensor_input(self) -> bool:
        return True

    def _score(self, batch):
        x = batch.images[:, self.channel].float().mean(dim=(1, 2))
        return RewardOutput(scores=self.sign * x.cpu())


class TargetChannelMean(Reward):
    """``+mean`` of a colour channel for a prompt row with ``target: bright``, ``-mean`` for ``target: dark``; NaN
    with a reason when the row has no such target (fail loud). ``ignore_metadata`` (the control): ``+mean`` for
    every sample. Dimensions ``bright`` / ``dark``: the channel mean of the samples of each target (NaN for the
    others), so the evaluation logs a mean per target."""

    name = "test-target-channel-mean"
    uses_prompt = False

    def __init__(self, config=None, channel: int = CHANNEL, ignore_metadata: bool = False):
        super().__init__()
        self.channel, self.ignore_metadata = channel, ignore_metadata

    @property
    def supports_tensor_input(self) -> bool:
        return True

    def _score(self, batch):
        x = batch.images[:, self.channel].float().mean(dim=(1, 2)).cpu().tolist()
        targets = [m.get("target") for m in batch.metadata]
        dims = {t: torch.tensor([v if tg == t else math.nan for v, tg in zip(x, targets)]) for t in TARGETS}
        if self.ignore_metadata:
            return RewardOutput(scores=torch.tensor(x), dimensions=dims)
        scores = [TARGETS[tg] * v if tg in TARGETS else math.nan for v, tg in zip(x, targets)]
        errors = [None if tg in TARGETS else f"prompt row has no target in {sorted(TARGETS)}: got {tg!r}"
                  for tg in targets]
        return RewardOutput(scores=torch.tensor(scores), valid=torch.tensor([e is None for e in errors]),
                            errors=errors, dimensions=dims)


@pytest.fixture(scope="module")
def tiny_sd3(tmp_path_factory):
    from rewardkit.testing import save_tiny_checkpoint

    return str(save_tiny_checkpoint("sd3", tmp_path_factory.mktemp("rl_learn") / "sd3"))


@pytest.fixture
def custom_rewards(monkeypatch):
    """The two test rewards by name, through the trainer's own loading path (registry.load_reward)."""
    from rewardkit import registry

    ours = {ChannelMean.name: ChannelMean, TargetChannelMean.name: TargetChannelMean}
    resolve, load = registry.resolve_name, registry.load_reward
    monkeypatch.setattr(registry, "resolve_name", lambda n: n if n in ours else resolve(n))
    monkeypatch.setattr(registry, "load_reward",
                        lambda n, *a, **kw: ours[n](*a, **kw) if n in ours else load(n, *a, **kw))


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _run(out, sd3, **over):
    """A tiny NFT run (1 thread); returns the records of metrics.jsonl."""
    from rewardkit.config import _merge, build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import NFTTrainer

    base = {"output_dir": str(out), "seed": 3, "model": {"pretrained": sd3, "max_sequence_length": 8},
            "lora": {"r": 4, "alpha": 8, "target_modules": LORA_TARGETS},
            "sample": {"resolution": 16, "num_steps": 3, "eval_num_steps": 3, "num_groups": 4, "group_size": 16,
                       "batch_size": 16},
            "train": {"lr": 2e-2, "steps_per_epoch": 1, "batch_size": 16, "kl_coef": 0.0, "ema": False},
            "reward_workers": 1, "num_epochs": 8, "eval_every": 8, "mixed_precision": "no", "cpu": True,
            "save_every": 0, "progress": False, "resume": "never", "report_to": ["none"], "torch_threads": 1}
    base["eval_every"] = over.get("num_epochs", base["num_epochs"])  # the baseline and the end
    cfg = build_config(NFTConfig, _merge(base, over, NFTConfig))
    n = torch.get_num_threads()
    tr = NFTTrainer(cfg)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr.train()
    finally:
        tr.close()
        torch.set_num_threads(n)
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _eval_means(recs, key):
    """(baseline, final) evaluation means of ``key`` (the same evaluation noise both times)."""
    ev = [r for r in recs if f"eval/reward/{key}/mean" in r]
    return ev[0][f"eval/reward/{key}/mean"], ev[-1][f"eval/reward/{key}/mean"]



def test_nft_learns_a_colour_reward_and_its_opposite(tmp_path, tiny_sd3, custom_rewards):
    """`rewards: {mean blue: 1}` raises the evaluation images' mean blue, `sign: -1` lowers it (same seed: the same
    prompts, rollout noise and evaluation noise; only the reward's sign differs). EMA off, so the evaluation shows
    the trained weights; the baseline (epoch 0) is the base model, on the held-out prompts.

    Measured (seed 3; 5 epochs of 4 prompts x 16 samples at 16 px, 3 steps, one optimizer step per epoch over all
    64 samples, lr 2e-2, EMA off, KL off): the evaluation mean blue goes 0.5045 -> 0.5458 with +1 and -> 0.4557
    with -1 (the per-image std of the mean blue is about 0.003, so +0.041 / -0.049 is 14-16 image stds, twice the
    0.02 asked). 4 epochs: 0.5375 / 0.4693; 8 epochs: 0.5829 / 0.4372, the training rollouts' mean blue moving
    monotonically, 0.5034 -> 0.5626 / 0.4441 (an epoch mean's std over seeds ~4e-4). With 4 optimizer steps per
    epoch at lr 1e-1 instead, the runs wandered (both signs first lowered the blue): at this size one step on the
    whole epoch's gradient is what learns. A sign bug fails it: with r replaced by 1 - r, +1 ends below the base
    (0.4372 at 8 epochs)."""
    blue = {}
    for sign in (1.0, -1.0):
        recs = _run(tmp_path / f"sign{sign:+}", tiny_sd3, num_epochs=5, prompts="builtin:geneval_tiny",
                    eval_prompts="builtin:geneval_tiny_eval", rewards={ChannelMean.name: 1.0},
                    reward_kwargs={ChannelMean.name: {"sign": sign}})
        base, final = _eval_means(recs, ChannelMean.name)
        blue[sign] = (sign * base, sign * final)  # the blue mean itself
        train = [sign * r["reward/total/mean"] for r in recs if "reward/total/mean" in r]
        print(f"sign {sign:+}: evaluation blue {blue[sign][0]:.5f} -> {blue[sign][1]:.5f}; training blue "
              + " ".join(f"{v:.4f}" for v in train))
    assert blue[1.0][0] == pytest.approx(blue[-1.0][0], abs=1e-7)  # the same base model and noise
    base = blue[1.0][0]
    assert blue[1.0][1] > base + 0.02, blue
    assert blue[-1.0][1] < base - 0.02, blue


def test_nft_learns_a_reward_that_needs_each_prompt_rows_metadata(tmp_path, tiny_sd3, custom_rewards):
    """Issue 23's "a metadata-needing reward learns": prompt rows `{"prompt": "a ball", "target": "bright"}` and
    `{"prompt": "two dogs on a red box", "target": "dark"}`; the reward is +mean blue for `bright`, -mean blue for
    `dark` (NaN with a reason for a row without a target). After training, the `bright` prompt's evaluation images
    are bluer and the `dark` prompt's less blue than at epoch 0: the trainer learned a prompt-dependent direction
    that only the metadata tells. The control (the same run, the reward ignoring the metadata: +mean blue for
    every row) makes both bluer. The target is not in the prompt text, so the evaluation uses the training prompts
    (each row 8 times) with the evaluation's own noise, not held-out prompts.

    Measured (16 epochs of 2 prompts x 32 samples, one optimizer step per epoch, lr 2e-2): seed 3: bright
    0.50330 -> 0.50485 (+0.0016), dark 0.50421 -> 0.50012 (-0.0041); seeds 4, 5, 6: +0.0029 / -0.0023,
    +0.0007 / -0.0031, +0.0023 / -0.0020 (split, bright change - dark change: 0.0038 to 0.0057, mean 0.0048, std
    0.0008). 32 epochs (seed 3): +0.0023 / -0.0040, the signed training reward flattening at ~0.003. The control
    (seed 3, 4 epochs to save time): bright +0.041, dark +0.045 (twice the 0.02 asked); 8 epochs: +0.106 / +0.103;
    with 16 epochs (seeds 5, 6) +0.11 / +0.12 (split -0.003). The tiny model learns a prompt-dependent shift far more slowly than a global one (0.005 in 16 epochs
    against 0.1 in 8: its two prompts' velocities differ by ~7%), hence the small margins; they are still
    several times the spread over seeds (the bright change alone about 2 sigma over seeds). ~10 s here."""
    name = TargetChannelMean.name
    # fail loud: a row without a target is NaN with a reason, not a default
    out = TargetChannelMean()(torch.full((2, 3, 16, 16), 0.5), ["a", "b"], metadata=[{"target": "dark"}, {}])
    assert out.scores[0].item() == pytest.approx(-0.5) and math.isnan(out.scores[1].item())
    assert out.valid.tolist() == [True, False] and "no target" in out.errors[1]

    rows = [{"prompt": "a ball", "target": "bright"}, {"prompt": "two dogs on a red box", "target": "dark"}]
    train = _write_rows(tmp_path / "train.jsonl", rows)
    evals = _write_rows(tmp_path / "eval.jsonl", rows * 8)
    moved = {}
    for ignore, epochs in ((False, 16), (True, 4)):
        recs = _run(tmp_path / f"ignore{ignore}", tiny_sd3, prompts=train, eval_prompts=evals, num_epochs=epochs,
                    rewards={name: 1.0}, reward_kwargs={name: {"ignore_metadata": ignore}},
                    sample={"num_groups": 2, "group_size": 32})
        moved[ignore] = {t: _eval_means(recs, f"{name}.{t}") for t in TARGETS}
        print(f"ignore_metadata={ignore}: " + ", ".join(f"{t} {a:.5f} -> {b:.5f} ({b - a:+.5f})"
                                                       for t, (a, b) in moved[ignore].items()))
    (b0, b1), (d0, d1) = moved[False]["bright"], moved[False]["dark"]
    assert b1 > b0 + 5e-4 and d1 < d0 - 1e-3 and (b1 - b0) - (d1 - d0) > 3e-3, moved
    # the control moves both prompts the same way: no split
    # the same baseline (base model, evaluation noise) in both runs
    assert moved[True]["bright"][0] == pytest.approx(b0, abs=1e-7)
    assert moved[True]["dark"][0] == pytest.approx(d0, abs=1e-7)
    for t in TARGETS:
        a, b = moved[True][t]
        assert b > a + 0.02, moved
