"""Synthetic benchmark files with the real schemas: for tests, the overhead benchmark and for users checking
their setup offline.

Every file is written by ``datasets`` with the hub's column names and feature types (``Image`` structs of
``{"bytes", "path"}``, ``List(Image)`` for MMRB2, JSON-string columns for MMRB2 metadata), in the same
folder layout as the hub repositories, one folder per benchmark family::

    root/mmrb2/{t2i,edit}/test-00000-of-00001.parquet
    root/genaibench/{image_generation,image_edition}/test_v1-00000-of-00001.parquet
    root/editreward/{2pair,3pair,4pair}/train-00000-of-00001.parquet

Images are random noise (deterministic per seed); the same image appears in several comparisons, as in
the real data, so de-duplication is exercised. Labels follow fixed, documented distributions.
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._imports import require

__all__ = ["write_synthetic_benchmarks", "SYNTHETIC_LAYOUT"]

SYNTHETIC_LAYOUT = {
    "mmrb2/t2i": "mmrb2/t2i/test-00000-of-00001.parquet",
    "mmrb2/edit": "mmrb2/edit/test-00000-of-00001.parquet",
    "genaibench/t2i": "genaibench/image_generation/test_v1-00000-of-00001.parquet",
    "genaibench/edit": "genaibench/image_edition/test_v1-00000-of-00001.parquet",
    "editreward/2pair": "editreward/2pair/train-00000-of-00001.parquet",
    "editreward/3pair": "editreward/3pair/train-00000-of-00001.parquet",
    "editreward/4pair": "editreward/4pair/train-00000-of-00001.parquet",
}
_SOURCES = ["evalmuse", "oneigbench", "wise"]
_EDIT_SOURCES = ["emu-edit", "dreambench", "new_synthetic_edit"]
_VOTES = ["leftvote", "rightvote", "tievote", "bothbad_vote"]
_MODELS = ["model-x", "model-y", "model-z"]


class _Pool:
    """A pool of distinct random PNGs; ``get(i)`` wraps around so images repeat across comparisons."""

    def __init__(self, n: int, size: int, rng: np.random.Generator):
        from PIL import Image

        self.items = []
        for _ in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB").save(buf, "PNG")
            self.items.append(buf.getvalue())

    def get(self, i: int) -> dict[str, Any]:
        return {"bytes": self.items[i % len(self.items)], "path": None}


def _write(rows: dict[str, list], features: Any, path: Path) -> Path:
    datasets = require("datasets", "bench")
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    # the in-memory table carries the "huggingface" features metadata, as hub parquet files do
    pq.write_table(datasets.Dataset.from_dict(rows, features=features).data.table, str(path))
    return path


def write_synthetic_benchmarks(root: str | Path, n_pairs: int = 24, *, seed: int = 0, image_size: int = 32,
                               n_groups: int = 6) -> dict[str, Path]:
    """Write all seven synthetic subsets under ``root``; returns ``{benchmark name: parquet path}``.

    Label distributions (``n_pairs`` = 24 by default): MMRB2 ``chosen`` alternates A, A, B (2/3 "A");
    every 4th MMRB2 edit pair has two source images; GenAI-Bench ``vote_type`` cycles leftvote, rightvote,
    tievote, bothbad_vote (half ties); EditReward K=2 ``ranking`` cycles "A>B", "B>A", "A=B"; K=3 / K=4
    have ``n_groups`` groups with a random total order each.
    """
    datasets = require("datasets", "bench")
    F, Img, V, L = datasets.Features, datasets.Image, datasets.Value, datasets.List
    root = Path(root)
    rng = np.random.default_rng(seed)
    pool = _Pool(max(8, n_pairs), image_size, rng)
    out: dict[str, Path] = {}
    n = n_pairs

    # ---- MMRB2 (both tasks share the schema)
    mm_features = F({
        "pair_id": V("string"), "prompt_text": V("string"), "prompt_images": L(Img()),
        "response_a_text": V("string"), "response_b_text": V("string"),
        "response_a_images": L(Img()), "response_b_images": L(Img()), "chosen": V("string"),
        "prompt_source": V("string"), "response_a_model": V("string"), "response_b_model": V("string"),
        "human_annotations": V("string"), "prompt_metadata": V("string")})
    for task in ("t2i", "edit"):
        rows: dict[str, list] = {k: [] for k in mm_features}
        for i in range(n):
            chosen = "B" if i % 3 == 2 else "A"
            src = (_EDIT_SOURCES if task == "edit" else _SOURCES)[i % 3]
            rows["pair_id"].append(f"{src}_{i}_{task}")
            if task == "edit":
                n_src = 2 if i % 4 == 3 else 1
                rows["prompt_text"].append("".join(f"<image_{k + 1}>" for k in range(n_src)) + f" edit number {i}")
                rows["prompt_images"].append([pool.get(i + 50 + k) for k in range(n_src)])
            else:
                rows["prompt_text"].append(f"a synthetic prompt number {i}")
                rows["prompt_images"].append([])
            rows["response_a_text"].append("")
            rows["response_b_text"].append("")
            # image i appears as A here and as B of pair i+1: shared candidates across pairs
            rows["response_a_images"].append([pool.get(i)])
            rows["response_b_images"].append([pool.get(i + 1)])
            rows["chosen"].append(chosen)
            rows["prompt_source"].append(src)
            rows["response_a_model"].append(_MODELS[i % 3])
            rows["response_b_model"].append(_MODELS[(i + 1) % 3])
            rows["human_annotations"].append(json.dumps([5, 5, 4] if chosen == "A" else [2, 1, 3]))
            rows["prompt_metadata"].append(json.dumps({"id": str(i), "category": "synthetic"}))
        out[f"mmrb2/{task}"] = _write(rows, mm_features, root / SYNTHETIC_LAYOUT[f"mmrb2/{task}"])

    # ---- GenAI-Bench
    gen_t2i = F({"prompt": V("string"), "left_model": V("string"), "left_image": Img(),
                 "right_model": V("string"), "right_image": Img(), "vote_type": V("string")})
    rows = {k: [] for k in gen_t2i}
    for i in range(n):
        rows["prompt"].append(f"a generated scene number {i}")
        rows["left_model"].append(_MODELS[i % 3])
        rows["left_image"].append(pool.get(i))
        rows["right_model"].append(_MODELS[(i + 2) % 3])
        rows["right_image"].append(pool.get(i + 2))
        rows["vote_type"].append(_VOTES[i % 4])
    out["genaibench/t2i"] = _write(rows, gen_t2i, root / SYNTHETIC_LAYOUT["genaibench/t2i"])
    gen_edit = F({"source_prompt": V("string"), "target_prompt": V("string"), "instruct_prompt": V("string"),
                  "source_image": Img(), "left_model": V("string"), "left_output_image": Img(),
                  "right_model": V("string"), "right_output_image": Img(), "vote_type": V("string")})
    rows = {k: [] for k in gen_edit}
    for i in range(n):
        rows["source_prompt"].append(f"a photo number {i}")
        rows["target_prompt"].append(f"a red photo number {i}")
        rows["instruct_prompt"].append(f"make photo {i} red")
        rows["source_image"].append(pool.get(i + 70))
        rows["left_model"].append(_MODELS[i % 3])
        rows["left_output_image"].append(pool.get(i + 3))
        rows["right_model"].append(_MODELS[(i + 1) % 3])
        rows["right_output_image"].append(pool.get(i + 5))
        rows["vote_type"].append(_VOTES[i % 4])
    out["genaibench/edit"] = _write(rows, gen_edit, root / SYNTHETIC_LAYOUT["genaibench/edit"])

    # ---- EditReward-Bench: one row per pairwise comparison
    er = F({"id": V("string"), "instruction": V("string"), "source_image": Img(), "candidate_1": Img(),
            "candidate_2": Img(), "ranking": V("string"), "comparison_type": V("string"),
            "num_candidates": V("int64"), "dataset": V("string"), "score_1": V("float64"),
            "score_2": V("float64"), "model_1": V("string"), "model_2": V("string")})
    for k in (2, 3, 4):
        rows = {c: [] for c in er}
        letters = "ABCD"[:k]
        groups = n if k == 2 else n_groups
        for g in range(groups):
            human_rank = rng.permutation(k)  # human_rank[c] = position of candidate c (0 = best)
            quality = {c: float(k - human_rank[c]) for c in range(k)}
            for a, b in itertools.combinations(range(k), 2):
                la, lb = letters[a], letters[b]
                if k == 2:
                    ranking = ["A>B", "B>A", "A=B"][g % 3]
                    qa, qb = {"A>B": (4.0, 2.0), "B>A": (2.0, 4.0), "A=B": (3.0, 3.0)}[ranking]
                else:
                    win = la if human_rank[a] < human_rank[b] else lb
                    ranking = f"{win}>{lb if win == la else la}"
                    qa, qb = quality[a], quality[b]
                rows["id"].append(f"{k}g{g}_{la}{lb}")
                rows["instruction"].append(f"edit instruction {g}")
                rows["source_image"].append(pool.get(100 + g))
                rows["candidate_1"].append(pool.get(10 * g + a))
                rows["candidate_2"].append(pool.get(10 * g + b))
                rows["ranking"].append(ranking)
                rows["comparison_type"].append(f"{la}vs{lb}")
                rows["num_candidates"].append(k)
                rows["dataset"].append(f"{k}pair")
                rows["score_1"].append(qa)
                rows["score_2"].append(qb)
                rows["model_1"].append(_MODELS[a % 3])
                rows["model_2"].append(_MODELS[b % 3])
        out[f"editreward/{k}pair"] = _write(rows, er, root / SYNTHETIC_LAYOUT[f"editreward/{k}pair"])
    return out
