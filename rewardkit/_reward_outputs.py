"""The contract's results: :class:`RewardOutput` (what a reward returns) and :class:`PairwiseOutput` (what
``compare`` returns).

Import them from :mod:`rewardkit.reward`, the contract's public module; they live here so that the modules the
contract uses (:mod:`rewardkit.preprocess`) can build them without importing :mod:`rewardkit.reward`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

__all__ = ["RewardOutput", "PairwiseOutput"]



def _mask(valid: Any, n: int) -> torch.Tensor:
    """A reward's ``valid`` as a bool ``[n]`` tensor; a mask of another length is a bug, never broadcast."""
    mask = torch.as_tensor(valid, dtype=torch.bool).reshape(-1)
    if mask.shape[0] != n:
        raise ValueError(f"valid has {mask.shape[0]} entries for {n} values")
    return mask


def _json_float(x: float) -> float | None:
    return None if (x is None or math.isnan(x) or math.isinf(x)) else float(x)


@dataclass
class RewardOutput:
    """Scores for a batch of B samples.

    Attributes:
        scores: float32 tensor ``[B]``; NaN where a sample is invalid or the reward does not apply.
        valid: bool tensor ``[B]``.
        errors: ``B`` entries, the reason a sample is invalid (None when valid).
        dimensions: name -> float32 tensor ``[B]`` of per-dimension scores (NaN where not available).
        rationales: ``B`` optional texts (judges), or None.
        info: JSON-serialisable call-level extras (model id, template version, ...).
        details: ``B`` optional JSON-serialisable per-sample extras (e.g. a judge's verdicts), or None.
    """

    scores: torch.Tensor
    valid: torch.Tensor | None = None
    errors: list[str | None] | None = None
    dimensions: dict[str, torch.Tensor] = field(default_factory=dict)
    rationales: list[str | None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    details: list[dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        self.scores = torch.as_tensor(self.scores, dtype=torch.float32).detach().cpu().reshape(-1) \
            if not (isinstance(self.scores, torch.Tensor) and self.scores.requires_grad) \
            else self.scores.float().reshape(-1)
        n = self.scores.shape[0]
        finite = torch.isfinite(self.scores.detach()).cpu()  # one transfer when scores stay on a device (grad)
        self.valid = finite if self.valid is None else _mask(self.valid, n).cpu() & finite
        if self.errors is None:
            self.errors = [None] * n
        self.errors = list(self.errors)
        if len(self.errors) != n:  # before the loop below indexes it (a short list was an IndexError)
            raise ValueError(f"errors has {len(self.errors)} entries for {n} scores")
        oks = self.valid.tolist()
        fins = oks if self.valid is finite else finite.tolist()  # valid is finite itself when the reward gave none
        for i, (ok, fin) in enumerate(zip(oks, fins)):  # Python bools: no per-item indexing
            if not ok and not self.errors[i]:
                self.errors[i] = "non-finite score" if not fin else "marked invalid by the reward"
            elif ok:
                self.errors[i] = None
        self.dimensions = {k: torch.as_tensor(v, dtype=torch.float32).detach().cpu().reshape(-1)
                           for k, v in (self.dimensions or {}).items()}
        for k, v in self.dimensions.items():
            if v.shape[0] != n:
                raise ValueError(f"dimension {k!r} has {v.shape[0]} values for {n} scores")
        for name in ("errors", "rationales", "details"):
            seq = getattr(self, name)
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries for {n} scores")

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @classmethod
    def invalid(cls, n: int, reason: str, dimensions: Sequence[str] = ()) -> "RewardOutput":
        """All-invalid output: NaN scores with one reason."""
        nan = torch.full((n,), float("nan"))
        return cls(scores=nan, valid=torch.zeros(n, dtype=torch.bool), errors=[reason] * n,
                   dimensions={d: nan.clone() for d in dimensions})

    def tolist(self) -> list[float | None]:
        """Scores as Python floats; invalid samples are None."""
        return [_json_float(s) if v else None for s, v in zip(self.scores.tolist(), self.valid.tolist())]

    def records(self) -> list[dict[str, Any]]:
        """One JSON-serialisable dict per sample (what ``rewardkit score`` writes as JSONL)."""
        out = []
        for i in range(len(self)):
            rec: dict[str, Any] = {"score": _json_float(float(self.scores[i])), "valid": bool(self.valid[i]),
                                   "error": self.errors[i]}
            if self.dimensions:
                rec["dimensions"] = {k: _json_float(float(v[i])) for k, v in self.dimensions.items()}
            if self.rationales is not None:
                rec["rationale"] = self.rationales[i]
            if self.details is not None and self.details[i] is not None:
                rec["details"] = self.details[i]
            out.append(rec)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole output as JSON-serialisable lists (NaN -> None)."""
        return {
            "scores": [_json_float(x) for x in self.scores.tolist()],
            "valid": self.valid.tolist(),
            "errors": list(self.errors),
            "dimensions": {k: [_json_float(x) for x in v.tolist()] for k, v in self.dimensions.items()},
            "rationales": None if self.rationales is None else list(self.rationales),
            "info": dict(self.info),
            "details": None if self.details is None else list(self.details),
        }

    @classmethod
    def concat(cls, outputs: Sequence["RewardOutput"]) -> "RewardOutput":
        """Concatenate chunk outputs along the batch; ``info`` is merged (later chunks win)."""
        if not outputs:
            return cls(scores=torch.zeros(0))
        dims: list[str] = []
        for o in outputs:
            dims += [d for d in o.dimensions if d not in dims]
        info: dict[str, Any] = {}
        for o in outputs:
            info.update(o.info)
        any_rat = any(o.rationales is not None for o in outputs)
        any_det = any(o.details is not None for o in outputs)
        return cls(
            scores=torch.cat([o.scores for o in outputs]),
            valid=torch.cat([o.valid for o in outputs]),
            errors=[e for o in outputs for e in o.errors],
            dimensions={d: torch.cat([o.dimensions.get(d, torch.full((len(o),), float("nan"))) for o in outputs])
                        for d in dims},
            rationales=[r for o in outputs for r in (o.rationales or [None] * len(o))] if any_rat else None,
            info=info,
            details=[r for o in outputs for r in (o.details or [None] * len(o))] if any_det else None,
        )


@dataclass
class PairwiseOutput:
    """Preference between two candidates per sample.

    Attributes:
        prob_a: float32 tensor ``[B]`` in [0, 1], P(candidate a preferred); NaN where invalid.
        valid, errors, rationales, info: as in :class:`RewardOutput`.
        scores_a, scores_b: the underlying scores when the comparison was derived from scores.
    """

    prob_a: torch.Tensor
    valid: torch.Tensor | None = None
    errors: list[str | None] | None = None
    rationales: list[str | None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    scores_a: torch.Tensor | None = None
    scores_b: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.prob_a = torch.as_tensor(self.prob_a, dtype=torch.float32).detach().cpu().reshape(-1)
        n = self.prob_a.shape[0]
        finite = torch.isfinite(self.prob_a)
        self.valid = finite.clone() if self.valid is None else _mask(self.valid, n).cpu() & finite
        self.errors = list(self.errors) if self.errors is not None else [None] * n
        for name in ("errors", "rationales"):
            seq = getattr(self, name)
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries for {n} probabilities")
        for i in range(n):
            if not bool(self.valid[i]) and not self.errors[i]:
                self.errors[i] = "non-finite probability"
            elif bool(self.valid[i]):
                self.errors[i] = None
        if bool(((self.prob_a[finite] < 0) | (self.prob_a[finite] > 1)).any()):
            raise ValueError("prob_a must lie in [0, 1]")

    def __len__(self) -> int:
        return int(self.prob_a.shape[0])

    def tolist(self) -> list[float | None]:
        return [_json_float(p) if v else None for p, v in zip(self.prob_a.tolist(), self.valid.tolist())]

    def to_dict(self) -> dict[str, Any]:
        d = {"prob_a": [_json_float(x) for x in self.prob_a.tolist()], "valid": self.valid.tolist(),
             "errors": list(self.errors), "rationales": self.rationales, "info": dict(self.info)}
        if self.scores_a is not None:
            d["scores_a"] = [_json_float(x) for x in self.scores_a.tolist()]
            d["scores_b"] = [_json_float(x) for x in self.scores_b.tolist()]
        return d


def scatter(scored: RewardOutput, ok: list[int], errors: list[str | None], n: int,
            dimensions: Sequence[str] = ()) -> RewardOutput:
    """The output of a call of ``n`` samples from ``scored``, the outputs of the samples ``ok`` (in that order):
    the other samples get NaN, valid=False and their reason from ``errors``; each name of ``dimensions`` the
    reward declares and did not return is NaN for all (``Reward.__call__`` and the tensor path end with it)."""
    if len(ok) == n:
        missing = [d for d in dimensions if d not in scored.dimensions]
        if not missing:
            return scored
        return RewardOutput(scores=scored.scores, valid=scored.valid, errors=list(scored.errors),
                            dimensions={**scored.dimensions, **{d: torch.full((n,), float("nan")) for d in missing}},
                            rationales=scored.rationales, info=scored.info, details=scored.details)
    idx = torch.tensor(ok, dtype=torch.long)
    scores = torch.full((n,), float("nan"))
    valid = torch.zeros(n, dtype=torch.bool)
    if ok:
        scores = scores.to(scored.scores.dtype)
        scores[idx] = scored.scores.detach() if not scored.scores.requires_grad else scored.scores
        valid[idx] = scored.valid
    dims = {}
    for k, v in scored.dimensions.items():
        full = torch.full((n,), float("nan"))
        if ok:
            full[idx] = v
        dims[k] = full
    for dname in dimensions:
        dims.setdefault(dname, torch.full((n,), float("nan")))
    errs = list(errors)
    rats = None if scored.rationales is None else [None] * n
    dets = None if scored.details is None else [None] * n
    for j, i in enumerate(ok):
        errs[i] = scored.errors[j]
        if rats is not None:
            rats[i] = scored.rationales[j]
        if dets is not None:
            dets[i] = scored.details[j]
    return RewardOutput(scores=scores, valid=valid, errors=errs, dimensions=dims, rationales=rats,
                        info=scored.info, details=dets)
