"""Evaluation of the NFT trainer: held-out prompts (``eval_prompts``), the EMA weights, its own sampler
(``sample.eval_solver`` / ``sample.eval_num_steps``), the same noise per prompt every time, whatever the number
of processes and the batch size (the starting noise, and an SDE eval solver's step noise: one generator per
prompt), per-reward means and a PNG grid of the first ``eval_grid`` images.

Called before the first epoch (the baseline: the starting model; the base model unless ``model.init_lora`` /
``model.transformer`` give another), every
``eval_every`` epochs and after the last one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .runtime import _EVAL, _gen

if TYPE_CHECKING:  # pragma: no cover
    from .config import NFTConfig
    from .runtime import _Dist
    from .scoring import _RewardScorer
    from .sd3 import Cond, SD3Policy
    from .solvers import Generators

__all__ = ["evaluate", "write_grid", "EvaluatedTrainer"]


class EvaluatedTrainer(Protocol):
    """What an evaluation uses of the trainer (:class:`~rewardkit.rl.trainer.NFTTrainer` has it): the functions
    here take it as an argument and never import the trainer, which imports them."""

    cfg: NFTConfig
    dist: _Dist
    device: torch.device
    policy: SD3Policy
    scorer: _RewardScorer
    trainable: list[torch.nn.Parameter]
    ema: list[torch.Tensor] | None
    eval_prompts: list[str]
    eval_metadata: list[dict[str, Any]]

    def _rollout(self, c_orig: Cond, c_opt: Cond, noise: torch.Tensor, gen: Generators,
                 steps: int | None = None, solver: str | None = None, use_old: bool = True,
                 guidance_scale: float | None = None) -> torch.Tensor: ...


@torch.no_grad()
def evaluate(tr: EvaluatedTrainer) -> tuple[dict[str, float], torch.Tensor, list[str]]:
    """``(metrics, grid_images, grid_prompts)``: ``eval/reward/<name>/mean`` over all processes' samples, and on
    the main process the first ``eval_grid`` images (float ``[G, 3, H, W]`` in [0, 1], prompt order)."""
    cfg, s = tr.cfg, tr.cfg.sample
    n = len(tr.eval_prompts)
    if n == 0:
        raise ValueError("no evaluation prompts: they load when eval_every > 0 (eval_prompts)")
    rank, world = tr.dist.rank, tr.dist.world
    idx = list(range(n))[rank::world]
    backup = [p.detach().clone() for p in tr.trainable]
    if tr.ema is not None:
        for p, e in zip(tr.trainable, tr.ema):
            p.copy_(e)
    results, grid_local = [], []
    grid_n = min(cfg.eval_grid, n)
    try:
        for start in range(0, len(idx), s.batch_size):
            ids = idx[start:start + s.batch_size]
            texts = [tr.eval_prompts[i] for i in ids]
            cond = tr.policy.encode(texts)
            shape = tr.policy.latent_shape(1, s.resolution)
            noise = torch.cat([torch.randn(shape, generator=_gen(cfg.seed, _EVAL, i)) for i in ids]).to(tr.device)
            steps_noise = [_gen(cfg.seed, _EVAL, n + i) for i in ids]  # an SDE solver's, per prompt
            x0 = tr._rollout(cond, cond, noise, steps_noise, steps=s.eval_num_steps,
                             solver=s.eval_solver, use_old=False, guidance_scale=s.eval_guidance_scale)
            images = tr.policy.decode(x0).float().cpu()
            results.append(tr.scorer(images, texts, [tr.eval_metadata[i] for i in ids]))
            grid_local += [images[j] for j, i in enumerate(ids) if i < grid_n]
    finally:
        with torch.no_grad():
            for p, b in zip(tr.trainable, backup):
                p.copy_(b)
    fin = tr.scorer.finalize(results, torch.tensor(idx, dtype=torch.long))
    comps = {"total": fin["total"], **fin["components"], **fin["dimensions"]}
    if tr.scorer.deferred:
        # a batch-relative composite's value is relative to the other samples (its mean is 0 by construction):
        # log its axes' raw scores, not the z-scores, its component or the total
        deferred = tr.scorer.deferred
        comps = {k: v for k, v in comps.items()
                 if k != "total" and k not in deferred
                 and not (k.split(".", 1)[0] in deferred and k.rsplit("/", 1)[-1] in ("z", "z_vetoed"))}
    keys = sorted(comps)
    # per key: (sum of finite values, count) summed over processes
    stats = torch.tensor([[float(comps[k][torch.isfinite(comps[k])].sum()), float(torch.isfinite(comps[k]).sum())]
                          for k in keys], dtype=torch.float64, device=tr.device).reshape(len(keys), 2)
    if world > 1:
        torch.distributed.all_reduce(stats)
    metrics = {f"eval/reward/{k}/mean": (float(a / c) if c else float("nan")) for k, (a, c) in zip(keys, stats.tolist())}
    grid = _gather_grid(tr, grid_local, grid_n)
    return metrics, grid, [tr.eval_prompts[i] for i in range(grid_n)]


def _gather_grid(tr: EvaluatedTrainer, local: list[torch.Tensor], grid_n: int) -> torch.Tensor:
    """The first ``grid_n`` evaluation images in prompt order (prompt ``i`` was sampled by process
    ``i % world``), gathered as uint8 (collective: every process calls it)."""
    world = tr.dist.world
    if grid_n == 0:
        return torch.zeros(0)
    h = tr.cfg.sample.resolution
    per = math.ceil(grid_n / world)
    buf = torch.zeros(per, 3, h, h, dtype=torch.uint8)
    for j, im in enumerate(local):
        buf[j] = (im.clamp(0, 1) * 255).round().to(torch.uint8)
    allb = tr.dist.gather_cat(buf.to(tr.device)).cpu().view(world, per, 3, h, h)
    return torch.stack([allb[i % world, i // world] for i in range(grid_n)]).float() / 255


def write_grid(images: torch.Tensor, path: Path, cols: int = 4) -> Path | None:
    """A PNG grid of ``images`` float ``[N, 3, H, W]`` in [0, 1], written atomically; None when empty."""
    if not len(images):
        return None
    from PIL import Image

    n, _, h, w = images.shape
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    sheet = torch.ones(3, rows * h, cols * w)
    for i, im in enumerate(images):
        r, c = divmod(i, cols)
        sheet[:, r * h:(r + 1) * h, c * w:(c + 1) * w] = im.clamp(0, 1)
    arr = (sheet.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    tmp = path.with_name(path.name + ".tmp.png")
    Image.fromarray(arr).save(tmp)
    tmp.replace(path)
    return path
