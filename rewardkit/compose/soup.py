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

Tensors that are not LoRA factors (weights ``w_i``; each one needs ``sum_i w_i = 1``, because only then is
the average of the tensors the average of their deltas from the base, ``base + sum_i w_i (t_i - base)``,
without knowing the base):

- trainable-token rows (peft ``trainable_token_indices``, e.g. the ``<|reward|>`` token of a preference
  model): peft stores the rows' new *values* (``token_adapter.trainable_tokens_delta``, which replace the
  base rows), so the soup row is ``sum_i w_i v_i``; every adapter must train the same token ids.
- ``modules_to_save`` (fully trained copies of modules): the parameter average ``sum_i w_i theta_i``.
- a rewardkit preference model directory (``preference_config.json``, ``weights: lora``): its ``adapter/`` is
  souped as above and its head (trained from scratch) is parameter-averaged, ``sum_i w_i theta_i``: for the
  ``linear`` head this is the weighted average of the heads' outputs on one hidden state; for ``mlp`` /
  ``uncertainty`` heads it is a parameter average only. The models must share base model, head type and
  size, reward token and template; the processor is copied from the first; ``calibration.json`` is not
  carried over (the soup's score distribution is its own: run ``rewardkit calibrate`` on it).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .._imports import require

__all__ = ["LoraAdapter", "read_adapter", "soup_deltas", "soup_extras", "lora_soup", "save_soup_adapter",
           "merge_into_checkpoint", "match_module", "soup_preference_models"]

_A = re.compile(r"^(?P<module>.+)\.lora_A(?:\.[^.]+)?\.weight$")
_TOK = re.compile(r"^(?P<module>.+)\.token_adapter\.trainable_tokens_delta(?:\.[^.]+)?$")
_B = re.compile(r"^(?P<module>.+)\.lora_B(?:\.[^.]+)?\.weight$")
_PREFIX = "base_model.model."


@dataclass
class LoraAdapter:
    """One adapter: per module name, ``A [r, in]``, ``B [out, r]`` and the scaling ``s``; ``tokens``: per
    embedding module, the trained rows' values ``[n_tokens, hidden]`` (peft trainable tokens); ``full``: per
    tensor name, the ``modules_to_save`` parameters."""

    path: Path
    config: dict
    A: dict[str, torch.Tensor]
    B: dict[str, torch.Tensor]
    scaling: dict[str, float]
    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    full: dict[str, torch.Tensor] = field(default_factory=dict)


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
    saved_modules = cfg.get("modules_to_save") or []
    state = st.load_file(str(weights))
    A, B, tokens, full = {}, {}, {}, {}
    for key, t in state.items():
        ma, mb, mt = _A.match(key), _B.match(key), _TOK.match(key)
        if ma:
            A[ma["module"]] = t
        elif mb:
            B[mb["module"]] = t
        elif mt:
            tokens[mt["module"]] = t
        elif any(re.search(rf"(^|\.){re.escape(m)}\.", key) for m in saved_modules):
            full[key] = t
        else:
            raise ValueError(f"{path}: unexpected tensor {key!r} (expected lora_A / lora_B weights, trainable-token "
                             "rows or modules_to_save parameters)")
    if tokens and not cfg.get("trainable_token_indices"):
        raise ValueError(f"{path}: trainable-token rows but no trainable_token_indices in adapter_config.json")
    if set(A) != set(B):
        raise ValueError(f"{path}: modules with lora_A but no lora_B (or the reverse): {sorted(set(A) ^ set(B))}")
    scaling = {}
    for m in A:
        if A[m].ndim != 2:
            raise ValueError(f"{path}: module {m!r} is not a linear LoRA (A has shape {tuple(A[m].shape)})")
        r = A[m].shape[0]
        alpha = _pattern_value(cfg.get("alpha_pattern"), m.removeprefix(_PREFIX), cfg.get("lora_alpha", r))
        scaling[m] = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    return LoraAdapter(path, cfg, A, B, scaling, tokens, full)


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


def _unit_sum(w: list[float], what: str) -> None:
    if abs(sum(w) - 1.0) > 1e-6:
        raise ValueError(f"the adapters carry {what}, which are averaged as values (sum_i w_i t_i): that is the "
                         f"average of their deltas only when the weights sum to 1, got sum {sum(w):g}")


def soup_extras(adapters: Sequence[LoraAdapter], w: list[float]) -> tuple[dict[str, torch.Tensor],
                                                                          dict[str, torch.Tensor]]:
    """The weighted averages ``sum_i w_i t_i`` of trainable-token rows and ``modules_to_save`` tensors (float32).

    Every adapter must carry the same such tensors with the same shapes (and the same token ids)."""
    kinds = {"trainable-token rows": [a.tokens for a in adapters], "modules_to_save tensors": [a.full for a in adapters]}
    out = []
    for what, dicts in kinds.items():
        names = [set(d) for d in dicts]
        if any(n != names[0] for n in names):
            raise ValueError(f"the adapters carry different {what}: " + "; ".join(
                f"{a.path}: {sorted(n)}" for a, n in zip(adapters, names)))
        if names[0]:
            _unit_sum(w, what)
        avg = {}
        for k in sorted(names[0]):
            shapes = {tuple(d[k].shape) for d in dicts}
            if len(shapes) > 1:
                raise ValueError(f"{what}: {k!r} has different shapes across adapters: {sorted(shapes)}")
            avg[k] = sum(wi * d[k].float() for wi, d in zip(w, dicts))
        out.append(avg)
    if out[0]:
        ids = {json.dumps(a.config.get("trainable_token_indices"), sort_keys=True) for a in adapters}
        if len(ids) > 1:
            raise ValueError("the adapters train different token ids (trainable_token_indices): " + ", ".join(sorted(ids)))
    return out[0], out[1]


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
    tokens, full = soup_extras(adapters, w)
    dtype = dtype or adapters[0].A[next(iter(adapters[0].A))].dtype
    tensors = {}
    for m in A:
        tensors[f"{m}.lora_A.weight"] = A[m].to(dtype)
        tensors[f"{m}.lora_B.weight"] = B[m].to(dtype)
    for m, t in tokens.items():
        tensors[f"{m}.token_adapter.trainable_tokens_delta"] = t.to(adapters[0].tokens[m].dtype).contiguous()
    for k, t in full.items():
        tensors[k] = t.to(adapters[0].full[k].dtype).contiguous()
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
    (output / "soup.json").write_text(json.dumps({
        "sources": [str(a.path) for a in adapters], "weights": w,
        "method": "rank-concatenation (exact delta average)",
        "non_lora": {"trainable_token_rows": sorted(tokens), "modules_to_save": sorted(full),
                     "rule": "weighted average of values (weights sum to 1)"}}, indent=2))
    st.save_file(tensors, str(output / "adapter_model.safetensors"), metadata={"format": "pt"})
    (output / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    return output


def merge_into_checkpoint(deltas: dict[str, torch.Tensor], base: str | Path, output: str | Path, *,
                          rows: dict[str, tuple[list[int], torch.Tensor]] | None = None,
                          full: dict[str, torch.Tensor] | None = None) -> Path:
    """Add ``deltas`` to the matching ``<module>.weight`` tensors of the base checkpoint's ``*.safetensors``
    files and write the result (other files copied) to ``output``. Raises if a module has no weight.

    ``rows``: per embedding module, token ids and their new values ``[n, hidden]`` (written into the rows);
    ``full``: ``modules_to_save`` tensors by adapter key (replace the base tensor)."""
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
    row_plan: dict[Path, dict[str, tuple[list[int], torch.Tensor]]] = {}
    full_plan: dict[Path, dict[str, torch.Tensor]] = {}
    claimed: dict[str, str] = {}
    for m, (ids, vals) in (rows or {}).items():
        target = match_module(m.removeprefix(_PREFIX), base_modules)
        row_plan.setdefault(base_modules[target], {})[f"{target}.weight"] = (ids, vals)
    base_tensors = {k: f for f, h in headers.items() for k in h if k != "__metadata__"}
    for key, t in (full or {}).items():
        mod, _, leaf = key.removeprefix(_PREFIX).rpartition(".")
        target = match_module(mod, {k.rpartition(".")[0]: f for k, f in base_tensors.items()
                                    if k.endswith("." + leaf)})
        full_plan.setdefault(base_tensors[f"{target}.{leaf}"], {})[f"{target}.{leaf}"] = t
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
        for key, t in full_plan.get(f, {}).items():
            if t.shape != state[key].shape:
                raise ValueError(f"modules_to_save tensor for {key!r} has shape {tuple(t.shape)}, the base "
                                 f"{tuple(state[key].shape)}")
            state[key] = t.to(state[key].dtype)
        for key, (ids, vals) in row_plan.get(f, {}).items():
            w = state[key].clone()
            if max(ids) >= w.shape[0] or vals.shape != (len(ids), w.shape[1]):
                raise ValueError(f"trainable-token rows {ids} do not fit {key!r} of shape {tuple(w.shape)}")
            w[torch.tensor(ids)] = vals.to(w.dtype)
            state[key] = w
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
    if any((Path(p) / "preference_config.json").is_file() for p in adapters):
        if base is not None:
            raise ValueError("--base merges plain peft adapters; preference model directories are souped into a "
                             "preference model directory (drop --base)")
        return soup_preference_models(adapters, output, weights)
    loaded = [read_adapter(p) for p in adapters]
    if base is None:
        return save_soup_adapter(loaded, output, weights)
    w = _check_weights(len(loaded), weights)
    tokens, full = soup_extras(loaded, w)
    rows = {}
    for m, vals in tokens.items():
        ids = _token_ids(loaded[0].config.get("trainable_token_indices"), m)
        rows[m] = (ids, vals)
    return merge_into_checkpoint(soup_deltas(loaded, weights), base, output, rows=rows, full=full)


def _token_ids(spec, module: str) -> list[int]:
    """Token ids peft trains for ``module`` from ``trainable_token_indices`` (a list, or a dict by module)."""
    if isinstance(spec, list):
        return [int(i) for i in spec]
    for key, ids in (spec or {}).items():
        if re.search(rf"(^|\.){re.escape(key)}$", module):
            return [int(i) for i in ids]
    raise ValueError(f"no trainable_token_indices entry for module {module!r}")


_PREF_SAME = ("format", "format_version", "head", "reward_token", "reward_token_id", "template", "weights",
              "base_model", "backbone_class", "model_type")


def soup_preference_models(models: Sequence[str | Path], output: str | Path,
                           weights: Sequence[float] | None = None) -> Path:
    """Soup N rewardkit LoRA preference models (``rewardkit train preference`` with ``lora.enabled``) into one
    preference model directory: the adapters as in :func:`save_soup_adapter` (LoRA deltas exactly, the reward
    token's row averaged), the heads parameter-averaged; ``sum_i w_i = 1`` is required (module docstring)."""
    import tempfile

    st = require("safetensors.torch", "hf")
    paths = [Path(m) for m in models]
    cfgs = []
    for p in paths:
        f = p / "preference_config.json"
        if not f.is_file():
            raise ValueError(f"{p}: not a rewardkit preference model (no preference_config.json); give either "
                             "preference model directories or peft adapter directories, not both")
        cfg = json.loads(f.read_text(encoding="utf-8"))
        if cfg.get("weights") != "lora":
            raise ValueError(f"{p}: a fully fine-tuned preference model (weights: {cfg.get('weights')!r}); soup "
                             "averages LoRA models (train with lora.enabled=true)")
        if not (p / "head.safetensors").is_file():
            bin_hint = " (found a pickle file: rewardkit never unpickles weights)" if any(
                p.glob("head*.bin")) or any(p.glob("head*.pt")) else ""
            raise FileNotFoundError(f"{p}: no head.safetensors{bin_hint}")
        cfgs.append(cfg)
    for p, cfg in zip(paths[1:], cfgs[1:]):
        diff = [k for k in _PREF_SAME if cfg.get(k) != cfgs[0].get(k)]
        if diff:
            raise ValueError(f"{p} and {paths[0]} differ in {', '.join(diff)}: only models of one base and "
                             "recipe can be souped")
    tok0 = (paths[0] / "processor" / "tokenizer.json")
    for p in paths[1:]:
        tok = p / "processor" / "tokenizer.json"
        if tok0.is_file() and tok.is_file() and tok.read_bytes() != tok0.read_bytes():
            raise ValueError(f"{p} and {paths[0]} have different tokenizers")
    w = _check_weights(len(paths), weights)
    _unit_sum(w, "a head (trained from scratch, no base to take deltas from)")
    adapters = [read_adapter(p / "adapter") for p in paths]
    heads = [st.load_file(str(p / "head.safetensors")) for p in paths]
    if any(set(h) != set(heads[0]) or any(h[k].shape != heads[0][k].shape for k in h) for h in heads):
        raise ValueError("the heads have different tensors or shapes")
    head = {k: sum(wi * h[k].double() for wi, h in zip(w, heads)).float().contiguous() for k in heads[0]}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        save_soup_adapter(adapters, tmp / "adapter", w)
        st.save_file(head, str(tmp / "head.safetensors"), metadata={"format": cfgs[0].get("format", "")})
        shutil.copytree(paths[0] / "processor", tmp / "processor")
        (tmp / "preference_config.json").write_text(json.dumps(cfgs[0], indent=2), encoding="utf-8")
        (tmp / "soup.json").write_text(json.dumps({
            "sources": [str(p) for p in paths], "weights": w,
            "adapter": "exact LoRA delta average (rank concatenation); reward-token rows averaged",
            "head": "parameter average sum_i w_i theta_i",
            "calibration": "not carried over: run rewardkit calibrate on the soup"}, indent=2), encoding="utf-8")
        if output.exists():
            if not (output / "soup.json").is_file():  # never delete a folder we did not write
                raise FileExistsError(f"{output} exists and is not an earlier soup: choose a new --output")
            shutil.rmtree(output)
        tmp.replace(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output
