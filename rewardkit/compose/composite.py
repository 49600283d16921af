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
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import torch

from ..config import _read_yaml, build_config, parse_overrides
from ..errors import ConfigError
from ..judges.policy import JUDGE_ERROR_POLICIES, JudgePolicyMixin, join_reasons
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from .functions import DEFAULT_EPS, ZSCORE_MODES, additive_penalty, combine, group_zscore, intent_gate, veto, zscore

__all__ = ["Composite", "CompositeConfig", "WeightedSum", "WeightedSumConfig", "AxisSpec", "AxisScores",
           "build_composite"]

_CAPTURE = threading.local()   # Composite.axis_scores: collects the formula's inputs of the running call

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
class AxisScores:
    """The per-sample inputs of a :class:`Composite`'s formula, before any batch statistic.

    All tensors are ``[B]``; keys of ``raw`` / ``valid`` / ``errors`` are the axis names plus ``"detectors"``
    when detectors are on (its raw score is 1 when an applicable detector fired).

    Attributes:
        raw: float32 sub-reward scores (NaN where invalid).
        valid: bool validity per axis.
        errors: per axis, B reasons (None when valid).
        gates: per axis, float 0/1 gate (all ones for an ungated axis).
        intents: B intent labels (None when unknown).
        group_keys: B keys for ``normalize="group"``.
        input_errors: B reasons a sample's input could not be read (None when it could).
        detector_dims: per-detector float ``[B]`` verdicts (NaN where not enabled).
    """

    raw: dict[str, torch.Tensor]
    valid: dict[str, torch.Tensor]
    errors: dict[str, list[str | None]]
    gates: dict[str, torch.Tensor]
    intents: list[str | None]
    group_keys: list[Any]
    input_errors: list[str | None]
    detector_dims: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_errors)

    @classmethod
    def empty(cls, n: int, names: Sequence[str], axes: Sequence[str], dims: Sequence[str] = ()) -> "AxisScores":
        nan = lambda: torch.full((n,), float("nan"))  # noqa: E731
        return cls(raw={k: nan() for k in names}, valid={k: torch.zeros(n, dtype=torch.bool) for k in names},
                   errors={k: ["not scored"] * n for k in names}, gates={k: torch.zeros(n) for k in axes},
                   intents=[None] * n, group_keys=[None] * n, input_errors=[None] * n,
                   detector_dims={d: nan() for d in dims})

    def _place(self, indices: Sequence[int], part: "AxisScores") -> None:
        idx = torch.tensor(list(indices), dtype=torch.long)
        for k in self.raw:
            self.raw[k][idx] = part.raw[k]
            self.valid[k][idx] = part.valid[k]
            for j, i in enumerate(indices):
                self.errors[k][i] = part.errors[k][j]
        for k in self.gates:
            self.gates[k][idx] = part.gates[k]
        for d, v in part.detector_dims.items():
            self.detector_dims[d][idx] = v
        for j, i in enumerate(indices):
            self.intents[i] = part.intents[j]
            self.group_keys[i] = part.group_keys[j]

    @classmethod
    def cat(cls, parts: Sequence["AxisScores"]) -> "AxisScores":
        """Concatenate along the batch (e.g. every rank's slice, in rank order)."""
        parts = list(parts)
        if not parts:
            raise ValueError("AxisScores.cat needs at least one part")
        first = parts[0]
        for p in parts[1:]:
            if set(p.raw) != set(first.raw) or set(p.gates) != set(first.gates):
                raise ValueError("AxisScores from different composites cannot be concatenated")
        dims = sorted({d for p in parts for d in p.detector_dims})
        cat = lambda get, n_of=None: torch.cat([get(p) for p in parts])  # noqa: E731
        return cls(raw={k: cat(lambda p: p.raw[k]) for k in first.raw},
                   valid={k: cat(lambda p: p.valid[k]) for k in first.raw},
                   errors={k: [e for p in parts for e in p.errors[k]] for k in first.raw},
                   gates={k: cat(lambda p: p.gates[k]) for k in first.gates},
                   intents=[x for p in parts for x in p.intents],
                   group_keys=[x for p in parts for x in p.group_keys],
                   input_errors=[x for p in parts for x in p.input_errors],
                   detector_dims={d: cat(lambda p: p.detector_dims.get(d, torch.full((len(p),), float("nan"))))
                                  for d in dims})

    def to_payload(self) -> dict[str, Any]:
        """Plain Python lists (exact: float32 -> float is lossless), for ``all_gather_object``."""
        return {"raw": {k: v.tolist() for k, v in self.raw.items()},
                "valid": {k: v.tolist() for k, v in self.valid.items()},
                "errors": self.errors, "gates": {k: v.tolist() for k, v in self.gates.items()},
                "intents": self.intents, "group_keys": self.group_keys, "input_errors": self.input_errors,
                "detector_dims": {k: v.tolist() for k, v in self.detector_dims.items()}}

    @classmethod
    def from_payload(cls, d: Mapping[str, Any]) -> "AxisScores":
        f32 = lambda x: torch.tensor(x, dtype=torch.float32).reshape(-1)  # noqa: E731
        return cls(raw={k: f32(v) for k, v in d["raw"].items()},
                   valid={k: torch.tensor(v, dtype=torch.bool).reshape(-1) for k, v in d["valid"].items()},
                   errors={k: list(v) for k, v in d["errors"].items()},
                   gates={k: f32(v) for k, v in d["gates"].items()}, intents=list(d["intents"]),
                   group_keys=list(d["group_keys"]), input_errors=list(d["input_errors"]),
                   detector_dims={k: f32(v) for k, v in d["detector_dims"].items()})


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
        zscore: ``"rl"`` (default): ``(x - mean) / (std + eps)``, the advantage formula of flow_grpo /
            DiffusionNFT, continuous in the scores; ``"cutoff"``: ``(x - mean) / std``, and 0 when
            ``std < eps``. See ``docs/compose.md``.
        eps: ``None`` = 1e-4 for ``zscore="rl"`` (flow_grpo's value), 1e-6 for ``"cutoff"``.
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
    zscore: str = "rl"
    eps: float | None = None
    on_judge_error: str = "auto"


class Composite(JudgePolicyMixin, Reward):
    """Several rewards combined per axis by z-score, intent gate and detector veto (docs/compose.md).

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
        if cfg.zscore not in ZSCORE_MODES:
            raise ConfigError(f"zscore must be one of {ZSCORE_MODES}, got {cfg.zscore!r}")
        if cfg.eps is not None and not (0 < float(cfg.eps) < math.inf):
            raise ConfigError(f"eps must be a finite number > 0, got {cfg.eps!r}")
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
        # an empty prompt is scored iff every sub-reward that reads the prompt scores one (pickscore + hpsv2:
        # yes, as each alone) and no intent judge reads it; otherwise it is the sample's input error
        intent = cfg.gating == "intent" and any(a.gate == "intent" for a in self.axes)
        self.scores_empty_prompt = not intent and all(r.scores_empty_prompt for r in self.rewards.values()
                                                      if r.uses_prompt)

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
    def _zmode(self) -> tuple[str, float]:
        cfg = self.config
        return cfg.zscore, (DEFAULT_EPS[cfg.zscore] if cfg.eps is None else float(cfg.eps))

    def _normalise(self, x: torch.Tensor, mask: torch.Tensor, keys: Sequence[Any], axis: AxisSpec) -> torch.Tensor:
        cfg = self.config
        if cfg.normalize in ("none", "fixed"):
            if cfg.normalize == "fixed":
                x = (x - axis.mean) / axis.std
            return torch.where(mask & torch.isfinite(x), x, torch.full_like(x, float("nan")))
        mode, eps = self._zmode()
        if cfg.normalize == "group":
            return group_zscore(x, list(keys), mask, eps, mode=mode)
        return zscore(x, mask, eps, mode=mode)

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

    def _group_keys(self, batch: RewardBatch) -> list[str]:
        by = self.config.group_by
        return [p if by == "prompt" else repr(m.get(by)) for p, m in zip(batch.prompts, batch.metadata)]

    def _axis_scores_batch(self, batch: RewardBatch) -> "AxisScores":
        """Every per-sample input of the formula (sub-reward scores, validity, gates, detector verdicts)."""
        cfg = self.config
        n = len(batch)
        sub_bs = batch.chunk_size
        outs: dict[str, RewardOutput] = {}
        for name, r in self.rewards.items():
            outs[name] = r(batch.images, batch.prompts if r.uses_prompt else None,
                           sources=batch.sources if (r.accepts_sources and batch.sources is not None) else None,
                           metadata=batch.metadata, batch_size=sub_bs, on_error="nan")
        intents = self._intents(batch) if any(a.gate == "intent" for a in self.axes) else [None] * n
        gates = {}
        for a in self.axes:
            gated = a.gate == "intent" and cfg.gating == "intent"
            gates[a.name] = intent_gate(intents, cfg.gate_on) if gated else torch.ones(n)
        det_dims = {}
        if "detectors" in outs:
            det_dims = {k: v.clone() for k, v in outs["detectors"].dimensions.items()}
        return AxisScores(
            raw={k: o.scores.detach().float().clone() for k, o in outs.items()},
            valid={k: o.valid.clone() for k, o in outs.items()},
            errors={k: list(o.errors) for k, o in outs.items()},
            gates=gates, intents=list(intents), group_keys=self._group_keys(batch),
            input_errors=[None] * n, detector_dims=det_dims)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        axes = self._axis_scores_batch(batch)
        slot = getattr(_CAPTURE, "slot", None)
        if slot is not None and slot[0] is self:   # axis_scores(): keep the inputs of the formula
            slot[1].append((list(batch.indices), axes))
        return self.combine(axes)

    def axis_scores(self, images: Any, prompt: Any = None, *, sources: Any = None, metadata: Any = None,
                    batch_size: int | None = None, on_error: str = "nan") -> "AxisScores":
        """The per-sample inputs of the formula, without the batch statistics: each axis's raw score and
        validity, the intent gates, the detector verdicts, and each sample's group key.

        Use it where the samples of one z-score batch are spread over processes (an RL trainer's ranks)::

            axes = comp.axis_scores(images, prompts, metadata=meta)      # this rank's slice
            out = rewardkit.distributed.gather_combine(comp, axes)      # all ranks, in rank order

        ``combine(AxisScores.cat([a_0, ..., a_R]))`` equals one call over all the samples. Arguments are as in
        ``__call__``; with ``on_error="nan"`` (default) a bad input is an invalid sample, not an exception.
        """
        slot = (self, [])
        prev = getattr(_CAPTURE, "slot", None)
        _CAPTURE.slot = slot
        try:
            out = self(images, prompt, sources=sources, metadata=metadata, batch_size=batch_size, on_error=on_error)
        finally:
            _CAPTURE.slot = prev
        n = len(out)
        names = list(self.rewards)
        full = AxisScores.empty(n, names, [a.name for a in self.axes],
                                dims=sorted({d for _, ax in slot[1] for d in ax.detector_dims}))
        for indices, ax in slot[1]:
            full._place(indices, ax)
        for i in range(n):
            if all(i not in idx for idx, _ in slot[1]):
                full.input_errors[i] = out.errors[i] or "input could not be read"
        return full

    def combine(self, axis_scores: "AxisScores", group_keys: Sequence[Any] | None = None) -> RewardOutput:
        """The composite formula over ``axis_scores`` (e.g. gathered from every rank): z-scores, veto, gates.

        Args:
            axis_scores: from :meth:`axis_scores` (or several concatenated with :meth:`AxisScores.cat`).
            group_keys: B hashable keys for ``normalize="group"`` (e.g. the host's prompt ids); default the
                keys recorded by :meth:`axis_scores` (the prompt, or ``metadata[group_by]``).

        Each axis's statistics use only samples valid on *every* axis that is on for them (and on the
        detectors): a sample whose score will be NaN anyway does not move anyone else's z-score.
        """
        cfg = self.config
        ax = axis_scores
        if not isinstance(ax, AxisScores):
            raise TypeError(f"combine takes AxisScores (from Composite.axis_scores), got {type(ax).__name__}")
        missing = set(self.rewards) - set(ax.raw)
        if missing:
            raise ValueError(f"axis scores lack {sorted(missing)}; they were made by a different composite")
        n = len(ax)
        keys = list(ax.group_keys if group_keys is None else group_keys)
        if len(keys) != n:
            raise ValueError(f"got {len(keys)} group keys for {n} samples")
        # per sample: its input error, else (label, reason) of each enabled axis without a score
        parts: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        for a in self.axes:
            g, v = ax.gates[a.name], ax.valid[a.name]
            for i in range(n):
                if not ax.input_errors[i] and g[i] > 0 and not bool(v[i]):
                    parts[i].append((f"axis {a.name!r}", ax.errors[a.name][i] or "no score"))
        has_det = "detectors" in self.rewards
        if has_det:
            for i in range(n):
                if not ax.input_errors[i] and not bool(ax.valid["detectors"][i]):
                    parts[i].append(("detectors", ax.errors["detectors"][i] or "no verdict"))
        # a judge failure leads the reason ("judge call failed (axis 'x'): ..."): a score cache must not store it
        errors: list[str | None] = [ax.input_errors[i] or join_reasons(parts[i]) for i in range(n)]
        usable = torch.tensor([not e for e in errors], dtype=torch.bool)   # valid on every enabled axis

        dims: dict[str, torch.Tensor] = {}
        terms, weights, gates = [], [], []
        for a in self.axes:
            g, raw = ax.gates[a.name], ax.raw[a.name]
            z = self._normalise(raw, ax.valid[a.name] & (g > 0) & usable, keys, a)
            dims[f"{a.name}/raw"] = torch.where(ax.valid[a.name], raw, torch.full_like(raw, float("nan")))
            dims[f"{a.name}/z"] = z
            if a.gate == "intent":
                dims[f"{a.name}/gate"] = g
            terms.append(z)
            weights.append(a.weight)
            gates.append(g)
        mode, eps = self._zmode()
        info: dict[str, Any] = {"normalize": cfg.normalize, "gating": cfg.gating,
                                "weights": {a.name: a.weight for a in self.axes}}
        if cfg.normalize in ("batch", "group"):
            info["zscore"] = {"mode": mode, "eps": eps}
        if has_det:
            det_ok = ax.valid["detectors"]
            fired = torch.where(det_ok, ax.raw["detectors"], torch.zeros(n))
            k = [a.name for a in self.axes].index(self.det["target"])
            if self.det["mode"] == "veto":
                terms[k] = veto(terms[k], fired, float(self.det.get("strength", 1.0)))
            else:
                terms[k] = additive_penalty(terms[k], fired, float(self.det.get("penalty", 1.0)))
            dims["detectors/fired"] = torch.where(det_ok, ax.raw["detectors"], torch.full((n,), float("nan")))
            dims[f"{self.det['target']}/z_vetoed"] = terms[k]
            for dname, v in ax.detector_dims.items():
                dims[f"detectors/{dname}"] = v
            info["detectors"] = {"mode": self.det["mode"], "target": self.det["target"]}

        scores = combine(terms, weights, gates)
        valid = usable & torch.isfinite(scores)
        scores = torch.where(valid, scores, torch.full_like(scores, float("nan")))
        errs = [e if e else (None if bool(valid[i]) else "non-finite composite score")
                for i, e in enumerate(errors)]
        details = [{"intent": lab} for lab in ax.intents] if any(lab is not None for lab in ax.intents) else None
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
    """Plain weighted sum of raw scores, ``R_i = sum_k w_k * s_k,i`` (no per-axis normalisation).

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
