"""LoRA soup: the exact (weighted) average of N LoRA adapters' weight deltas.

Stage 3 of the arena-rubric recipe (seed 001) averages the LoRA deltas of two RL runs with equal weights:

    dW(module) = sum_i w_i * s_i * B_i @ A_i          s_i = lora_alpha_i / r_i  (alpha_i / sqrt(r_i) for rsLoRA)

peft's ``add_weighted_adapter(..., combination_type="linear")`` is NOT this: it forms
``(sum_i sqrt(w_i s_i) B_i)(sum_i sqrt(w_i s_i) A_i)``, whose cross terms ``B_1 A_2``, ``B_2 A_1`` are not in
the average. A rank-concatenated adapter is exact: ``A = [w_1 s_1 A_1; ...; w_N s_N A_N]`` (rows) and
``B = [B_1, ..., B_N]`` (columns) give ``B @ A = sum_i w_i s_i B_i A_i`` with rank ``sum_i r_i`` and scaling 1.

This module works on peft adapter directories (``adapter_config.json`` + ``adapter_model.safetensors``)
directly, so it needs neither the base model nor its class: it serves FLUX transformers and Qwen-VL alike.
Outputs: an adapter directory (loadable with ``PeftModel.from_pretrained``) or, given the base checkpoint
directory, merged weights (the base ``*.safetensors`` with every delta added). Safetensors only.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .._imports import require

__all__ = ["LoraAdapter", "read_adapter", "soup_deltas", "lora_soup", "save_soup_adapter", "merge_into_checkpoint",
           "match_module"]

_A = re.compile(r"^(?P<module>.+)\.lora_A(?:\.[^.]+)?\.weight$")
_B = re.compile(r"^(?P<module>.+)\.lora_B(?:\.[^.]+)?\.weight$")
_PREFIX = "base_model.model."


@dataclass
class LoraAdapter:
    """One adapter: per module name, ``A [r, in]``, ``B [out, r]`` and the scaling ``s``."""

    path: Path
    config: dict
    A: dict[str, torch.Tensor]
    B: dict[str, torch.Tensor]
    scaling: dict[str, float]


def _pattern_value(pattern: dict, module: str, default):
    for key, val in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return val
    return default


def read_adapter(path: str | Path) -> LoraAdapter:
    """Read a peft LoRA adapter directory (safetensors only; ``.bin`` pickles are refused)."""
    st = require("safetensors.torch", "hf")
    path = Path(path)
    cfg_file, weights = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path}: no adapter_config.json (is this a peft LoRA adapter directory?)")
    if not weights.is_file():
        hint = " (found adapter_model.bin: convert it to safetensors; rewardkit never unpickles weights)" \
            if (path / "adapter_model.bin").exists() else ""
        raise FileNotFoundError(f"{path}: no adapter_model.safetensors{hint}")
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    if cfg.get("use_dora"):
        raise ValueError(f"{path}: DoRA adapters are not a pure low-rank delta; a delta average does not apply")
    if cfg.get("lora_bias"):
        raise ValueError(f"{path}: adapters with lora_bias are not supported")
    if cfg.get("modules_to_save"):
        raise ValueError(f"{path}: modules_to_save (fully trained modules) cannot be delta-averaged as LoRA")
    state = st.load_file(str(weights))
    A, B = {}, {}
    for key, t in state.items():
        ma, mb = _A.match(key), _B.match(key)
        if ma:
            A[ma["module"]] = t
        elif mb:
            B[mb["module"]] = t
        else:
            raise ValueError(f"{path}: unexpected tensor {key!r} (only lora_A / lora_B weights are supported)")
    if set(A) != set(B):
        raise ValueError(f"{path}: modules with lora_A but no lora_B (or the reverse): {sorted(set(A) ^ set(B))}")
    scaling = {}
    for m in A:
        if A[m].ndim != 2:
            raise ValueError(f"{path}: module {m!r} is not a linear LoRA (A has shape {tuple(A[m].shape)})")
        r = A[m].shape[0]
        alpha = _pattern_value(cfg.get("alpha_pattern"), m.removeprefix(_PREFIX), cfg.get("lora_alpha", r))
        scaling[m] = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    return LoraAdapter(path, cfg, A, B, scaling)


def _check_weights(n: int, weights: Sequence[float] | None) -> list[float]:
    if n < 1:
        raise ValueError("a soup needs at least one adapter")
    if weights is None:
        return [1.0 / n] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise ValueError(f"{len(weights)} weights for {n} adapters")
    if not all(math.isfinite(w) for w in weights):
        raise ValueError("weights must be finite")
    return weights


def soup_deltas(adapters: Sequence[LoraAdapter], weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Dense ``dW [out, in] = sum_i w_i s_i B_i A_i`` per module (float32). Default weights: 1/N each.

    A module missing from an adapter contributes nothing for that adapter (its delta is zero there).
    """
    w = _check_weights(len(adapters), weights)
    out: dict[str, torch.Tensor] = {}
    for ad, wi in zip(adapters, w):
        for m in ad.A:
            d = wi * ad.scaling[m] * (ad.B[m].float() @ ad.A[m].float())
            if ad.config.get("fan_in_fan_out"):
                d = d.T
            out[m] = out[m] + d if m in out else d
    return out


