"""Checkpoints of the NFT trainer: ``checkpoints/epoch-N`` (after epoch N) and ``checkpoints/epoch-N-step-S``
(after optimizer step S, inside epoch N + 1): the trained, old and EMA adapters, the optimizer, the GradScaler,
each process's RNG state, and for a mid-epoch checkpoint each process's rollouts (final latents, prompt ids,
variants), optimality probabilities and training-generator state. Written to ``*.tmp`` and published by one
rename; ``latest`` names the newest. The LoRA for inference (``lora/``) holds the EMA weights."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .._imports import require

if TYPE_CHECKING:  # pragma: no cover
    from .config import NFTConfig
    from .runtime import _Dist
    from .sd3 import SD3Policy

__all__ = ["save_checkpoint", "load_checkpoint", "save_lora", "check_saved_config", "CheckpointedTrainer"]


class CheckpointedTrainer(Protocol):
    """What a checkpoint saves and restores of the trainer (:class:`~rewardkit.rl.trainer.NFTTrainer` has it): the
    functions here take it as an argument and never import the trainer, which imports them."""

    cfg: NFTConfig
    dist: _Dist
    device: torch.device
    out: Path
    policy: SD3Policy
    trainable: list[torch.nn.Parameter]
    old_params: list[torch.nn.Parameter]
    ema: list[torch.Tensor] | None
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    epoch: int
    global_step: int
    wandb_run_id: str | None
    _resume_state: dict[str, Any] | None  # set by load_checkpoint: the epoch a mid-epoch checkpoint stopped in


def state_tensors(tr: CheckpointedTrainer) -> dict[str, torch.Tensor]:
    out = {}
    for name, params in (("default", tr.trainable), ("old", tr.old_params), ("ema", tr.ema or [])):
        for i, p in enumerate(params):
            out[f"{name}.{i}"] = p.detach().cpu().contiguous()
    return out


def save_checkpoint(tr: CheckpointedTrainer, st: dict[str, Any] | None = None) -> Path:
    """``checkpoints/epoch-N`` after epoch N, or with ``st`` (an epoch in progress, after an optimizer step)
    ``checkpoints/epoch-N-step-S``: each process also writes its rollouts, r and training-generator state,
    so that the resumed epoch continues bitwise where it stopped."""
    from ..train.checkpoint import _flatten_optimizer, _rng_states, publish_checkpoint

    st_mod = require("safetensors.torch", "rl")
    root = tr.out / "checkpoints"
    name = f"epoch-{tr.epoch:06d}" + ("" if st is None else f"-step-{tr.global_step:08d}")
    final, tmp = root / name, root / f"{name}.tmp"
    if tr.dist.main:
        for stale in root.glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    tr.dist.barrier()
    st_mod.save_file(_rng_states(), str(tmp / f"rng-rank{tr.dist.rank}.safetensors"))
    if st is not None:
        b = st["buf"]
        tensors = {"x0": b["x0"].detach().cpu().contiguous(), "prompt": b["prompt"].cpu(),
                   "variant": b["variant"].cpu(), "r": st["r"].cpu().contiguous(), "valid": st["valid"].cpu(),
                   "gen_state": st["gen_state"]}
        meta = {k: st[k] for k in ("epoch", "micro", "sums", "count", "grad_norms", "scales", "logs")}
        st_mod.save_file(tensors, str(tmp / f"epoch-state-rank{tr.dist.rank}.safetensors"),
                         metadata={"state": json.dumps(meta)})
    tr.dist.barrier()
    if tr.dist.main:
        st_mod.save_file(state_tensors(tr), str(tmp / "adapters.safetensors"))
        tensors, meta = _flatten_optimizer(tr.opt)
        st_mod.save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_lora(tr, tmp / "lora")
        state = {"epoch": tr.epoch, "global_step": tr.global_step, "world_size": tr.dist.world,
                 "mid_epoch": st is not None,
                 "optimizer": meta, "scaler": tr.scaler.state_dict() if tr.scaler.is_enabled() else None,
                 "config": dataclasses.asdict(tr.cfg), "content": weights_content(tr.cfg),
                 # the wandb run to continue on resume (kept through a run without report_to: wandb)
                 "wandb_run_id": tr.wandb_run_id}
        (tmp / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
        publish_checkpoint(root, tmp, final, "epoch-*", tr.cfg.save_total_limit)
    tr.dist.barrier()
    return final

def save_lora(tr: CheckpointedTrainer, directory: Path) -> None:
    """The LoRA for inference: the EMA weights when EMA is on (as the official code saves), else the
    trained adapter."""
    directory.mkdir(parents=True, exist_ok=True)
    if tr.ema is None:
        tr.policy.save_lora(directory, "default")
        return
    backup = [p.detach().clone() for p in tr.trainable]
    with torch.no_grad():
        for p, e in zip(tr.trainable, tr.ema):
            p.copy_(e)
    try:
        tr.policy.save_lora(directory, "default")
    finally:
        with torch.no_grad():
            for p, b in zip(tr.trainable, backup):
                p.copy_(b)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def weights_content(cfg: Any) -> Any:
    """The content of every local checkpoint the run's model and reward options name
    (:func:`rewardkit.fingerprint.content_config`): a resume with other weights at the same paths is refused."""
    from ..fingerprint import content_config, default_memo_dir

    return content_config({"model": dataclasses.asdict(cfg.model), "reward_kwargs": cfg.reward_kwargs},
                          default_memo_dir())


def check_saved_config(saved: dict[str, Any], cfg: Any, keys: tuple[str, ...], path: Path) -> list[str]:
    """Compare the config a checkpoint was written with (``state.json``'s ``config``) with this run's ``cfg`` on
    ``keys`` (the options the results depend on); return the dotted names of the fields the checkpoint lacks.

    A checkpoint written before a field existed lacks it: it ran with that field's default (the default of the
    config dataclass of this code), so it resumes when this run leaves the field at its default, and is refused
    when this run sets it otherwise. A saved field this code does not know (written by a newer version) cannot be
    checked and is refused; so is a changed value of a field both know. Raises ``ValueError`` naming them all."""
    defaults, now = type(cfg)(), dataclasses.asdict(cfg)
    filled: list[str] = []
    lacking: list[str] = []   # missing in the checkpoint, set otherwise in this run
    changed: list[str] = []
    unknown: list[str] = []

    def missing(name: str, default: Any, current: Any) -> None:
        if default == current:
            filled.append(name)
        else:
            lacking.append(f"{name} (not in the checkpoint, which ran with the default {_short(default)}; "
                           f"this run sets {_short(current)})")

    def field_(name: str, saved_v: Any, current: Any, default: Any, present: bool) -> None:
        dflt = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        if not present:
            missing(name, dflt, current)
        elif dataclasses.is_dataclass(default) and isinstance(saved_v, dict) and isinstance(current, dict):
            known = [f.name for f in dataclasses.fields(default)]
            unknown.extend(f"{name}.{k}" for k in saved_v if k not in known)
            for k in known:
                field_(f"{name}.{k}", saved_v.get(k), current[k], getattr(default, k), k in saved_v)
        elif saved_v != current:
            changed.append(f"{name} ({_short(saved_v)} in the checkpoint, now {_short(current)})")

    for k in keys:
        field_(k, saved.get(k), now.get(k), getattr(defaults, k), k in saved)
    problems = []
    if unknown:
        problems.append(f"{', '.join(unknown)} unknown to this version of rewardkit (the checkpoint was written by "
                        "a newer one: resume it with that version)")
    if changed:
        problems.append(f"{', '.join(changed)} changed since it was written")
    if lacking:
        problems.append(f"{', '.join(lacking)}: leave {'it' if len(lacking) == 1 else 'them'} at the default to "
                        "resume")
    if problems:
        raise ValueError(f"cannot resume from {path}: {'; '.join(problems)}; or use a new output_dir or "
                         "resume=never")
    return filled


def load_checkpoint(tr: CheckpointedTrainer, path: Path) -> None:
    from ..train.trainer import _unflatten_optimizer

    st = require("safetensors.torch", "rl")
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    if state["world_size"] != tr.dist.world:
        raise ValueError(f"checkpoint {path} was written by {state['world_size']} processes, this run has "
                         f"{tr.dist.world}; the sample plan would differ: use a new output_dir (or "
                         "--output-dir), or resume=never to start over in this one")
    keys = ("seed", "prompts", "sample", "lora", "e2po", "rewards")
    if state.get("mid_epoch"):  # the rest of the epoch follows the saved micro-batch split and generator
        keys += ("train",)
    if not isinstance(state.get("config"), dict):
        raise ValueError(f"cannot resume from {path}: its state.json holds no config to check this run against; use "
                         "a new output_dir or resume=never")
    filled = check_saved_config(state["config"], tr.cfg, keys, path)
    from ..fingerprint import content_changes

    changed = content_changes(state.get("content"), weights_content(tr.cfg))
    if changed:  # new weights at the same path (a base model or reward model retrained in place)
        raise ValueError(f"cannot resume from {path}: the weights {', '.join(changed)} name(s) changed content since "
                         "it was written; use a new output_dir or resume=never")
    if filled and tr.dist.main:
        print(f"rewardkit rl nft: resuming from {path}, written before {', '.join(filled)} existed: filled in "
              "with the defaults, which this run also uses", file=sys.stderr)
    tensors = st.load_file(str(path / "adapters.safetensors"))
    with torch.no_grad():
        for name, params in (("default", tr.trainable), ("old", tr.old_params), ("ema", tr.ema or [])):
            for i, p in enumerate(params):
                key = f"{name}.{i}"
                if key not in tensors or tensors[key].shape != p.shape:
                    raise ValueError(f"checkpoint {path}: {key} missing or of another shape (lora changed?)")
                p.copy_(tensors[key])
    tr.opt.load_state_dict(_unflatten_optimizer(st.load_file(str(path / "optimizer.safetensors")),
                                                  state["optimizer"]))
    if state.get("scaler") and tr.scaler.is_enabled():
        tr.scaler.load_state_dict(state["scaler"])
    rng_file = path / f"rng-rank{tr.dist.rank}.safetensors"
    if rng_file.is_file():
        torch.set_rng_state(st.load_file(str(rng_file))["cpu"])
    tr.epoch = int(state["epoch"])
    tr.global_step = int(state["global_step"])
    tr.wandb_run_id = state.get("wandb_run_id")  # None: written without wandb, or before the id was saved
    if state.get("mid_epoch"):
        f = path / f"epoch-state-rank{tr.dist.rank}.safetensors"
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as fh:
            meta = json.loads(fh.metadata()["state"])
        t = st.load_file(str(f))
        tr._resume_state = {**meta, "r": t["r"], "valid": t["valid"], "gen_state": t["gen_state"],
                              "buf": {"x0": t["x0"].to(tr.device), "prompt": t["prompt"], "variant": t["variant"]}}

