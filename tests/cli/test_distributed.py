"""Sharded scoring under torchrun (2 CPU processes, gloo): identical output to one process. The two ranks are forked
from the test process with torchrun's worker environment (tests/helpers/forked.py)."""

from __future__ import annotations

import json

import pytest

from rewardkit.cli import main
from rewardkit.distributed import gather_in_order, merge_rows, shard_by_chunks, shard_indices, sum_over_ranks


def test_shards_cover_the_input_in_order():
    for n in (0, 1, 5, 7, 64):
        for world in (1, 2, 3, 8):
            parts = [shard_indices(n, r, world) for r in range(world)]
            assert [i for p in parts for i in p] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            for chunk in (1, 2, 4, 32):
                parts = [shard_by_chunks(n, chunk, r, world) for r in range(world)]
                assert [i for p in parts for i in p] == list(range(n))
                # whole chunks: every block starts on a chunk boundary
                assert all(p[0] % chunk == 0 for p in parts if p)
    with pytest.raises(ValueError):
        shard_by_chunks(4, 0)


def test_single_process_helpers_are_identities():
    found = {"a": (1.0, True, None)}
    assert merge_rows(found, [("b", 2.0, True, None)]) == 1 and found == {"a": (1.0, True, None)}
    assert gather_in_order([1, 2]) == [1, 2] and sum_over_ranks(3) == 3


def _two_ranks(args, tmp_path):
    """`rewardkit ARGS` as ranks 0 and 1 of one gloo group, forked from this process with the environment torchrun
    gives its workers (tests/helpers/forked.py; torchrun's own launch and exit report:
    bench/test_cli.py::test_every_rank_exits_with_the_same_code_under_torchrun)."""
    from tests.helpers.forked import run_forked_ranks

    return run_forked_ranks(args, env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}, cwd=tmp_path,
                            timeout=300)


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_score_equals_one_process(tiny_clip_dir, tmp_path, capsys):
    from rewardkit.testing import random_images

    lines = []
    for i, im in enumerate(random_images(7, size=40, seed=3)):
        im.save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"prompt": f"a photo number {i}", "image": f"{i}.png"}))
    lines.insert(3, json.dumps({"prompt": "a missing file", "image": "missing.png"}))   # an invalid row too
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    common = ["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--device", "cpu", "--jsonl",
              str(tmp_path / "items.jsonl"), "--batch-size", "3", "--no-progress"]
    assert main([*common, "-o", str(tmp_path / "one.jsonl")]) == 3  # the missing file: some samples invalid
    one_stdout = capsys.readouterr().out
    ranks = _two_ranks([*common, "-o", str(tmp_path / "two.jsonl")], tmp_path)
    # every rank exits 3, as one process does (rank 1, which scored the missing file, returned 0 before)
    assert [r.returncode for r in ranks] == [3, 3], "\n".join(r.stderr[-3000:] for r in ranks)
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert ranks[0].stdout == one_stdout and ranks[1].stdout == ""  # one process prints the table, once
    assert not list(tmp_path.glob("*.part"))                # per-rank part files are cleaned up
    assert len((tmp_path / "two.jsonl").read_text().splitlines()) == 8


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_bench_equals_one_process(tiny_clip_dir, tmp_path):
    import sqlite3

    from rewardkit.bench.synthetic import write_synthetic_benchmarks

    data = tmp_path / "data"
    write_synthetic_benchmarks(data)
    common = ["bench", "-r", "pickscore", "-m", str(tiny_clip_dir), "--device", "cpu", "-b",
              "mmrb2/t2i,genaibench/t2i", "--data-dir", str(data), "--batch-size", "4", "--bootstrap", "50",
              "--per-sample", "--no-progress"]
    assert main([*common, "-o", str(tmp_path / "one"), "--cache-dir", str(tmp_path / "c1")]) == 0
    ranks = _two_ranks([*common, "-o", str(tmp_path / "two"), "--cache-dir", str(tmp_path / "c2")], tmp_path)
    assert [r.returncode for r in ranks] == [0, 0], "\n".join(r.stderr[-3000:] for r in ranks)
    (a,), (b,) = list((tmp_path / "one").glob("*.json")), list((tmp_path / "two").glob("*.json"))
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())

    def strip(rec):
        rec = {k: v for k, v in rec.items() if k not in ("created", "timing", "settings")}
        rec["benchmarks"] = {k: {kk: vv for kk, vv in v.items() if kk != "timing"} for k, v in rec["benchmarks"].items()}
        return rec

    assert strip(ra) == strip(rb)                            # metrics, counts, per-sample scores
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    (db,) = list((tmp_path / "c2").rglob("*.sqlite"))        # both ranks wrote into one cache file
    n = sqlite3.connect(db).execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    (db1,) = list((tmp_path / "c1").rglob("*.sqlite"))
    assert n == sqlite3.connect(db1).execute("SELECT COUNT(*) FROM scores").fetchone()[0] > 0
