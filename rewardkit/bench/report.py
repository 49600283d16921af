"""Reports from result records (the JSON written by :meth:`BenchResult.save`): markdown tables and a PNG.

Both functions take a list of record dicts, so results of several rewards (several runs) compare side by
side: ``rewardkit bench --report a.json b.json --plot rewards.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

__all__ = ["load_records", "markdown_report", "plot_records", "chance_level", "labels", "METRIC_LABELS"]

METRIC_LABELS = {
    "mmrb2_official": "MMRB2 official (both orders)",
    "accuracy_without_ties": "accuracy without ties",
    "accuracy_with_ties": "accuracy with ties (tie-calibrated)",
    "genaibench_4way": "GenAI-Bench 4-way",
    "group_accuracy": "group accuracy",
    "order_agreement": "order agreement",
    "single_order_accuracy": "single-order accuracy",
}


def load_records(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        rec = json.loads(Path(p).read_text(encoding="utf-8"))
        if not isinstance(rec, dict) or "benchmarks" not in rec:
            raise ValueError(f"{p} is not a rewardkit bench record")
        out.append(rec)
    return out


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _cell(m: dict[str, Any] | None) -> str:
    if not m or m.get("value") is None:
        return "–"
    s = _pct(m["value"])
    if m.get("ci95") and None not in m["ci95"]:
        s += f" [{_pct(m['ci95'][0])}, {_pct(m['ci95'][1])}]"
    return s


def _label(rec: dict[str, Any]) -> str:
    r = rec["reward"]
    model = (r.get("config") or {}).get("model")
    if isinstance(model, str) and (model.startswith(("/", ".", "~")) or "\\" in model):
        model = Path(model).name  # a local checkpoint: its folder name is enough in a table
    return f"{r['name']} ({model})" if model else r["name"]


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    if not isinstance(d, dict):
        return {prefix: json.dumps(d, sort_keys=True, default=str)}
    out: dict[str, str] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else
                   {f"{prefix}{k}": json.dumps(v, sort_keys=True, default=str)})
    return out


def labels(records: Sequence[dict[str, Any]]) -> list[str]:
    """One label per record, unique per configuration: ``name (model)``, and where two records of different
    configurations would share it, the options that tell them apart (``judge=...``, ``temperature=0.5``; the
    config fingerprint when more than three differ or the configs are the same); identical labels left after
    that (several runs of one configuration) get ``#2``, ``#3``."""
    base = [_label(r) for r in records]
    out = list(base)
    for lab in set(base):
        idx = [i for i, b in enumerate(base) if b == lab]
        if len(idx) < 2:
            continue
        flats = [_flat((records[i]["reward"].get("config") or {})) for i in idx]
        keys = sorted({k for f in flats for k in f if len({f.get(k) for f in flats}) > 1})
        for i, f in zip(idx, flats):
            if keys and len(keys) <= 3:
                out[i] = f"{lab} [" + ", ".join(f"{k}={json.loads(f[k]) if k in f else '-'}" for k in keys) + "]"
            elif keys:
                out[i] = f"{lab} [config {str(records[i]['reward'].get('fingerprint') or '?')[:8]}]"
    seen: dict[str, int] = {}
    for i, lab in enumerate(out):
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            out[i] = f"{lab} #{seen[lab]}"
    return out


