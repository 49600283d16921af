"""PARROT stage 1 over a sharded Parquet set of pairs (``rewardkit.datasets.parrot``): the records are those of
the JSONL pipeline (``Pipeline.rationalize``) on the same pairs, one Parquet file per shard, resumable."""

from __future__ import annotations

import json

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("datasets")

from tests.helpers.data_files import parrot_cfg as _cfg, write_pairs  # noqa: E402


def test_stage1_over_shards_matches_the_jsonl_pipeline_and_resumes(tmp_path):
    from rewardkit.datasets.parrot import PairColumns, rationalize_dataset
    from rewardkit.parrot.pipeline import Pipeline

    rows = write_pairs(tmp_path / "pairs")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "all.parquet")
    cfg = _cfg(tmp_path)
    ref = Pipeline(cfg, progress=False)  # the reference: the JSONL pipeline over the same pairs in one file
    ref.rationalize()
    want = [ref.rationales.get(i) for i in range(len(rows))]
    s = rationalize_dataset(cfg, tmp_path / "pairs", tmp_path / "out", columns=PairColumns(id="pair_id"))
    assert (s.rows, s.shards_scored) == (10, 2)
    got = pa.concat_tables([pq.read_table(tmp_path / "out" / f"part-{i}.parquet") for i in range(2)]).to_pylist()
    assert [g["id"] for g in got] == [r["pair_id"] for r in rows]
    assert [g["row"] for g in got] == list(range(5)) * 2
    for g, w in zip(got, want):
        for k in ("status", "reason", "dimension", "rationale", "rationale_preferred", "raw", "label", "prompt",
                  "task", "template", "seed"):
            assert g[k] == (None if w[k] is None else (w[k] if k == "seed" else str(w[k]))), (k, g, w)
    assert {g["status"] for g in got} >= {"ok", "skipped", "unparseable"}
    meta = json.loads(pq.read_schema(tmp_path / "out" / "part-0.parquet").metadata[b"rewardkit"])
    assert meta["reward"] == "parrot.rationalize" and meta["config"]["teacher"]["judge"] == "scripted"
    again = rationalize_dataset(cfg, tmp_path / "pairs", tmp_path / "out", columns=PairColumns(id="pair_id"))
    assert (again.rows, again.shards_skipped) == (0, 2)


def test_unreadable_pairs_are_skipped_with_their_reason(tmp_path):
    from rewardkit.datasets.parrot import rationalize_dataset

    rows = write_pairs(tmp_path / "pairs", shards=1, rows=4)
    rows[1]["image_b"] = b"not a png"
    rows[2]["label"] = "maybe"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pairs" / "part-0.parquet")
    rationalize_dataset(_cfg(tmp_path), tmp_path / "pairs", tmp_path / "out")
    got = pq.read_table(tmp_path / "out" / "part-0.parquet").to_pylist()
    assert got[1]["status"] == "skipped" and got[1]["reason"].startswith("unreadable row:"), got[1]
    assert "image" in got[1]["reason"], got[1]
    assert got[2]["status"] == "skipped" and "bad preference label 'maybe'" in got[2]["reason"]
    assert got[0]["status"] == "ok" and got[0]["id"] == "part-0:0"


def test_cli_parrot_rationalize_dataset(tmp_path, capsys):
    from rewardkit.cli import main

    write_pairs(tmp_path / "pairs", shards=2, rows=3)
    args = ["parrot", "rationalize", "teacher.judge=scripted", "--output-dir", str(tmp_path / "work"), "--dataset",
            str(tmp_path / "pairs"), "--output", str(tmp_path / "out"), "--id-column", "pair_id"]
    assert main(args) == 0
    assert "rationalized 6 pair(s) in 2 shard(s)" in capsys.readouterr().err
    assert pq.read_table(tmp_path / "out" / "part-1.parquet").column("id").to_pylist() == ["p3", "p4", "p5"]
    assert main(args) == 0 and "2 shard(s) already done" in capsys.readouterr().err
