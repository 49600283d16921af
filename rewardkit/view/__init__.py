"""``rewardkit view``: one self-contained, static HTML report of what rewardkit writes.

:func:`build_report` reads any mix of

* ``rewardkit score`` outputs (JSONL) and Parquet files with the same columns: a table of images with
  prompt, score, every dimension, validity and the reason when invalid, and the rationale / judge answers;
* ``rewardkit score --dataset`` output folders: the same table, each score joined back to the image and prompt
  of its row in the source dataset;
* ``rewardkit compare`` outputs (JSONL with ``image_a`` / ``image_b`` / ``prob_a``): the pairs side by side;
* two or more score files on the same images: each reward's score and rank per image, rank disagreements
  flagged, Spearman's rho and a scatter plot of one reward against another;
* ``rewardkit bench`` records (JSON): per-benchmark metrics with 95% CIs, breakdowns, the wrong pairs;
* ``rewardkit rl nft`` output folders (``metrics.jsonl``): training curves and the evaluation grids per epoch,

and writes one HTML file that needs no server and no network (plain HTML/CSS/JS, data embedded as JSON,
thumbnails embedded as data URIs or written to a folder beside it).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from .._version import __version__
from .bench import bench_section, is_bench_record
from .datasets import dataset_section, is_score_folder
from .images import ImageStore
from .multi import rewards_section
from .rl import is_rl_run, rl_section
from .scores import ViewInputError, is_pairs, pairs_section, read_rows, score_section

__all__ = ["build_report", "collect", "render_html", "embed_json", "ViewInputError"]


def _finite(x: Any) -> Any:
    """``x`` with NaN / infinity (which JSON cannot hold) replaced by None, and tuples as lists."""
    if isinstance(x, float):
        return x if x == x and x not in (float("inf"), float("-inf")) else None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, (bytes, bytearray)):
        return f"<{len(x)} bytes>"
    return x


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">``: ``<``, ``>``, ``&`` and the line
    separators U+2028 / U+2029 escaped, so no text can close the element or start markup."""
    s = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _labels(paths: Sequence[Path]) -> list[str]:
    """File stems, with the parent folder where two stems collide."""
    stems = [p.stem if p.is_file() else p.name for p in paths]
    out = []
    for p, s in zip(paths, stems):
        out.append(f"{p.resolve().parent.name}/{s}" if stems.count(s) > 1 else s)
    seen: dict[str, int] = {}
    for i, s in enumerate(out):
        seen[s] = seen.get(s, 0) + 1
        if seen[s] > 1:
            out[i] = f"{s} #{seen[s]}"
    return out


