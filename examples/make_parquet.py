"""A tiny best-of-3 dataset for `rewardkit score --dataset` and `rewardkit filter`, from the example images.

    python examples/make_parquet.py outputs/best_of_3.parquet

Writes one Parquet file with the columns `id`, `prompt` and `image` (PNG bytes): each of the three prompts of
examples/images/t2i.jsonl with each of the three text-to-image examples, so nine rows, three candidates per
prompt, as a generator's best-of-N output would be. Needs pyarrow (the `data` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"


def main(out: str = "outputs/best_of_3.parquet") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (IMAGES / "t2i.jsonl").read_text(encoding="utf-8").splitlines()]
    table = {"id": [], "prompt": [], "image": []}
    for p, row in enumerate(rows):
        for c, cand in enumerate(rows):
            table["id"].append(f"p{p}-c{c}")
            table["prompt"].append(row["prompt"])
            table["image"].append((IMAGES / cand["image"]).read_bytes())
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table), path)
    print(f"wrote {path}: {len(table['id'])} rows, {len(rows)} prompts x {len(rows)} candidates")
    return path


if __name__ == "__main__":
    main(*sys.argv[1:2])