def _concat_factors(adapters: Sequence[LoraAdapter], w: list[float]):
    modules = sorted(set().union(*[set(a.A) for a in adapters]))
    A_out, B_out, ranks = {}, {}, {}
    for m in modules:
        As, Bs = [], []
        for ad, wi in zip(adapters, w):
            if m in ad.A:
                As.append(wi * ad.scaling[m] * ad.A[m].float())
                Bs.append(ad.B[m].float())
        A_out[m] = torch.cat(As, dim=0).contiguous()
        B_out[m] = torch.cat(Bs, dim=1).contiguous()
        ranks[m] = A_out[m].shape[0]
    return A_out, B_out, ranks


def save_soup_adapter(adapters: Sequence[LoraAdapter], output: str | Path, weights: Sequence[float] | None = None,
                      dtype: torch.dtype | None = None) -> Path:
    """Write the exact average as one rank-concatenated peft adapter (scaling 1) to ``output``."""
    st = require("safetensors.torch", "hf")
    w = _check_weights(len(adapters), weights)
    fifo = {bool(a.config.get("fan_in_fan_out")) for a in adapters}
    if len(fifo) > 1:
        raise ValueError("cannot concatenate adapters with different fan_in_fan_out settings")
    A, B, ranks = _concat_factors(adapters, w)
    dtype = dtype or adapters[0].A[next(iter(adapters[0].A))].dtype
    tensors = {}
    for m in A:
        tensors[f"{m}.lora_A.weight"] = A[m].to(dtype)
        tensors[f"{m}.lora_B.weight"] = B[m].to(dtype)
    cfg = dict(adapters[0].config)
    targets = set()
    for a in adapters:
        t = a.config.get("target_modules")
        if isinstance(t, str):  # a regex: keep only when every adapter uses the same one
            targets.add(t)
        elif t:
            targets.update(t)
    if any(isinstance(a.config.get("target_modules"), str) for a in adapters):
        if len(targets) != 1:
            targets = {m.removeprefix(_PREFIX) for m in A}
            cfg["target_modules"] = sorted(targets)
        else:
            cfg["target_modules"] = targets.pop()
    else:
        cfg["target_modules"] = sorted(targets)
    uniq = sorted(set(ranks.values()))
    cfg.update(r=uniq[0], lora_alpha=uniq[0], use_rslora=False, lora_dropout=0.0, alpha_pattern={}, rank_pattern={})
    if len(uniq) > 1:  # modules differ in total rank: pin each one, with alpha = rank (scaling 1)
        cfg["rank_pattern"] = {re.escape(m.removeprefix(_PREFIX)): r for m, r in ranks.items() if r != uniq[0]}
        cfg["alpha_pattern"] = dict(cfg["rank_pattern"])
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    # provenance beside the adapter (peft warns about unknown keys inside adapter_config.json)
    (output / "soup.json").write_text(json.dumps({"sources": [str(a.path) for a in adapters], "weights": w,
                                                  "method": "rank-concatenation (exact delta average)"}, indent=2))
    st.save_file(tensors, str(output / "adapter_model.safetensors"), metadata={"format": "pt"})
    (output / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    return output


def merge_into_checkpoint(deltas: dict[str, torch.Tensor], base: str | Path, output: str | Path) -> Path:
    """Add ``deltas`` to the matching ``<module>.weight`` tensors of the base checkpoint's ``*.safetensors``
    files and write the result (other files copied) to ``output``. Raises if a module has no weight."""
    st = require("safetensors.torch", "hf")
    base, output = Path(base), Path(output)
    files = sorted(base.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{base}: no *.safetensors files (merged output needs the base checkpoint)")
    output.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, output / f.name)
    headers = {}
    for f in files:
        with open(f, "rb") as fh:  # read names and metadata from the header only
            header_len = int.from_bytes(fh.read(8), "little")
            headers[f] = json.loads(fh.read(header_len))
    base_modules = {k[: -len(".weight")]: f for f, h in headers.items() for k in h
                    if k != "__metadata__" and k.endswith(".weight")}
    plan: dict[Path, dict[str, torch.Tensor]] = {}
    claimed: dict[str, str] = {}
    for m, d in deltas.items():
        target = match_module(m.removeprefix(_PREFIX), base_modules)
        if target in claimed:
            raise ValueError(f"adapter modules {claimed[target]!r} and {m!r} both map to base weight {target!r}")
        claimed[target] = m
        plan.setdefault(base_modules[target], {})[f"{target}.weight"] = d
    for f in files:
        state = st.load_file(str(f))
        for key, d in plan.get(f, {}).items():
            if d.shape != state[key].shape:
                raise ValueError(f"delta for {key!r} has shape {tuple(d.shape)}, the weight {tuple(state[key].shape)}")
            state[key] = (state[key].float() + d).to(state[key].dtype)
        st.save_file(state, str(output / f.name), metadata=headers[f].get("__metadata__"))
    return output


def match_module(module: str, base_modules) -> str:
    """The base checkpoint module a peft module name refers to.

    Checkpoint key names can differ from the loaded model's module names (transformers 5 saves Qwen-VL's
    ``model.language_model.layers.N`` as ``model.layers.N``; diffusers may add a ``transformer.`` prefix), so
    the longest dotted suffix of ``module`` (at least two components) that names exactly one base module
    wins; an ambiguous or missing match raises instead of guessing.
    """
    parts = module.split(".")
    for k in range(0, max(len(parts) - 1, 1)):
        suffix = ".".join(parts[k:])
        hits = [b for b in base_modules if b == suffix or b.endswith("." + suffix)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ValueError(f"adapter module {module!r} matches several base weights: {sorted(hits)[:4]}")
    raise ValueError(f"no base weight found for adapter module {module!r}")


def lora_soup(adapters: Sequence[str | Path], output: str | Path, weights: Sequence[float] | None = None, *,
              base: str | Path | None = None) -> Path:
    """Average N LoRA adapters exactly and save the result.

    Args:
        adapters: N peft adapter directories.
        output: directory to write.
        weights: N weights (default equal, 1/N; they are used as given, not renormalised).
        base: base checkpoint directory; when given, write merged full weights instead of an adapter.

    Returns:
        ``output``.
    """
    loaded = [read_adapter(p) for p in adapters]
    if base is None:
        return save_soup_adapter(loaded, output, weights)
    return merge_into_checkpoint(soup_deltas(loaded, weights), base, output)