def collect(inputs: Sequence[str | Path], store: ImageStore, *, labels: Sequence[str] | None = None
            ) -> list[dict[str, Any]]:
    """The report's sections for ``inputs`` (files or run folders), in input order, plus one ``rewards``
    section comparing the score files when two or more share images."""
    paths = [Path(p) for p in inputs]
    if not paths:
        raise ViewInputError("no inputs: give score JSONL / Parquet files, bench records or rl run folders")
    names = list(labels) if labels else _labels(paths)
    if len(names) != len(paths):
        raise ViewInputError(f"{len(names)} labels for {len(paths)} inputs")
    sections: list[dict[str, Any]] = []
    scores: list[dict[str, Any]] = []
    bench: list[Path] = []
    for p, name in zip(paths, names):
        if not p.exists():
            raise FileNotFoundError(f"no such file or folder: {p}")
        if p.is_dir() and is_score_folder(p):  # `rewardkit score --dataset` output: joined to its dataset
            sec = dataset_section(p, store, name)
            sections.append(sec)
            scores.append(sec)
        elif p.is_dir():
            if not is_rl_run(p):
                raise ViewInputError(f"{p}: a folder must be a `rewardkit rl` run (holding metrics.jsonl) or a "
                                     "`rewardkit score --dataset` output (holding _rewardkit_scores.json)")
            sections.append(rl_section(p, store, name))
        elif is_bench_record(p):
            bench.append(p)
        elif p.suffix.lower() in (".jsonl", ".parquet"):
            rows = read_rows(p)
            if is_pairs(rows):
                sections.append(pairs_section(p, rows, store, name))
            else:
                sec = score_section(p, rows, store, name)
                sections.append(sec)
                scores.append(sec)
        else:
            raise ViewInputError(f"{p}: not a score file (.jsonl / .parquet), a bench record (.json with "
                                 "'benchmarks') or an rl run folder")
    if bench:
        sections.insert(0, bench_section(bench, store))
    multi = rewards_section(scores)
    if multi is not None:
        sections.insert(0, multi)
    return sections


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def render_html(payload: dict[str, Any], *, title: str) -> str:
    """The page: the template with the stylesheet and script inlined (allowed by their hashes in the
    Content-Security-Policy, which forbids every other script, style and remote load) and ``payload``
    embedded as JSON."""
    import html

    css, js = _asset("view.css"), _asset("view.js")
    csp = ("default-src 'none'; img-src data: 'self'; "
           f"style-src '{_sha256(css)}'; script-src '{_sha256(js)}'; "
           "base-uri 'none'; form-action 'none'")
    values = {"CSP": html.escape(csp, quote=True), "TITLE": html.escape(title), "CSS": css,
              "DATA": embed_json(payload), "JS": js}
    # one pass: a "{{JS}}" inside the data (a prompt can say anything) is never substituted
    return re.sub(r"\{\{(CSP|TITLE|CSS|DATA|JS)\}\}", lambda m: values[m.group(1)], _asset("view.html"))


def build_report(inputs: Sequence[str | Path], output: str | Path, *, title: str | None = None,
                 thumbs: str = "embed", thumb_size: int = 256, labels: Sequence[str] | None = None,
                 page_size: int = 50, full_size: int = 1024, full_budget_mb: float = 32) -> Path:
    """Write the HTML report of ``inputs`` to ``output`` and return its path.

    Args:
        inputs: score / compare JSONL files, Parquet score files, bench records (JSON) and rl run folders.
        output: the HTML file to write.
        title: the page title (default: the input names).
        thumbs: ``"embed"`` (thumbnails as data URIs: one file to mail) or ``"folder"`` (thumbnails written
            to ``<output stem>_files/`` beside the HTML, and the enlarged view links the original image:
            for very large sets).
        thumb_size: longest side of a thumbnail in pixels.
        labels: one name per input (default: the file names).
        page_size: rows per page in the tables.
        full_size: embed mode: the enlarged view of an image larger than its thumbnail is the image at up to
            this many pixels on its longest side (0: the thumbnail shown larger).
        full_budget_mb: embed mode: the enlarged images embedded in the page total at most this many MB; past
            it, an image's enlarged view is its thumbnail and the page says so.
    """
    out = Path(output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ViewInputError(f"the report is an HTML file: give an output ending in .html, got {out}")
    if thumb_size < 16:
        raise ViewInputError(f"thumb_size must be >= 16 pixels, got {thumb_size}")
    if page_size < 1:
        raise ViewInputError(f"page_size must be >= 1, got {page_size}")
    if full_size < 0 or full_budget_mb < 0:
        raise ViewInputError(f"full_size and full_budget_mb must be >= 0, got {full_size} and {full_budget_mb}")
    out.parent.mkdir(parents=True, exist_ok=True)
    store = ImageStore(out.parent, mode=thumbs, folder=out.with_name(out.stem + "_files"), size=thumb_size,
                       full_size=full_size, full_budget=int(full_budget_mb * 2**20))
    sections = collect(inputs, store, labels=labels)
    title = title or "rewardkit view: " + ", ".join(Path(p).name for p in inputs)
    payload = {"title": title, "version": __version__, "page_size": page_size,
               "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "sections": sections, "images": store.table()}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_html(payload, title=title), encoding="utf-8")
    tmp.replace(out)
    return out
