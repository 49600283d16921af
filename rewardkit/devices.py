"""Devices as callers pass them (``torch.device``, ``"cuda:1"``, an int GPU index) -> what configs store and what
modules move to. Shared by the contract (:class:`rewardkit.reward.Reward`'s ``device`` option and ``to``) and the
model loaders (:mod:`rewardkit.models.vlm` re-exports both names). torch is imported only when a device is resolved.
"""

from __future__ import annotations

from typing import Any

__all__ = ["device_arg", "resolve_device"]


def device_arg(device: Any) -> str | None:
    """A device as callers pass it (``torch.device``, ``"cuda:1"``, an int GPU index as RL trainers pass
    ``local_rank``) -> the string configs store (``"cuda:1"``); None stays None."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise ValueError(f"device must be a string, torch.device or GPU index, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index must be >= 0, got {device}")
        return f"cuda:{device}"
    if type(device).__name__ == "device" and type(device).__module__.startswith("torch"):
        return str(device)
    if isinstance(device, str):
        d = device.strip()
        return f"cuda:{d}" if d.isdigit() else d
    raise ValueError(f"device must be a string, torch.device or GPU index, got {type(device).__name__} {device!r}")


def resolve_device(device: Any):
    """None -> cuda if available else cpu; strings, ints (GPU index) and torch.device accepted (never a
    hard-coded cuda:0). Asking for an accelerator this torch cannot use is a clear ``ValueError``."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device_arg(device))
    except RuntimeError as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from None
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise ValueError(f"device={str(dev)!r} was requested but this torch ({torch.__version__}) is a CPU-only "
                             "build; install a CUDA build of torch or pass device='cpu'")
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(dev)!r} was requested but no CUDA device is visible "
                             "(check CUDA_VISIBLE_DEVICES / the driver) ; pass device='cpu' to run on the CPU")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={str(dev)!r} was requested but only {torch.cuda.device_count()} CUDA "
                             "device(s) are visible")
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError("device='mps' was requested but MPS is not available in this torch / on this machine")
    return dev
