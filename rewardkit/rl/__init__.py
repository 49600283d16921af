"""The bundled DiffusionNFT trainer (with optional E²PO exploration) for SD3 / SD3.5 on diffusers.

    rewardkit rl nft --config recipes/nft/tiny.yaml [key=value ...]

Modules: :mod:`.schedule` (sigma schedule, timestep selection, decay schedules), :mod:`.solvers` (Euler,
flow SDE, DPM-Solver-2), :mod:`.nft` (advantages, optimality probability, the NFT loss, soft update / EMA),
:mod:`.exploration` (E²PO), :mod:`.sd3` (the diffusers model side), :mod:`.trainer` (the loop), with
:mod:`.prompts` (prompt sets and their metadata), :mod:`.scoring` (rewards), :mod:`.evaluation` (held-out
evaluation), :mod:`.tracking` (logged terms, TensorBoard / wandb), :mod:`.checkpoints`, :mod:`.runtime` (seeds,
processes), :mod:`.curves`; :mod:`.config` (the config dataclass and presets). Importing this package is cheap: diffusers, transformers
and peft load only when a trainer is built.
"""

from __future__ import annotations

__all__ = ["NFTConfig", "train_nft", "PRESETS"]


def __getattr__(name: str):
    if name in ("NFTConfig", "PRESETS"):
        from . import config

        return getattr(config, name)
    if name == "train_nft":
        from .trainer import train_nft

        return train_nft
    raise AttributeError(name)
