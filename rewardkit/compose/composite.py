"""``Composite``: several rewards combined by per-axis z-score, intent gate and detector veto.

    R_i = w_pref * z'_pref,i + w_faith * z_faith,i + w_constr * g_i * z_constr,i
    z'_pref,i = z_pref,i - v_i * max(z_pref,i, 0)          (v_i = 1 when an applicable detector fired)

(seed 001, Sec. 3.3.1). A ``Composite`` is itself a :class:`~rewardkit.Reward`: anything that takes a reward
takes a composite. Build it from Python or YAML::

    axes:
      - {name: preference, reward: pickscore}
      - {name: faithfulness, reward: faithfulness, options: {questions: q.jsonl}}
      - {name: constraint, reward: constraints, gate: intent, options: {questions: c.jsonl}}
    detectors: {reward: detectors, mode: veto, target: preference}
    normalize: batch

Z-scores are statistics of the *call*: a composite is ``batch_relative``, so the base class hands it the whole
call at once and ``batch_size`` reaches the sub-rewards as their chunk size (chunking never changes a score). Consequently a sample's
composite score depends on the other samples of the call, by design.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import torch

from ..config import _read_yaml, build_config, parse_overrides
from ..errors import ConfigError
from ..judges.policy import JUDGE_ERROR_POLICIES, JudgePolicyMixin
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from .functions import additive_penalty, combine, group_zscore, intent_gate, veto, zscore

__all__ = ["Composite", "CompositeConfig", "WeightedSum", "WeightedSumConfig", "AxisSpec", "build_composite"]

_NORMALIZE = ("batch", "group", "fixed", "none")
_GATES = ("none", "intent")
_DET_MODES = ("veto", "additive", "off")
_GATING = ("intent", "none")


@dataclass(frozen=True)
class AxisSpec:
    """One axis: a named reward with a weight and an optional intent gate."""

    name: str
    reward: str | None = None          # registry name (None when the instance is passed via ``rewards=``)
    weight: float = 1.0
    gate: str = "none"                 # "none" (always on) or "intent" (on only for gate_on labels)
    options: Mapping[str, Any] = field(default_factory=dict)
    mean: float | None = None          # reference statistics for normalize="fixed"
    std: float | None = None
    calibration: str | None = None     # or a `rewardkit calibrate` JSON file supplying mean and std

    @classmethod
    def parse(cls, raw: Any) -> "AxisSpec":
        if isinstance(raw, AxisSpec):
            return raw
        if not isinstance(raw, Mapping):
            raise ConfigError(f"an axis must be a mapping like {{name: preference, reward: pickscore}}, got {raw!r}")
        unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown axis key(s) {sorted(unknown)}; allowed: name, reward, weight, gate, options, "
                              "mean, std, calibration")
        if not raw.get("name"):
            raise ConfigError(f"axis {dict(raw)!r} needs a name")
        mean, std = raw.get("mean"), raw.get("std")
        if raw.get("calibration") is not None:
            if mean is not None or std is not None:
                raise ConfigError(f"axis {raw['name']!r}: give mean/std or calibration, not both")
            from ..calibration import load_calibration

            try:
                stats = load_calibration(raw["calibration"])
            except (FileNotFoundError, ValueError) as exc:
                raise ConfigError(f"axis {raw['name']!r}: {exc}") from None
            mean, std = stats["mean"], stats["std"]
        spec = cls(name=str(raw["name"]), reward=raw.get("reward"), weight=float(raw.get("weight", 1.0)),
                   gate=str(raw.get("gate", "none")), options=dict(raw.get("options") or {}),
                   mean=None if mean is None else float(mean), std=None if std is None else float(std),
                   calibration=None if raw.get("calibration") is None else str(raw["calibration"]))
        if spec.std is not None and not spec.std > 0:
            raise ConfigError(f"axis {spec.name!r}: std must be > 0, got {spec.std}")
        if spec.gate not in _GATES:
            raise ConfigError(f"axis {spec.name!r}: gate must be one of {_GATES}, got {spec.gate!r}")
        if not math.isfinite(spec.weight):
            raise ConfigError(f"axis {spec.name!r}: weight must be finite")
        return spec


@dataclass
class CompositeConfig(RewardConfig):
    """Configuration of :class:`Composite` (YAML-friendly: plain lists and dicts).

    Attributes:
        axes: list of axis mappings ``{name, reward, weight=1, gate="none"|"intent", options={}}``.
        detectors: None, or ``{reward: "detectors", mode: "veto"|"additive"|"off", target: "preference",
            strength: 1.0 (veto v), penalty: 1.0 (additive), options: {}}``. The detector reward's score is
            1 when an applicable detector fired on the sample, 0 otherwise.
        normalize: "batch" (z-score each axis over the call, the seed's choice), "group" (within groups of
            equal ``group_by``, e.g. the rollouts of one prompt), "fixed" (``(s - mean) / std`` with each
            axis's reference ``mean`` / ``std`` from the config: per-sample, batch-independent) or "none"
            (raw scores; a plain weighted sum).
        group_by: "prompt" or a metadata key, for ``normalize="group"``.
        intent_key: metadata key holding the prompt's intent label (strict / neutral / open).
        gate_on: intent labels that open an ``intent`` gate.
        gating: "intent" (gates as configured) or "none" (every gate open: the ungated ablation).
        judge: optional judge spec (``load_judge`` argument) shared by every judge-based sub-reward, so one
            judge model is loaded once.
        eps: std below which an axis counts as zero-variance (its z-scores are 0).
        on_judge_error: a failing judge call in a judge-based axis: "auto" (follow this call's ``on_error``),
            "nan" or "raise" (see :mod:`rewardkit.judges.policy`); given to every judge-based sub-reward built
            from the config whose options do not set it.
    """

    axes: list = field(default_factory=list)
    detectors: dict | None = None
    normalize: str = "batch"
    group_by: str = "prompt"
    intent_key: str = "intent"
    gate_on: list = field(default_factory=lambda: ["strict"])
    gating: str = "intent"
    judge: str | None = None
    eps: float = 1e-6
    on_judge_error: str = "auto"


class Composite(JudgePolicyMixin, Reward):
    """Several rewards combined per axis by z-score, intent gate and detector veto (see module docs).

    Args:
        config: :class:`CompositeConfig`, a mapping or a YAML path.
        rewards: optional ``{axis name or "detectors": Reward instance}`` for axes built in Python (their
            ``reward`` entry may then be omitted).
        judge: optional judge backend instance shared by judge-based sub-rewards.
    """

    name: ClassVar[str] = "composite"
    tasks = frozenset({"t2i"})
    Config = CompositeConfig

    def __init__(self, config: Any = None, /, *, rewards: Mapping[str, Reward] | None = None, judge: Any = None,
                 **overrides: Any) -> None:
        super().__init__(config, **overrides)
        cfg = self.config
        if cfg.normalize not in _NORMALIZE:
            raise ConfigError(f"normalize must be one of {_NORMALIZE}, got {cfg.normalize!r}")
        if cfg.gating not in _GATING:
            raise ConfigError(f"gating must be one of {_GATING}, got {cfg.gating!r}")
        if cfg.on_judge_error not in JUDGE_ERROR_POLICIES:
            raise ConfigError(f"on_judge_error must be one of {JUDGE_ERROR_POLICIES}, got {cfg.on_judge_error!r}")
        self.axes: list[AxisSpec] = [AxisSpec.parse(a) for a in cfg.axes]
        if not self.axes:
            raise ConfigError("a composite needs at least one axis")
        if cfg.normalize == "fixed":
            missing = [a.name for a in self.axes if a.mean is None or a.std is None]
            if missing:
                raise ConfigError(f"normalize='fixed' needs mean and std on every axis; missing on {missing}")
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names) or "detectors" in names:
            raise ConfigError(f"axis names must be unique and not 'detectors': {names}")
        rewards = dict(rewards or {})
        unknown = set(rewards) - set(names) - {"detectors"}
        if unknown:
            raise ConfigError(f"rewards= names no axis: {sorted(unknown)} (axes: {names})")
        self._judge = judge
        if self._judge is None and cfg.judge:
            from ..judges import load_judge  # issue 3's engine

            self._judge = load_judge(cfg.judge)
        self.rewards: dict[str, Reward] = {}
        for a in self.axes:
            self.rewards[a.name] = rewards.get(a.name) or self._build(a.reward, a.options, f"axis {a.name!r}")
        self.det = dict(cfg.detectors or {})
        if self.det:
            allowed = {"reward", "mode", "target", "strength", "penalty", "options"}
            if set(self.det) - allowed:
                raise ConfigError(f"unknown detectors key(s) {sorted(set(self.det) - allowed)}; allowed: {sorted(allowed)}")
            self.det.setdefault("mode", "veto")
            self.det.setdefault("target", names[0])
            if self.det["mode"] not in _DET_MODES:
                raise ConfigError(f"detectors.mode must be one of {_DET_MODES}, got {self.det['mode']!r}")
            if self.det["target"] not in names:
                raise ConfigError(f"detectors.target {self.det['target']!r} is not an axis ({names})")
            if self.det["mode"] != "off":
                self.rewards["detectors"] = rewards.get("detectors") or self._build(
                    self.det.get("reward", "detectors"), self.det.get("options") or {}, "detectors")
        self.dimensions = tuple(self._dimension_names())
        # z-scores over the batch / prompt group: a score depends on the call (the base then never chunks it)
        self.batch_relative = cfg.normalize in ("batch", "group")
        self.tasks = frozenset.intersection(*[frozenset(r.tasks) for r in self.rewards.values()]) or frozenset({"t2i"})
        self.uses_prompt = any(r.uses_prompt for r in self.rewards.values())

    # ------------------------------------------------------------------ construction
    def _build(self, name: str | None, options: Mapping[str, Any], what: str) -> Reward:
        if not name:
            raise ConfigError(f"{what} has no 'reward' and no instance was passed in rewards=")
        from ..registry import get_reward_class

        cls = get_reward_class(name)
        opts = dict(options)
        kwargs: dict[str, Any] = {}
        if self._judge is not None and getattr(cls, "uses_judge", False) and "judge" not in opts:
            kwargs["judge"] = self._judge
        if "on_judge_error" not in opts and "on_judge_error" in {f.name for f in dataclasses.fields(cls.Config)}:
            opts["on_judge_error"] = self.config.on_judge_error
        return cls(opts, **kwargs)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = (), *, section: str | None = None,
                  **kwargs: Any) -> "Composite":
        """Build from a YAML file (optionally one ``section`` of it, e.g. a recipe's ``reward:``)."""
        return build_composite(path, overrides, section=section, cls=cls, **kwargs)

    def _dimension_names(self) -> list[str]:
        dims = []
        for a in self.axes:
            dims += [f"{a.name}/raw", f"{a.name}/z"]
            if a.gate == "intent":
                dims.append(f"{a.name}/gate")
        if "detectors" in self.rewards:
            dims += ["detectors/fired", f"{self.det['target']}/z_vetoed"]
        return dims

    def to(self, device):
        for r in self.rewards.values():
            r.to(device)
        self._device = torch.device(device)
        return self

    # ------------------------------------------------------------------ scoring
    def _normalise(self, x: torch.Tensor, mask: torch.Tensor, batch: RewardBatch, axis: AxisSpec) -> torch.Tensor:
        cfg = self.config
        if cfg.normalize in ("none", "fixed"):
            if cfg.normalize == "fixed":
                x = (x - axis.mean) / axis.std
            return torch.where(mask & torch.isfinite(x), x, torch.full_like(x, float("nan")))
        if cfg.normalize == "group":
            keys = [p if cfg.group_by == "prompt" else repr(m.get(cfg.group_by))
                    for p, m in zip(batch.prompts, batch.metadata)]
            return group_zscore(x, keys, mask, cfg.eps)
        return zscore(x, mask, cfg.eps)

    def _intents(self, batch: RewardBatch) -> list[str | None]:
        key = self.config.intent_key
        labels = [m.get(key) for m in batch.metadata]
        if any(lab is None for lab in labels):
            # A sub-reward with an intent cache (the constraint reward) fills labels metadata did not give.
            for r in self.rewards.values():
                lookup = getattr(r, "intent_for", None)
                if lookup is not None:
                    found = lookup(batch.prompts)
                    labels = [lab if lab is not None else f for lab, f in zip(labels, found)]
                    break
        return labels

    def _score(self, batch: RewardBatch) -> RewardOutput:
        cfg = self.config
        n = len(batch)
        sub_bs = batch.chunk_size
        outs: dict[str, RewardOutput] = {}
        for name, r in self.rewards.items():
            outs[name] = r(batch.images, batch.prompts if r.uses_prompt else None,
                           sources=batch.sources if (r.accepts_sources and batch.sources is not None) else None,
                           metadata=batch.metadata, batch_size=sub_bs, on_error="nan")

        intents = self._intents(batch) if any(a.gate == "intent" for a in self.axes) else [None] * n
        dims: dict[str, torch.Tensor] = {}
        terms, weights, gates = [], [], []
        errors: list[list[str]] = [[] for _ in range(n)]
        for a in self.axes:
            out = outs[a.name]
            if a.gate == "intent" and cfg.gating == "intent":
                g = intent_gate(intents, cfg.gate_on)
            else:
                g = torch.ones(n)
            z = self._normalise(out.scores, out.valid & (g > 0), batch, a)
            dims[f"{a.name}/raw"] = out.scores
            dims[f"{a.name}/z"] = z
            if a.gate == "intent":
                dims[f"{a.name}/gate"] = g
            terms.append(z)
            weights.append(a.weight)
            gates.append(g)
            for i in range(n):
                if g[i] > 0 and not bool(out.valid[i]):
                    errors[i].append(f"axis {a.name!r}: {out.errors[i]}")

        info: dict[str, Any] = {"normalize": cfg.normalize, "gating": cfg.gating,
                                "weights": {a.name: a.weight for a in self.axes}}
        if "detectors" in self.rewards:
            det = outs["detectors"]
            fired = torch.where(det.valid, det.scores, torch.zeros(n))
            for i in range(n):
                if not bool(det.valid[i]):
                    errors[i].append(f"detectors: {det.errors[i]}")
            k = [a.name for a in self.axes].index(self.det["target"])
            if self.det["mode"] == "veto":
                terms[k] = veto(terms[k], fired, float(self.det.get("strength", 1.0)))
            else:
                terms[k] = additive_penalty(terms[k], fired, float(self.det.get("penalty", 1.0)))
            dims["detectors/fired"] = torch.where(det.valid, det.scores, torch.full((n,), float("nan")))
            dims[f"{self.det['target']}/z_vetoed"] = terms[k]
            for dname, v in det.dimensions.items():
                dims[f"detectors/{dname}"] = v
            info["detectors"] = {"mode": self.det["mode"], "target": self.det["target"]}

        scores = combine(terms, weights, gates)
        valid = torch.tensor([not errs for errs in errors], dtype=torch.bool) & torch.isfinite(scores)
        scores = torch.where(valid, scores, torch.full_like(scores, float("nan")))
        errs = ["; ".join(e) if e else (None if bool(valid[i]) else "non-finite composite score")
                for i, e in enumerate(errors)]
        details = [{"intent": lab} for lab in intents] if any(lab is not None for lab in intents) else None
        return RewardOutput(scores=scores, valid=valid, errors=errs, dimensions=dims, info=info, details=details)

    @classmethod
    def tiny(cls, workdir: str) -> "Composite":
        """Two tiny CLIP rewards z-scored and summed (the same code path as any composite)."""
        from ..rewards.clipscore import CLIPScore
        from ..rewards.pickscore import PickScore

        return cls(axes=[{"name": "preference"}, {"name": "alignment", "weight": 0.5}],
                   rewards={"preference": PickScore.tiny(workdir), "alignment": CLIPScore.tiny(workdir)})


@dataclass
class WeightedSumConfig(CompositeConfig):
    """A :class:`CompositeConfig` whose default is no normalisation: ``R = sum_k w_k * s_k``."""

    normalize: str = "none"


class WeightedSum(Composite):
    """``R_i = sum_k w_k * s_k,i`` on raw scores (the naive baseline the seed argues against).

    With ``normalize="none"`` (default) each sample's score depends only on that sample, so it passes every
    conformance check; ``normalize="batch"`` gives z-scored sums.
    """

    name: ClassVar[str] = "weighted-sum"
    Config = WeightedSumConfig

    @classmethod
    def tiny(cls, workdir: str) -> "WeightedSum":
        from ..rewards.clipscore import CLIPScore
        from ..rewards.pickscore import PickScore

        return cls(axes=[{"name": "pickscore", "weight": 1.0}, {"name": "clipscore", "weight": 0.5}],
                   rewards={"pickscore": PickScore.tiny(workdir), "clipscore": CLIPScore.tiny(workdir)})


def build_composite(source: Any, overrides: Sequence[str] = (), *, section: str | None = None,
                    cls: type[Composite] = Composite, **kwargs: Any) -> Composite:
    """A composite from a YAML path or mapping (``section`` picks a key, e.g. a recipe's ``"reward"``),
    with CLI-style ``key=value`` overrides (``normalize=group``, ``gating=none``)."""
    if isinstance(source, (str, Path)):
        data = _read_yaml(source)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        raise ConfigError(f"build_composite takes a YAML path or a mapping, got {type(source).__name__}")
    if section is not None:
        if section not in data or not isinstance(data[section], Mapping):
            raise ConfigError(f"no mapping {section!r} in the composite config (keys: {sorted(data)})")
        data = dict(data[section])
    cfg = build_config(cls.Config, data, parse_overrides(overrides))
    return cls(cfg, **kwargs)
