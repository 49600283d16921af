"""Data files the dataset tests write: random PNG bytes, WebDataset shards, Parquet sets of PARROT pairs."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def png_bytes(seed: int, size: int = 24) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def write_tar(path: Path, samples: list[dict[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for s in samples:
            for ext, data in s.items():
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{s['__key__']}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def wds_set(root: Path, shards: int = 2, rows: int = 4) -> list[dict]:
    out = []
    for s in range(shards):
        samples = [{"__key__": f"s{s}/{i:04d}", "png": png_bytes(50 + 10 * s + i),
                    "txt": f"a drawing {s} {i}".encode()} for i in range(rows)]
        write_tar(root / f"shard-{s:03d}.tar", samples)
        out += samples
    return out


def _png(level: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), level, dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def write_pairs(folder, shards=2, rows=5) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(shards):
        recs = []
        for i in range(rows):
            k = s * rows + i
            recs.append({"pair_id": f"p{k}", "prompt": f"a scene {k}" + (" [garbage]" if k == 3 else ""),
                         "image_a": _png(30 * (k % 8)), "image_b": _png(200 - 20 * (k % 5)),
                         "label": ["A", "B", "tie"][k % 3] if k != 7 else "A"})
        pq.write_table(pa.Table.from_pylist(recs), folder / f"part-{s}.parquet")
        out += recs
    return out


def parrot_cfg(tmp_path):
    from rewardkit.parrot.pipeline import DataCfg, ParrotConfig, TeacherCfg

    return ParrotConfig(output_dir=str(tmp_path / "work"), data=DataCfg(train=str(tmp_path / "all.parquet")),
                        teacher=TeacherCfg(judge="scripted"), batch_size=3)
