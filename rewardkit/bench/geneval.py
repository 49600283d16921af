"""GenEval as a benchmark of a generator: score the official image layout with the ``geneval`` reward, write the
official per-image results JSONL and print the official summary.

The layout (djghosh13/geneval @ af4902f, ``generation/diffusers_generate.py:115-147``, read back by
``evaluation/evaluate_images.py:261-275``): one folder per prompt, named by its index (``00000``, ``00001``, ...;
only all-digit names count), holding ``metadata.jsonl`` (one JSON object, that prompt's metadata row, despite
the extension) and ``samples/`` with the images (``NNNNN.png``; the official reader takes the names
``re.match(r"\\d+\\.png", name)`` accepts). ``rewardkit generate`` writes it.

The results file has one record per image with the fields of ``evaluate_images.py:247-258`` (``filename, tag,
prompt, correct, reason, metadata, details``); :func:`summarize` / :func:`format_summary` are
``evaluation/summary_scores.py:22-45`` as pure functions (no pandas): images, prompts (distinct ``metadata``
strings), the share of correct images and of prompts with at least one correct image, each tag's share in order
of first appearance, and the overall score, the mean of the tags' shares.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["GenEvalFolder", "read_layout", "read_metadata_file", "summarize", "format_summary", "score_layout",
           "write_results", "read_results"]

# evaluate_images.py:272 (``re.match``: the name must start with digits and ".png")
_SAMPLE = re.compile(r"\d+\.png")


@dataclass
class GenEvalFolder:
    """One prompt's folder: its index (the folder name), metadata row and sample image paths (sorted)."""

    index: int
    name: str
    metadata: dict[str, Any]
    images: list[Path]


def read_metadata_file(path: str | Path) -> list[dict[str, Any]]:
    """GenEval's prompt metadata file (``prompts/evaluation_metadata.jsonl``: one object a line, with ``tag``,
    ``prompt``, ``include`` and optionally ``exclude``)."""
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or "tag" not in row:
            raise ValueError(f"{path}:{i}: expected an object with a string 'prompt' and a 'tag'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no metadata rows")
    return rows


def read_layout(images_dir: str | Path, metadata: Sequence[dict[str, Any]] | None = None) -> list[GenEvalFolder]:
    """The prompt folders under ``images_dir`` in index order, as ``evaluate_images.py:263-275`` reads them
    (all-digit folder names; ``metadata.jsonl`` read with ``json.load``; ``samples/`` files matching
    ``\\d+\\.png``). With ``metadata`` (the prompt metadata file's rows) each folder's row must equal row
    ``int(name)`` of it. A folder without images, or a layout without folders, is refused."""
    root = Path(images_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no image folder {root}")
    out = []
    for sub in sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        meta_path = sub / "metadata.jsonl"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{sub}: no metadata.jsonl")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or "tag" not in meta or not isinstance(meta.get("prompt"), str):
            raise ValueError(f"{meta_path}: expected one object with 'tag' and a string 'prompt'")
        if metadata is not None:
            idx = int(sub.name)
            if idx >= len(metadata) or metadata[idx] != meta:
                raise ValueError(f"{meta_path} differs from row {idx} of the metadata file")
        samples = sub / "samples"
        images = sorted((p for p in samples.iterdir() if p.is_file() and _SAMPLE.match(p.name)),
                        key=lambda p: p.name) if samples.is_dir() else []
        if not images:
            raise ValueError(f"{sub}: no samples/NNNNN.png images")
        out.append(GenEvalFolder(int(sub.name), sub.name, meta, images))
    if not out:
        raise ValueError(f"{root}: no prompt folders (00000/metadata.jsonl + samples/) found")
    return out


def score_layout(folders: Sequence[GenEvalFolder], reward: Any, *, batch_size: int = 16,
                 progress: Any = None) -> list[dict[str, Any]]:
    """Score every image with ``reward`` (the ``geneval`` reward, or any reward giving its per-sample details)
    and return the official per-image records, in folder then file order. ``filename`` is the image's path as
    the layout names it (``<images_dir>/<folder>/samples/<file>``, as ``evaluate_images.py:271`` joins it)."""
    from PIL import Image

    from ..rewards._geneval_records import official_records

    items = [(f, p) for f in folders for p in f.images]
    records: list[dict[str, Any]] = []
    for s in range(0, len(items), max(1, int(batch_size))):
        chunk = items[s:s + batch_size]
        images = []
        for _, p in chunk:
            with Image.open(p) as im:
                images.append(im.copy())
        metas = [f.metadata for f, _ in chunk]
        out = reward(images, [m["prompt"] for m in metas], metadata=metas, on_error="nan")
        records += official_records(out, metas, [str(p) for _, p in chunk])
        if progress is not None:
            progress(len(records), len(items))
    return records


def write_results(records: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """One JSON object a line (what ``pd.DataFrame(records).to_json(orient="records", lines=True)`` holds,
    evaluate_images.py:279-280)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return path


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """A per-image results file (ours or the official script's)."""
    recs = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    for i, r in enumerate(recs, 1):
        if not all(k in r for k in ("tag", "correct", "metadata")):
            raise ValueError(f"{path}:{i}: a GenEval result needs 'tag', 'correct' and 'metadata'")
    return recs


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """summary_scores.py:26-45 as numbers: ``{"images", "prompts", "correct_images", "correct_prompts",
    "tasks": [(tag, share, n_correct, n)], "overall"}`` (shares in [0, 1]; tags in order of first appearance,
    ``groupby('tag', sort=False)``; prompts are distinct ``metadata`` strings, ``groupby('metadata')``)."""
    if not records:
        raise ValueError("no GenEval results to summarise")
    correct = [bool(r["correct"]) for r in records]
    by_prompt: dict[str, bool] = {}
    by_tag: dict[str, list[bool]] = {}
    for r, c in zip(records, correct):
        by_prompt[r["metadata"]] = by_prompt.get(r["metadata"], False) or c
        by_tag.setdefault(r["tag"], []).append(c)
    tasks = [(tag, sum(cs) / len(cs), sum(cs), len(cs)) for tag, cs in by_tag.items()]
    return {"images": len(records), "prompts": len(by_prompt), "correct_images": sum(correct) / len(correct),
            "correct_prompts": sum(by_prompt.values()) / len(by_prompt), "tasks": tasks,
            "overall": sum(t[1] for t in tasks) / len(tasks)}


def format_summary(summary: dict[str, Any]) -> str:
    """The text ``summary_scores.py`` prints (its lines 26-45), for :func:`summarize`'s numbers."""
    lines = ["Summary", "=======", f"Total images: {summary['images']}", f"Total prompts: {summary['prompts']}",
             f"% correct images: {summary['correct_images']:.2%}",
             f"% correct prompts: {summary['correct_prompts']:.2%}", "", "Task breakdown", "=============="]
    for tag, share, n_ok, n in summary["tasks"]:
        lines.append(f"{tag:<16} = {share:.2%} ({n_ok} / {n})")
    lines += ["", f"Overall score (avg. over tasks): {summary['overall']:.5f}"]
    return "\n".join(lines) + "\n"
