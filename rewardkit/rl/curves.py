"""``curves.png`` from ``metrics.jsonl``: reward mean +- std per component (evaluations, from the epoch-0
baseline on, as squares), zero-std-group ratio, losses and KL (``kl_div``, ``old_kl_div``, ``old_deviate``),
the optimality-probability histogram per epoch, and for E²PO the achieved anchor similarity with its band."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

__all__ = ["plot_curves"]


def _series(recs: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in recs:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["epoch"])
            ys.append(float(v))
    return xs, ys


def plot_curves(metrics: str | Path, out: str | Path, e2po: Any = None) -> Path | None:
    """Write the training curves; returns the PNG path (None, with a warning, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no curves.png (pip install 'rewardkit-vision[rl]')", stacklevel=2)
        return None
    path = Path(metrics)
    recs = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()] if path.is_file() else []
    recs = [r for r in recs if "final" not in r and "epoch" in r]
    if not recs:
        return None
    # every logged reward series (total, components, dimensions such as a composite's "<name>.<axis>/raw"),
    # except z-scores and gates: a z-scored series has mean 0 by construction
    names = {k[len("reward/"):-len("/mean")] for r in recs for k in r
             if k.startswith("reward/") and k.endswith("/mean") and "/mean_" not in k}
    comps = sorted(c for c in names if c.rsplit("/", 1)[-1] not in ("z", "z_vetoed", "gate"))
    e2po_keys = sorted({k for r in recs for k in r if k.startswith("e2po/") and k.endswith("anchor_sim_mean")})
    panels = 4 + (1 if e2po_keys else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), squeeze=False)
    ax = axes[0]
    for c in comps:
        xs, m = _series(recs, f"reward/{c}/mean")
        _, sd = _series(recs, f"reward/{c}/std")
        if xs:
            line = ax[0].plot(xs, m, marker=".", label=c)[0]
            if len(sd) == len(m):
                ax[0].fill_between(xs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)],
                                   color=line.get_color(), alpha=0.15)
    for c in comps:
        xs, m = _series(recs, f"eval/reward/{c}/mean")
        if xs:
            ax[0].plot(xs, m, "s--", label=f"eval {c} (EMA)")
    ax[0].set_title("reward (mean ± std)")
    ax[0].legend(fontsize=7)
    for key, label in (("zero_std_group_ratio", "zero-std groups"), ("r/mean", "mean r")):
        xs, ys = _series(recs, key)
        ax[1].plot(xs, ys, marker=".", label=label)
    ax[1].set_ylim(-0.05, 1.05)
    ax[1].set_title("zero-std-group ratio, mean r")
    ax[1].legend(fontsize=7)
    for key in ("policy_loss", "total_loss"):
        xs, ys = _series(recs, key)
        ax[2].plot(xs, ys, marker=".", label=key)
    ax2 = ax[2].twinx()
    for key, style, color in (("kl_div", "--", "gray"), ("old_kl_div", "-.", "tab:purple"), ("old_deviate", ":", "black")):
        xs, ys = _series(recs, key)
        ax2.plot(xs, ys, style, label=key, color=color)
    ax[2].set_title("loss (left), KL to base / old deviation (right)")
    ax[2].legend(fontsize=7, loc="upper left")
    ax2.legend(fontsize=7, loc="upper right")
    hists = [(r["epoch"], r["r/hist"]) for r in recs if isinstance(r.get("r/hist"), list)]
    if hists:
        import numpy as np

        mat = np.array([h for _, h in hists], dtype=float).T
        mat = mat / np.maximum(mat.sum(0, keepdims=True), 1)
        ax[3].imshow(mat, aspect="auto", origin="lower", extent=(hists[0][0] - .5, hists[-1][0] + .5, 0, 1),
                     cmap="viridis")
    ax[3].set_title("r histogram per epoch")
    ax[3].set_ylabel("r")
    if e2po_keys:
        for k in e2po_keys:
            xs, ys = _series(recs, k)
            ax[4].plot(xs, ys, marker=".", label=k.split("/")[1] + " anchor cos")
        if e2po is not None:
            lo, hi = e2po.mu - e2po.eps, e2po.mu + e2po.eps
            ax[4].axhspan(lo, hi, color="green", alpha=0.2, label="mu ± eps")
            ax[4].axhspan(lo - e2po.warn_band, hi + e2po.warn_band, color="orange", alpha=0.1, label="warning band")
        ax[4].set_title("E²PO achieved anchor similarity")
        ax[4].legend(fontsize=7)
    for a in ax:
        a.set_xlabel("epoch")
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(out)
    return out
