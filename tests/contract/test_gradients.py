"""Gradients to pixels (issue 12): ``reward.score_tensor(images, prompts)`` for clipscore, pickscore and
preference; reward weights frozen; finite differences agree; an AlignProp-style loop raises the score."""

from __future__ import annotations

import pytest
import torch

from rewardkit import load_reward
from rewardkit.errors import RewardInputError
from rewardkit.reward import Reward, RewardOutput

PROMPTS = ["a red apple on a table", "two birds on a branch"]


@pytest.fixture(scope="module")
def rewards(tiny_clip_dir, tmp_path_factory):
    from rewardkit.rewards.preference import PreferenceReward

    return {
        "clipscore": load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine"),
        "pickscore": load_reward("pickscore", model=str(tiny_clip_dir)),
        "preference": PreferenceReward.tiny(str(tmp_path_factory.mktemp("pref-grad"))),
    }


def _params(reward: Reward) -> list[torch.nn.Parameter]:
    mods = [v for v in vars(reward).values() if isinstance(v, torch.nn.Module)]
    mods += [v.model for v in vars(reward).values() if isinstance(getattr(v, "model", None), torch.nn.Module)]
    params = [p for m in mods for p in m.parameters()]
    assert params, "found no reward parameters to check"
    return params


def _images(b=2, h=40, w=56, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (0.25 + 0.5 * torch.rand(b, 3, h, w, generator=g))  # away from the clamp at 0 and 1


@pytest.mark.parametrize("name", ["clipscore", "pickscore", "preference"])
def test_gradients_reach_pixels_and_never_weights(rewards, name):
    reward = rewards[name]
    assert reward.differentiable
    x = _images().requires_grad_(True)
    scores = reward.score_tensor(x, PROMPTS)
    assert scores.shape == (2,) and scores.dtype == torch.float32 and scores.requires_grad
    torch.testing.assert_close(scores.detach(), reward(x.detach(), PROMPTS).scores, atol=1e-5, rtol=0)
    scores.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert float(x.grad.abs().sum()) > 0
    # each sample's score depends on its own pixels only
    x2 = _images().requires_grad_(True)
    reward.score_tensor(x2, PROMPTS)[0].backward()
    assert float(x2.grad[0].abs().sum()) > 0 and float(x2.grad[1].abs().sum()) == 0
    params = _params(reward)
    assert all(not p.requires_grad and p.grad is None for p in params)


@pytest.mark.parametrize("name", ["clipscore", "preference"])
def test_gradient_agrees_with_finite_differences(rewards, name):
    """Directional derivative along a random direction: autograd vs central differences."""
    reward = rewards[name]
    x = _images(b=1, h=36, w=44, seed=1)
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    v = v / v.norm()
    xg = x.clone().requires_grad_(True)
    reward.score_tensor(xg, PROMPTS[:1]).sum().backward()
    analytic = float((xg.grad * v).sum())
    eps = 1e-2
    with torch.no_grad():
        plus = float(reward.score_tensor(x + eps * v, PROMPTS[:1]).sum())
        minus = float(reward.score_tensor(x - eps * v, PROMPTS[:1]).sum())
    numeric = (plus - minus) / (2 * eps)
    assert abs(analytic) > 1e-4
    assert abs(analytic - numeric) <= 0.02 * abs(analytic) + 1e-5, (analytic, numeric)


def test_alignprop_style_loop_raises_the_score(rewards):
    """20 Adam steps on the pixels of a tiny image, from random noise, maximising pickscore."""
    reward = rewards["pickscore"]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 3, 32, 32, generator=g).requires_grad_(True)  # pixels = sigmoid(logits)
    opt = torch.optim.Adam([logits], lr=0.05)
    history = []
    for _ in range(20):
        score = reward.score_tensor(torch.sigmoid(logits), PROMPTS[0])
        history.append(float(score.detach()))
        opt.zero_grad()
        (-score.sum()).backward()
        opt.step()
    final = float(reward(torch.sigmoid(logits).detach(), PROMPTS[0]).scores[0])
    assert final > history[0] + 1.0, history  # pickscore scale: logit_scale * cos (~14 for the tiny model)
    assert sum(b > a for a, b in zip(history, history[1:])) >= 15, history  # mostly monotone
    assert all(p.grad is None for p in _params(reward))


def test_score_tensor_refuses_bad_input(rewards):
    reward = rewards["clipscore"]
    x = _images(b=3)
    x[2, 0, 0, 0] = float("nan")
    with pytest.raises(RewardInputError) as exc:
        reward.score_tensor(x, "a cat")
    assert exc.value.index == 2 and "NaN" in str(exc.value)
    with pytest.raises(RewardInputError, match="float tensor"):
        reward.score_tensor((_images() * 255).to(torch.uint8), "a cat")
    with pytest.raises(RewardInputError, match="float tensor"):
        reward.score_tensor(list(_images()), "a cat")
    with pytest.raises(RewardInputError) as exc:
        reward.score_tensor(_images(), ["a cat", 3])  # (clipscore scores an empty prompt: docs/zoo.md)
    assert exc.value.index == 1


def test_score_tensor_needs_a_differentiable_reward():
    class Flat(Reward):
        name = "flat"

        def _score(self, batch):
            return RewardOutput(scores=torch.zeros(len(batch)))

    with pytest.raises(TypeError, match="not differentiable"):
        Flat().score_tensor(_images(), "a cat")


def test_calls_never_build_graphs(rewards):
    x = _images().requires_grad_(True)
    out = rewards["clipscore"](x, PROMPTS)
    assert not out.scores.requires_grad and x.grad is None


def test_ls_shows_differentiable(capsys):
    from rewardkit.commands.ls import describe_rewards, run

    rows = {r["name"]: r for r in describe_rewards()}
    assert rows["clipscore"]["differentiable"] and rows["pickscore"]["differentiable"]
    assert rows["preference"]["differentiable"] and not rows["ocr"]["differentiable"]
    import argparse

    run(argparse.Namespace(json=False))
    out = capsys.readouterr().out
    header, *lines = out.splitlines()
    assert "grad" in header.split()
    clip_line = next(line for line in lines if line.startswith("clipscore"))
    assert " yes " in clip_line
