"""Checkpoints of the trainers (preference and RL share the layout): ``checkpoints/step-XXXXXXXX`` folders with a
``latest`` pointer, optimizer state flattened into safetensors + JSON (no pickling), RNG states, atomic text
writes, the deterministic data order and a cheap replica fingerprint for DDP checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["latest_checkpoint", "resume_checkpoint"]


def _permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ptr = Path(output_dir) / "checkpoints" / "latest"
    if not ptr.is_file():
        return None
    d = ptr.parent / ptr.read_text(encoding="utf-8").strip()
    return d if (d / "state.json").is_file() else None


def resume_checkpoint(resume: str, output_dir: str | Path) -> Path | None:
    """The checkpoint a run resumes from: ``"auto"`` = the latest one in ``output_dir`` (None when there is
    none), ``"never"`` / ``""`` / ``"none"`` = None, else a checkpoint directory, which must exist."""
    if resume == "auto":
        return latest_checkpoint(output_dir)
    if resume in ("never", "", "none"):
        return None
    ckpt = Path(resume)
    if not (ckpt / "state.json").is_file():
        raise FileNotFoundError(f"resume checkpoint not found: {ckpt}")
    return ckpt


def _log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON-object lines of a ``metrics.jsonl``-style log; a line that does not parse (half a record: a kill
    while it was written) is dropped, not a reason for every resume to fail."""
    import json

    out = []
    for ln in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(ln) if ln.strip() else None
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def publish_checkpoint(root: Path, tmp: Path, final: Path, pattern: str, keep: int) -> None:
    """Publish a fully written ``tmp`` folder as ``final`` (one rename), point ``root/latest`` at it, and keep the
    newest ``keep`` (at least 1) folders matching ``pattern`` (``*.tmp`` leftovers never count). Main process
    only; the trainers call it after every process has written its part."""
    import shutil

    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(root / "latest", final.name)
    kept = sorted(p for p in root.glob(pattern) if p.is_dir() and not p.name.endswith(".tmp"))
    for old in kept[:-max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer state -> (tensors for safetensors, JSON-able rest). No pickling."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{pid}.{k}"] = v.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(pid), {})[k] = v
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    for pid, st in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(st)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def _replica_fingerprint(params: list[torch.Tensor], chunk: int = 1 << 20) -> torch.Tensor:
    """``[3]`` float64 summary of the parameters (sum, sum of squares, a fixed pseudo-random projection),
    computed on the parameters' device in chunks, so it costs O(chunk) memory even for a full 8B model.
    Bitwise-equal replicas give bitwise-equal fingerprints."""
    out = None
    for p in params:
        x = p.detach().reshape(-1)
        for s in range(0, x.numel(), chunk):
            c = x[s:s + chunk].double()
            idx = torch.arange(s, s + c.numel(), device=c.device, dtype=torch.float64)
            w = torch.frac(idx * 0.6180339887498949)  # golden-ratio sequence in [0, 1)
            part = torch.stack([c.sum(), (c * c).sum(), (c * w).sum()])
            out = part if out is None else out + part
    return out if out is not None else torch.zeros(3, dtype=torch.float64)


def _rng_states() -> dict[str, torch.Tensor]:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return rng
