"""The trust round of dataset scoring (issue 36 items 3-5 and 7, issue 39 item 4): resume keys on the weights'
content, one pixel rule, bounded tar members, quarantined shards, row-group resume, no model loaded for a finished
rerun, brace ranges bounded, a foreign shard refused on its own. Each test names the bug it catches.

Expected values are independent of the path under test: the reward called directly on the decoded array, the
uninterrupted run's bytes, hand-written row lists.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tests.helpers.data_files import png_bytes, write_tar  # noqa: E402


@pytest.fixture(scope="module")
def reward(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("pickscore", model=str(tiny_clip_dir))


@pytest.fixture(autouse=True)
def _own_fingerprint_memo(tmp_path, monkeypatch):
    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))  # the digest memo stays in this test


def _parquet_set(root: Path, shards: int = 2, rows: int = 3, seed: int = 0) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        recs = [{"uid": s * 100 + i, "image": png_bytes(seed + s * 100 + i), "prompt": f"thing {s}-{i}"}
                for i in range(rows)]
        pq.write_table(pa.Table.from_pylist(recs), root / f"part-{s}.parquet")


def _cli(*argv: str) -> int:
    from rewardkit.cli import main

    return main(list(argv))


def _perturb(folder: Path) -> None:
    """Other weights in the same files (same names, same shapes, same sizes): a retrained ``latest/``."""
    from safetensors.torch import load_file, save_file

    for f in folder.glob("*.safetensors"):
        tensors = load_file(str(f))
        name = sorted(k for k, v in tensors.items() if v.is_floating_point())[0]
        tensors[name] = tensors[name] + 0.5
        save_file(tensors, str(f), metadata={"format": "pt"})


# ------------------------------------------------------------------------------------------- item 3: content
def test_new_weights_at_the_same_path_are_refused_and_a_copy_elsewhere_resumes(tiny_clip_dir, tmp_path):
    """Bug: the resume fingerprint hashed the ``--model`` string, so new weights at the same path were mixed
    into a half-scored folder, and the same checkpoint copied elsewhere was refused."""
    from rewardkit import load_reward
    from rewardkit.commands import UsageError
    from rewardkit.datasets import score_dataset

    _parquet_set(tmp_path / "data")
    latest = tmp_path / "latest"
    shutil.copytree(tiny_clip_dir, latest)
    first = score_dataset(load_reward("pickscore", model=str(latest)), tmp_path / "data", tmp_path / "out",
                          progress=False)
    assert first.shards_scored == 2
    moved = tmp_path / "elsewhere" / "ckpt"
    shutil.copytree(latest, moved)  # the same weights at another path: the finished shards are reused
    again = score_dataset(load_reward("pickscore", model=str(moved)), tmp_path / "data", tmp_path / "out",
                          progress=False)
    assert (again.shards_skipped, again.rows) == (2, 0)
    _perturb(latest)  # new weights at the first path
    with pytest.raises(UsageError, match=r"weights model names .* are not the ones scored before"):
        score_dataset(load_reward("pickscore", model=str(latest)), tmp_path / "data", tmp_path / "out",
                      progress=False)


def test_bench_cache_key_follows_content_not_path(tmp_path):
    """Bug: the bench cache key held the model path (and the digest keyed by path), so the same checkpoint at
    another path re-scored everything; new weights at one path must still re-key."""
    from rewardkit.bench.cache import reward_fingerprint

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"W" * 64)
    fp = lambda p: reward_fingerprint("r", "R", {"model": str(p), "scale": 1.0})  # noqa: E731
    assert fp(a) == fp(b)
    (b / "model.safetensors").write_bytes(b"V" * 64)  # same size, same name, other bytes
    assert fp(a) != fp(b)


def test_fingerprint_sees_a_rewrite_that_restores_the_mtime(tmp_path):
    """Bug it guards: a digest memo keyed by (size, mtime) only would keep the old digest when a program rewrites
    a file in place and sets its mtime back; the ctime (which cannot be set back) re-keys it."""
    import os
    import time

    from rewardkit.fingerprint import content_config, file_digest

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"A" * 32)
    st = f.stat()
    before = file_digest(f)
    time.sleep(0.01)
    with open(f, "r+b") as fh:
        fh.write(b"B" * 32)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
    assert file_digest(f) != before
    # a judge spec's path part is content too; other strings stand for themselves
    assert content_config({"judge": f"transformers:{f}", "name": "x"}) == {
        "judge": f"transformers:content:{file_digest(f)}", "name": "x"}


def test_file_digests_are_each_files_digest_in_order_and_memoised_across_processes(tmp_path):
    """``file_digests`` (PARROT's dataset identity): each file's ``file_digest`` in the order given, and the memo
    written to ``memo_dir`` so that another process need not hash the files again."""
    from rewardkit.fingerprint import _load_memo, file_digest, file_digests

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("1\n")
    b.write_text("2\n")
    assert file_digests([b, a, b], tmp_path / "memo") == [file_digest(b), file_digest(a), file_digest(b)]
    assert file_digest(a) != file_digest(b)
    memo = _load_memo(tmp_path / "memo")
    assert {str(a.resolve()), str(b.resolve())} <= set(memo) and memo[str(a.resolve())][-1] == file_digest(a)


# ------------------------------------------------------------------------------------------- item 4: pixels
def test_out_of_range_integer_pixels_are_refused_as_on_the_direct_path(reward, tmp_path):
    """Bug: an integer pixel cell was ``astype(uint8)``-wrapped (300 -> 44) and scored as valid, while calling
    the reward on the same array refuses it. In-range integers score as the same uint8 array scored directly."""
    from rewardkit.datasets import score_dataset

    rng = np.random.default_rng(0)
    good = rng.integers(0, 256, (8, 8, 3))
    bad = good.copy()
    bad[0, 0, 0] = 300
    neg = good.copy()
    neg[1, 1, 1] = -1
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([{"image": a.tolist(), "prompt": "a cat"} for a in (good, bad, neg)]),
                   d / "px.parquet")
    score_dataset(reward, d, tmp_path / "out", progress=False)
    t = pq.read_table(tmp_path / "out" / "px.parquet").to_pylist()
    direct = reward([good.astype(np.uint8), bad, neg], ["a cat"] * 3, on_error="nan")
    assert [r["valid"] for r in t] == [True, False, False] == direct.valid.tolist()
    assert "[0, 255]" in t[1]["error"] and "300" in t[1]["error"] and "-1" in t[2]["error"]
    assert t[0]["score"] == pytest.approx(float(direct.scores[0]), rel=1e-6)


# ------------------------------------------------------------------------------------------- item 5: tar members
def test_an_oversized_tar_member_is_a_per_sample_error_read_never(reward, tmp_path, monkeypatch):
    """Bug: tar members were read whole, whatever their size. Past the limit a member is skipped unread and its
    sample is invalid with the reason; the other samples are scored."""
    from rewardkit.datasets import score_dataset

    small, big = png_bytes(1, size=8), png_bytes(2, size=64)
    assert len(small) < 1000 < len(big)
    write_tar(tmp_path / "d" / "s.tar", [{"__key__": "a", "png": small, "txt": b"a cat"},
                                          {"__key__": "b", "png": big, "txt": b"a dog"},
                                          {"__key__": "c", "png": small, "txt": b"a cow"}])
    monkeypatch.setenv("REWARDKIT_MAX_TAR_MEMBER", "1000")
    score_dataset(reward, tmp_path / "d", tmp_path / "out", progress=False)
    rows = pq.read_table(tmp_path / "out" / "s.parquet").to_pylist()
    assert [r["valid"] for r in rows] == [True, False, True]
    assert "b.png" in rows[1]["error"] and f"{len(big):,} bytes" in rows[1]["error"] and "1,000" in rows[1]["error"]


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar to write a sparse member")
def test_a_10_kb_sparse_tar_with_a_1_gib_member_allocates_nothing_large(tmp_path):
    """Bug: a 10 KB sparse tar (or a tiny gzip tar) holding a 1 GiB member made the reader allocate >1 GiB."""
    import tracemalloc

    from rewardkit.datasets.readers import iter_wds_samples

    src = tmp_path / "src"
    src.mkdir()
    with open(src / "a.png", "wb") as f:
        f.truncate(1 << 30)
    (src / "a.txt").write_bytes(b"a cat")
    shard = tmp_path / "s.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(shard), "-C", str(src), "a.png", "a.txt"], check=True)
    assert shard.stat().st_size < 64 << 10
    tracemalloc.start()
    try:
        samples = list(iter_wds_samples(str(shard)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    (key, sample, _), = samples
    assert key == "a" and sample["txt"] == b"a cat" and type(sample["png"]).__name__ == "TooLarge"


# ------------------------------------------------------------------------------------------- item 7: shards
def test_skip_bad_shards_quarantines_and_exits_3_and_filter_reads_the_rest(tiny_clip_dir, tmp_path, capsys):
    """Bug: one corrupt shard stopped every run (a rerun stopped at the same shard). With --skip-bad-shards the
    unreadable shards (not Parquet at all; a tar truncated mid-way) are quarantined: listed in the summary and
    the manifest, exit 3; the good shards are scored and `filter` keeps rows of them only."""
    write_tar(tmp_path / "d" / "a.tar", [{"__key__": f"k{i}", "png": png_bytes(i), "txt": b"a cat"} for i in range(3)])
    write_tar(tmp_path / "d" / "b.tar", [{"__key__": f"j{i}", "png": png_bytes(9 + i), "txt": b"a dog"}
                                         for i in range(6)])
    raw = (tmp_path / "d" / "b.tar").read_bytes()
    (tmp_path / "d" / "b.tar").write_bytes(raw[:len(raw) // 2 + 100])  # a tar cut off mid-member
    (tmp_path / "d" / "c.tar").write_bytes(b"definitely not a tar" * 40)
    base = ["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(tmp_path / "d"), "--output",
            str(tmp_path / "out"), "--no-progress"]
    assert _cli(*base) == 2  # without the flag: stops, as before
    capsys.readouterr()
    assert _cli(*base, "--skip-bad-shards") == 3
    err = capsys.readouterr().err
    assert "2 shard(s) quarantined" in err and "b:" in err and "c:" in err
    man = json.loads((tmp_path / "out" / "_rewardkit_scores.json").read_text())
    assert sorted(q["shard"] for q in man["quarantined"]) == ["b", "c"]
    assert "truncated or corrupt" in next(q["reason"] for q in man["quarantined"] if q["shard"] == "b")
    assert (tmp_path / "out" / "a.parquet").exists() and not (tmp_path / "out" / "b.parquet").exists()
    assert _cli("filter", "--dataset", str(tmp_path / "d"), "--scores", str(tmp_path / "out"), "--where",
                "score == score", "--output", str(tmp_path / "kept"), "--no-progress") == 0
    with tarfile.open(tmp_path / "kept" / "a.tar") as tf:
        assert sorted(m.name for m in tf) == sorted(f"k{i}.{e}" for i in range(3) for e in ("png", "txt"))
    rep = json.loads((tmp_path / "kept" / "_rewardkit_filter.json").read_text())
    assert rep["quarantined"] == ["b", "c"] and rep["kept"] == 3


class _Counting:
    """The reward, counting the rows it is asked to score; raises KeyboardInterrupt at call ``stop``."""

    def __init__(self, reward, stop: int = -1):
        self.reward, self.stop, self.calls, self.rows = reward, stop, 0, 0

    def __getattr__(self, name):
        return getattr(self.reward, name)

    def __call__(self, images, *a, **k):
        self.calls += 1
        if self.calls == self.stop:
            raise KeyboardInterrupt
        self.rows += len(images)
        return self.reward(images, *a, **k)


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_an_interrupted_shard_resumes_after_its_last_row_group_with_the_same_bytes(reward, tmp_path, monkeypatch,
                                                                                  fmt):
    """Bug: an interrupted shard restarted from row 0 (hours of a large shard scored again). Now every row group
    is committed as it fills; the rerun scores only the rows after the last one and the finished file is
    byte for byte the uninterrupted run's."""
    from rewardkit.datasets import output, score_dataset

    monkeypatch.setattr(output, "ROW_GROUP", 4)
    if fmt == "parquet":
        _parquet_set(tmp_path / "data", shards=1, rows=11)
    else:
        write_tar(tmp_path / "data" / "part-0.tar", [{"__key__": f"k{i:02d}", "png": png_bytes(40 + i),
                                                      "txt": f"thing {i}".encode()} for i in range(11)])
    score_dataset(reward, tmp_path / "data", tmp_path / "full", batch_size=2, progress=False)
    with pytest.raises(KeyboardInterrupt):  # calls 1-2: rows 0-3 = one committed group; call 3 pending; 4 stops
        score_dataset(_Counting(reward, stop=4), tmp_path / "data", tmp_path / "out", batch_size=2, progress=False)
    assert [p.name for p in (tmp_path / "out" / "_partial" / "part-0").iterdir()] == ["00000000.parquet"]
    counting = _Counting(reward)
    s = score_dataset(counting, tmp_path / "data", tmp_path / "out", batch_size=2, progress=False)
    assert counting.rows == 11 - 4 and s.rows == 7 and s.shards_scored == 1
    assert (tmp_path / "out" / "part-0.parquet").read_bytes() == (tmp_path / "full" / "part-0.parquet").read_bytes()
    assert not (tmp_path / "out" / "_partial").exists()


def test_a_finished_rerun_loads_no_model(tiny_clip_dir, tmp_path, monkeypatch, capsys):
    """Bug: the resume manifest was checked after loading the reward, so a finished rerun spent minutes loading
    a model to do nothing."""
    import rewardkit.commands._common as common

    _parquet_set(tmp_path / "data")
    argv = ["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(tmp_path / "data"), "--output",
            str(tmp_path / "out"), "--no-progress"]
    assert _cli(*argv) == 0

    def no_loading(*a, **k):
        raise AssertionError("the reward was loaded for a finished folder")

    monkeypatch.setattr(common, "load_reward_cli", no_loading)
    assert _cli(*argv) == 0
    assert "2 shard(s) already done" in capsys.readouterr().err


def test_a_brace_range_of_a_million_names_is_refused_before_expanding(tmp_path):
    """Bug: ``shard-{0..999999}.tar`` built a million names (and stat-ed each) before saying anything."""
    from rewardkit.commands import UsageError
    from rewardkit.datasets import open_dataset
    from rewardkit.datasets.sources import expand_braces

    with pytest.raises(UsageError, match=r"1,000,000 names"):
        open_dataset(str(tmp_path / "shard-{0..999999}.tar"))
    with pytest.raises(UsageError, match=r"expand to 1,000,000"):
        expand_braces("x-{0..999}-{0..999}.tar")  # two ranges multiply
    assert expand_braces("s-{08..10}.tar") == ["s-08.tar", "s-09.tar", "s-10.tar"]


# ------------------------------------------------------------------------------------------- issue 39 item 4
def test_a_shard_scored_by_another_reward_is_refused_on_its_own(reward, tiny_clip_dir, tmp_path):
    """Bug it catches: a per-shard check dropped (only the folder's manifest compared). A finished shard file
    copied in from another reward's folder, under a matching manifest, must stop the rerun naming that shard;
    so must another reward's committed row groups of an unfinished shard."""
    from rewardkit import load_reward
    from rewardkit.commands import UsageError
    from rewardkit.datasets import output, score_dataset

    _parquet_set(tmp_path / "data")
    score_dataset(reward, tmp_path / "data", tmp_path / "mine", progress=False)
    other = load_reward("clipscore", model=str(tiny_clip_dir))
    score_dataset(other, tmp_path / "data", tmp_path / "theirs", progress=False)
    shutil.copy(tmp_path / "theirs" / "part-1.parquet", tmp_path / "mine" / "part-1.parquet")
    with pytest.raises(UsageError, match=r"part-1\.parquet: written by another reward"):
        score_dataset(reward, tmp_path / "data", tmp_path / "mine", progress=False)
    (tmp_path / "mine" / "part-1.parquet").unlink()
    part = output.partial_dir(tmp_path / "mine", "part-1")
    part.mkdir(parents=True)
    shutil.copy(tmp_path / "theirs" / "part-1.parquet", part / "00000000.parquet")
    with pytest.raises(UsageError, match=r"rows of shard part-1 scored by another reward"):
        score_dataset(reward, tmp_path / "data", tmp_path / "mine", progress=False)
