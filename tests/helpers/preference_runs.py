"""Tiny preference-training runs (recipes/arena_rm/tiny.yaml) that record every optimizer step: the gradients
after clipping / unscaling, their total norm and the param groups' learning rates."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rewardkit.config import load_config
from rewardkit.train.trainer import PreferenceTrainConfig, PreferenceTrainer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "arena_rm" / "tiny.yaml"
# small and fast: one micro-batch of 4 pairs per step, no eval set, no periodic checkpoints, constant lr
FAST = ["progress=false", "data.eval=null", "data.synthetic_size=16", "micro_batch_size=4", "global_batch_size=4",
        "save_every=0", "log_every=1", "optim.schedule=constant", "optim.weight_decay=0.0"]


def tiny_cfg(out: Path, *overrides: str) -> PreferenceTrainConfig:
    return load_config(PreferenceTrainConfig, TINY, [f"output_dir={out}", *FAST, *overrides])


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _inner(opt):
    return opt.optimizer if hasattr(opt, "optimizer") else opt


def run_recording(cfg: PreferenceTrainConfig, before_train=None) -> dict:
    """Train, recording at every optimizer step (after clipping / unscaling, before the update) the
    gradients, their total norm, and the param groups' lrs."""
    tr = PreferenceTrainer(cfg)
    if before_train is not None:
        before_train(tr)
    names = {id(p): n for n, p in tr.model_raw.named_parameters()}
    steps: list[dict] = []

    def hook(opt, args, kwargs):
        grads = {names[id(p)]: p.grad.detach().clone() for g in opt.param_groups for p in g["params"]
                 if p.grad is not None}
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads.values()]))
        steps.append({"grads": grads, "norm": float(norm), "lrs": [g["lr"] for g in opt.param_groups]})

    _inner(tr.opt).register_step_pre_hook(hook)
    start = {n: p.detach().clone() for n, p in tr.model_raw.named_parameters()}
    summary = tr.train()
    return {"trainer": tr, "steps": steps, "start": start, "summary": summary, "metrics": metrics(Path(cfg.output_dir))}
