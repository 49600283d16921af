"""The constructor set-up the judge rewards share (vqascore, unifiedreward, qwenvl, evr, rational; detectors and
faithfulness: the ``judge=`` spec string): a judge spec given as ``judge=`` moved into the config, the judge backend
from the config, and the template, answer scale and token budget of a generative judge that answers on its
template's scale. No reward lives here."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["judge_overrides", "judge_from_config", "scored_template"]


def judge_overrides(overrides: dict[str, Any], **judges: Any) -> dict[str, Any]:
    """``overrides`` with each judge given as a spec string (``judge="vllm:..."``) set as that config option; a
    judge given as an object (a backend, a ``(model, processor)`` tuple) stays a constructor argument."""
    return {**overrides, **{key: value for key, value in judges.items() if isinstance(value, str)}}


def judge_from_config(judge: Any, cfg: Any, *, owner: str, spec: str | None = None, missing: str | None = None):
    """The judge backend of a judge reward: ``judge`` (a backend / ``(model, processor)`` / spec), else the
    config's ``judge`` spec or ``model`` shorthand (``spec`` when given), with ``device`` / ``dtype`` merged into
    ``judge_kwargs``. ``missing``: the error when there is neither (default:
    :func:`~rewardkit.judges.resolve_judge`'s)."""
    from ..judges import judge_spec, resolve_judge

    spec = (cfg.judge or cfg.model) if spec is None else spec
    if spec:
        spec, kw = judge_spec(spec, cfg.judge_kwargs, device=cfg.device, dtype=cfg.dtype)
    else:
        kw = dict(cfg.judge_kwargs)
        if missing is not None and (judge is None or isinstance(judge, str)):
            raise ValueError(missing)
    return resolve_judge(judge, spec, kw, owner=owner)


def scored_template(cfg: Any, family: str, *, owner: str, default_max_new_tokens: int
                    ) -> tuple[Any, int, tuple[float, float]]:
    """The set-up of a generative judge that answers on its template's scale: the config's ``on_judge_error``
    checked, ``(template, max_new_tokens, (score_min, score_max))``. ``max_new_tokens`` is the config's, else
    the template's, else ``default_max_new_tokens``; it and ``batch_size`` must be >= 1; the scale must be
    finite and increasing."""
    from ..judges import load_template
    from ..judges.policy import check_policy

    check_policy(cfg.on_judge_error, owner)
    t = load_template(family, cfg.template)
    n = int(cfg.max_new_tokens if cfg.max_new_tokens is not None
            else t.get("max_new_tokens", default_max_new_tokens))
    if cfg.batch_size < 1 or n < 1:
        raise ValueError("batch_size and max_new_tokens must be >= 1")
    lo, hi = float(t["score_min"]), float(t["score_max"])
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"template {t.id}: score_min < score_max required, got {lo}, {hi}")
    return t, n, (lo, hi)