def markdown_report(records: Sequence[dict[str, Any]], *, details: bool = True) -> str:
    """Summary table (primary metric per benchmark, % with bootstrap 95% CI) and, with ``details``, every
    metric, counts and per-category breakdowns per reward."""
    benches: list[str] = []
    for rec in records:
        benches += [b for b in rec["benchmarks"] if b not in benches]
    lines = ["| reward | " + " | ".join(benches) + " |", "|---" * (len(benches) + 1) + "|"]
    primaries: dict[str, set[str]] = {b: set() for b in benches}
    names = labels(records)
    for rec, name in zip(records, names):
        cells = []
        for b in benches:
            br = rec["benchmarks"].get(b)
            if br is None:
                cells.append("")
            elif br.get("skipped"):
                cells.append("skipped")
            else:
                primaries[b].add(br["primary"])
                cells.append(_cell(br["metrics"].get(br["primary"])) + f" ({br['primary']})"
                             if len(records) > 1 else _cell(br["metrics"].get(br["primary"])))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Primary metric per benchmark: " + "; ".join(
        f"{b}: {', '.join(METRIC_LABELS.get(p, p) for p in sorted(primaries[b])) or '–'}" for b in benches)
        + ". Values in %, [bootstrap 95% CI].")
    if not details:
        return "\n".join(lines) + "\n"
    for rec, name in zip(records, names):
        lines += ["", f"### {name}", "",
                  f"rewardkit {rec.get('rewardkit_version')} (git {str(rec.get('git_hash') or '?')[:10]}), "
                  f"mode {rec['reward'].get('mode')}, config fingerprint {rec['reward'].get('fingerprint')}", "",
                  "| benchmark | version | metric | value [95% CI] | n | notes |", "|---|---|---|---|---|---|"]
        for b, br in rec["benchmarks"].items():
            ver = (br.get("spec") or {}).get("version", "")
            if br.get("skipped"):
                lines.append(f"| {b} | {ver} | – | skipped | – | {br['skipped']} |")
                continue
            for name, m in br["metrics"].items():
                notes = []
                if m.get("threshold") is not None:
                    notes.append(f"threshold {m['threshold']:.4g}")
                for k in ("n_model_ties", "n_human_ties", "n_invalid", "n_missing", "n_unparsed", "n_invalid_groups"):
                    if m.get(k):
                        notes.append(f"{k} {m[k]}")
                if m.get("individual") is not None:
                    notes.append(f"individual {_pct(m['individual'])}")
                star = " **(primary)**" if name == br.get("primary") else ""
                lines.append(f"| {b} | {ver} | {name}{star} | {_cell(m)} | {m.get('n')} | {', '.join(notes)} |")
            for name, why in (br.get("unavailable") or {}).items():
                lines.append(f"| {b} | {ver} | {name} | n/a | – | {why} |")
        for b, br in rec["benchmarks"].items():
            prim = br.get("primary")
            for fieldname, cats in (br.get("categories") or {}).items():
                lines += ["", f"{b} by `{fieldname}` ({prim}):", "", "| value | metric [95% CI] | n |", "|---|---|---|"]
                for cat, ms in cats.items():
                    m = ms.get(prim, {})
                    lines.append(f"| {cat} | {_cell(m)} | {m.get('n')} |")
            for sub, ms in (br.get("subsets") or {}).items():
                m = ms.get(prim, {})
                lines += ["", f"{b} subset `{sub}`: {prim} {_cell(m)} (n = {m.get('n')})"]
    return "\n".join(lines) + "\n"


SHORT_METRIC = {
    "mmrb2_official": "MMRB2 official",
    "accuracy_without_ties": "acc. w/o ties",
    "accuracy_with_ties": "acc. with ties",
    "genaibench_4way": "4-way",
    "group_accuracy": "group acc.",
}


def chance_level(metric: str, br: dict[str, Any]) -> float | None:
    """What random guessing scores on ``metric`` (a fraction), or None when it has no fixed chance level.

    Pairwise accuracies (``accuracy_without_ties``, ``mmrb2_official``): 1/2. ``accuracy_with_ties`` (three
    outcomes A, B, tie): 1/3. ``genaibench_4way`` (four answers): 1/4. ``group_accuracy`` over groups of K
    candidates (all C(K, 2) pairs right = the whole ranking): 1/K!, with K from the data's pairs per group.
    """
    import math

    if metric in ("accuracy_without_ties", "mmrb2_official", "single_order_accuracy"):
        return 0.5
    if metric == "accuracy_with_ties":
        return 1 / 3
    if metric == "genaibench_4way":
        return 0.25
    if metric == "group_accuracy":
        c = br.get("counts") or {}
        n, g = c.get("n_comparisons"), c.get("n_groups")
        if not n or not g:
            return None
        pairs = n / g                                  # C(K, 2) rows per group
        k = round((1 + math.sqrt(1 + 8 * pairs)) / 2)
        return 1 / math.factorial(k) if k * (k - 1) / 2 == pairs else None
    return None


