"""Helpers shared by the commands: option checks that give actionable errors, input expansion, loading.

Standard library only at module level (``rewardkit --help`` imports the command modules).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from . import UsageError
from .convert import KINDS as CONVERTIBLE  # the rewards whose official single-file checkpoints `convert` reads

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def add_progress_flag(p) -> None:
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def check_device(device: str | None) -> None:
    """Refuse a CUDA / MPS device this torch build cannot use, before any model loads."""
    if not device or device == "cpu":
        return
    import torch

    kind = device.split(":", 1)[0]
    if kind == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"a CUDA {torch.version.cuda} build"
        raise UsageError(
            f"--device {device}: no CUDA device is usable (torch {torch.__version__} is {build}). Use --device cpu, "
            "or install a CUDA build of torch (README, 'CPU or CUDA torch': REWARDKIT_TORCH=... with the "
            "PyTorch index URL for your CUDA version)")
    if kind == "cuda" and ":" in device:
        idx = device.split(":", 1)[1]
        if idx.isdigit() and int(idx) >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError(f"--device {device}: MPS is not available in this torch build / machine; use --device cpu")


def looks_like_path(model: str) -> bool:
    """A ``--model`` value meant as a local directory rather than a hub id ``org/name``."""
    if ":" in model and not model.startswith((".", "/", "~")):
        return False  # a backend spec such as transformers:/path: the reward parses it
    return (model.startswith((".", "/", "~")) or model.endswith("/") or model.count("/") >= 2 or "\\" in model
            or (os.sep != "/" and os.sep in model))



def check_model(model: str | None, reward: str | None = None) -> None:
    """A ``--model`` that names a missing local directory gets that said, not a hub-id validation error; a file
    given for a reward whose official checkpoints are files names the ``rewardkit convert`` line."""
    if model is None:
        return
    p = Path(model).expanduser()
    if p.exists():
        if not p.is_dir():
            kind = None
            if reward is not None:
                from ..registry import resolve_name

                try:
                    kind = resolve_name(reward)
                except Exception:  # noqa: BLE001  an unknown name is reported by load_reward itself
                    kind = None
            hint = (f"; an official {kind} checkpoint file is converted once with `rewardkit convert {kind} "
                    f"{model} OUT_DIR`, then pass --model OUT_DIR" if kind in CONVERTIBLE else "")
            raise UsageError(f"--model {model}: is a file; give the checkpoint directory (the folder holding "
                             f"config.json and *.safetensors) or a hub id like org/name{hint}")
        return
    first = Path(model).parts[0] if Path(model).parts else ""
    if looks_like_path(model) or (len(Path(model).parts) > 1 and Path(first).is_dir()):
        # `models/X` where `models/` is a local folder: a missing checkpoint folder, not a hub id
        raise UsageError(f"--model {model}: no such directory (relative paths resolve from {Path.cwd()}); "
                         "give an existing checkpoint directory or a hub id like org/name")


def offline_hint(model: str | None) -> str:
    from ..models.zoo import hub_unavailable_message

    return hub_unavailable_message(model)


def load_reward_cli(name: str, config: Path | None, kwargs: dict[str, Any]):
    """``load_reward`` with the option checks above and an actionable message when the Hub is unreachable."""
    from ..registry import load_reward

    check_device(kwargs.get("device"))
    check_model(kwargs.get("model"), name)
    print(f"loading reward {name!r}" + (f" from {kwargs['model']}" if kwargs.get("model") else "") + " ...",
          file=sys.stderr, flush=True)
    from ..models.zoo import HubModelUnavailableError

    try:
        return load_reward(name, str(config) if config else None, **kwargs)
    except HubModelUnavailableError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        model = kwargs.get("model")
        if model is not None and Path(model).expanduser().exists():
            raise
        text = f"{type(exc).__name__}: {exc}"
        if any(s in text for s in ("offline", "Offline", "connect", "resolve", "LocalEntryNotFound",
                                   "cannot find the requested files", "Max retries", "hub")):
            raise UsageError(offline_hint(model) + f"\n  ({text.splitlines()[0][:300]})") from exc
        raise


def expand_images(paths: list[str]) -> list[str]:
    """Image paths as given; a directory expands to its image files (sorted). An empty directory is an error."""
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise UsageError(f"{p}: the folder holds no image files ({', '.join(IMAGE_SUFFIXES)})")
            out += found
        else:
            out.append(p)  # a missing file becomes one invalid sample (its reason printed), not a failed run
    return out


def atomic_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
