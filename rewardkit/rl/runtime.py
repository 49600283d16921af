"""Process-level plumbing of the NFT trainer: seeds that are pure functions of integers, torchrun's
environment as a process group (:class:`Dist`), and ``tiny:<kind>`` checkpoints for tests and tiny recipes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["resolve_tiny"]

def _seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and runs)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) & 0x7FFFFFFFFFFFFFFF
    return h


def _gen(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*parts))


_SAMPLE, _TRAIN, _PLAN, _E2PO, _EVAL = 1, 2, 3, 4, 5


def resolve_tiny(spec: Any, root: Path, dist: "_Dist | None" = None) -> Any:
    """``"tiny:<kind>"`` (``sd3``, ``clip``, ...) -> a tiny random checkpoint written under ``root`` by
    :func:`rewardkit.testing.save_tiny_checkpoint` (once, by the main process) and loaded back from disk like
    real weights. Anything else is returned unchanged."""
    if not (isinstance(spec, str) and spec.startswith("tiny:")):
        return spec
    from ..testing import save_tiny_checkpoint

    kind = spec.split(":", 1)[1]
    path = root / kind
    if dist is None or dist.main:
        if not (path / ".complete").is_file():
            save_tiny_checkpoint(kind, path)
            (path / ".complete").write_text("ok", encoding="utf-8")
    if dist is not None:
        dist.barrier()
    return str(path)


# ---------------------------------------------------------------------------------------------- distributed
class _Dist:
    """torchrun's environment -> a process group (NCCL on GPU, gloo on CPU); or a single process."""

    def __init__(self, cpu: bool):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = torch.cuda.is_available() and not cpu
        self.device = torch.device(f"cuda:{local}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
        self.owns_group = False
        if self.world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
            self.owns_group = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def gather_cat(self, x: torch.Tensor) -> torch.Tensor:
        """All processes' ``x`` (same shape everywhere) concatenated along dim 0, in rank order."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return x
        x = x.clone()
        torch.distributed.all_reduce(x)
        return x / self.world

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