def plot_records(records: Sequence[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Grouped bar chart: one group per benchmark, one bar per reward (its primary metric, %, 95% CI bars).

    Each bar is labelled with its value and metric; a dotted segment across each bar marks that metric's
    chance level; a 0 % result is drawn as a thin outlined stub labelled "0.0%", a missing result (skipped or
    no value) as a hatched outline labelled "missing", so the two cannot be confused."""
    from .._imports import require

    require("matplotlib", "bench", "plotting benchmark results")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    benches: list[str] = []
    for rec in records:
        benches += [b for b, br in rec["benchmarks"].items() if b not in benches and not br.get("skipped")]
    if not benches:
        raise ValueError("nothing to plot: every benchmark was skipped")
    n = max(len(records), 1)
    width = 0.8 / n
    fig = Figure(figsize=(max(6.5, 1.6 * len(benches) * max(1, n / 2) + 2), 4.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    from matplotlib.patches import Patch

    colors = [f"C{j % 10}" for j in range(n)]
    names = labels(records)
    # legend entries are drawn from proxies, one per reward in its colour: whichever bar comes first (a
    # hatched "missing" one when the reward's first benchmark was skipped) cannot stand in for the reward
    handles: list[Any] = [Patch(facecolor=colors[j], label=names[j]) for j in range(len(records))]
    missing_drawn = False
    chance_drawn = False
    for j, rec in enumerate(records):
        for i, b in enumerate(benches):
            x = i - 0.4 + width * (j + 0.5)
            br = rec["benchmarks"].get(b)
            metric = (br or {}).get("primary") if br and not br.get("skipped") else None
            m = (br or {}).get("metrics", {}).get(metric) if metric else None
            if not m or m.get("value") is None:
                ax.bar([x], [100], width=width * 0.95, fill=False, hatch="//", edgecolor="0.75", lw=0.6)
                ax.text(x, 50, "missing" + (" (skipped)" if br and br.get("skipped") else ""), rotation=90,
                        ha="center", va="center", fontsize=7, color="0.45")
                if not missing_drawn:
                    handles.append(Patch(fill=False, hatch="//", edgecolor="0.75", label="missing / skipped"))
                    missing_drawn = True
                continue
            v = 100 * m["value"]
            ci = m.get("ci95") or [m["value"], m["value"]]
            lo = max(0.0, v - 100 * (ci[0] if ci[0] is not None else m["value"]))
            hi = max(0.0, 100 * (ci[1] if ci[1] is not None else m["value"]) - v)
            if v == 0:
                ax.bar([x], [0.8], width=width * 0.95, color="white", edgecolor=colors[j], lw=1.2)
            else:
                ax.bar([x], [v], width=width * 0.95, yerr=[[lo], [hi]], capsize=3, color=colors[j])
            ax.text(x, min(v + hi, 100) + 1.5, f"{v:.1f}%\n{SHORT_METRIC.get(metric, metric)}", ha="center",
                    va="bottom", fontsize=6.5)
            ch = chance_level(metric, br)
            if ch is not None:
                ax.hlines(100 * ch, x - width * 0.5, x + width * 0.5, colors="black", linestyles=":", lw=1.2)
                if not chance_drawn:
                    from matplotlib.lines import Line2D

                    handles.append(Line2D([], [], color="black", linestyle=":", lw=1.2,
                                          label="chance level of the bar's metric"))
                    chance_drawn = True
    ax.set_xticks(range(len(benches)))
    ax.set_xticklabels(benches, rotation=20, ha="right")
    ax.set_ylabel("primary metric (%)")
    ax.set_ylim(0, 118)
    ax.set_yticks(range(0, 101, 20))
    ax.set_title(title or "Agreement with human preferences (95% bootstrap CI)")
    ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
