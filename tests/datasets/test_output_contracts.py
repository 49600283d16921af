"""``rewardkit.datasets.output``, the score folder on disk, function by function (no model): the manifest and
its refusal message, the fingerprint, finished / partial / quarantined shards, the shard writer's row groups and
resume, and reading the scores back. Expected values are written out by hand (or, for the fingerprint, the
formula of ``rewardkit/datasets/output.py::reward_description`` transcribed); the files are read back with
pyarrow, not with the module under test. These are the tests ``scripts/mutation.sh output`` runs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from rewardkit._version import __version__  # noqa: E402
from rewardkit.datasets import output as out  # noqa: E402
from rewardkit.errors import UsageError  # noqa: E402

FP = "f" * 16


def desc(fp: str = FP, **kw) -> dict:
    d = {"reward": "r", "config": {"x": 1}, "rewardkit_version": "1.0", "columns": {"image": "img"},
         "content": {}, "fingerprint": fp}
    d.update(kw)
    return d


def rec(score, valid=True, error=None, **kw) -> dict:
    return {"score": score, "valid": valid, "error": error, **kw}


def scored_file(path: Path, fingerprint: str | None, rows: int = 2) -> Path:
    meta = None if fingerprint is None else {b"rewardkit": json.dumps({"fingerprint": fingerprint}).encode()}
    t = pa.table({"row": list(range(rows))}).replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)
    return path


# ------------------------------------------------------------------------------------------------ small pieces

def test_constants_and_dim_column():
    assert out.MANIFEST == "_rewardkit_scores.json" and out.META_KEY == b"rewardkit"
    assert out.PARTIAL == "_partial" and out.QUARANTINE == "_quarantine" and out.ROW_GROUP == 16384
    assert out.dim_column("text_faithfulness") == "dim_text_faithfulness"
    assert out.dim_column("a b-c/d.e") == "dim_a_b_c_d_e"
    assert out.dim_column("Qualité 2") == "dim_Qualité_2"  # \w is Unicode: letters stay
    assert out.partial_dir(Path("/o"), "s1") == Path("/o/_partial/s1")


@dataclasses.dataclass
class _Cfg:
    model: str = "m"
    device: str = "cpu"
    k: int = 3


class _Reward:
    def __init__(self, name, config):
        self.name, self.config = name, config


def test_reward_description_fields_and_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "cache"))
    cols = {"image": "img", "prompt": "caption"}
    d = out.reward_description(_Reward("pick", _Cfg()), cols)
    # the key hashed, transcribed from reward_description: device left out, sorted JSON, sha256, 16 hex digits
    key = {"reward": "pick", "config": {"model": "m", "k": 3}, "columns": cols, "rewardkit": __version__}
    fp = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    assert d == {"reward": "pick", "config": {"model": "m", "device": "cpu", "k": 3}, "rewardkit_version": __version__,
                 "columns": cols, "content": {}, "fingerprint": fp}
    # the device is where a reward runs, not what it computes: the same fingerprint
    assert out.reward_description(_Reward("pick", _Cfg(device="cuda:1")), cols)["fingerprint"] == fp
    assert out.reward_description(_Reward("pick", _Cfg(k=4)), cols)["fingerprint"] != fp
    assert out.reward_description(_Reward("pick", _Cfg()), {"image": "img"})["fingerprint"] != fp
    # no name: the class name; a config that is not a dataclass or a mapping: its repr
    nameless = out.reward_description(_Reward("", {"a": 1}), {})
    assert nameless["reward"] == "_Reward" and nameless["config"] == {"a": 1}
    odd = _Reward("odd", 5)  # dict(5) raises: the reward is described by its repr
    assert out.reward_description(odd, {})["config"] == {"repr": repr(odd)}
    # values JSON cannot hold go through str()
    assert out.reward_description(_Reward("p", {"path": Path("rel/x")}), {})["config"] == {"path": "rel/x"}


def test_reward_description_keys_weights_by_content_not_path(tmp_path, monkeypatch):
    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "w.bin").write_bytes(b"weights one")
    da = out.reward_description(_Reward("p", {"model": str(a), "k": 1}), {})
    db = out.reward_description(_Reward("p", {"model": str(b), "k": 1}), {})
    assert da["fingerprint"] == db["fingerprint"]  # an equal checkpoint at another path
    assert da["config"]["model"] == str(a) and list(da["content"]) == ["model"]  # only the values content replaced
    assert da["content"]["model"].startswith("content:") and da["content"] == db["content"]
    (a / "w.bin").write_bytes(b"weights two")
    assert out.reward_description(_Reward("p", {"model": str(a), "k": 1}), {})["fingerprint"] != da["fingerprint"]


# ------------------------------------------------------------------------------------------------ the manifest

def test_check_manifest_writes_the_manifest_and_keeps_the_same_reward(tmp_path):
    folder = tmp_path / "deep" / "out"
    out.check_manifest(folder, desc(), {"shards": ["s0"]})
    text = (folder / "_rewardkit_scores.json").read_text(encoding="utf-8")
    assert text == json.dumps({**desc(), "shards": ["s0"]}, indent=2)
    assert sorted(p.name for p in folder.iterdir()) == ["_rewardkit_scores.json"]  # no temporary file left
    out.check_manifest(folder, desc(), {"shards": ["s0", "s1"]})  # the same fingerprint: reused, rewritten
    assert json.loads((folder / "_rewardkit_scores.json").read_text())["shards"] == ["s0", "s1"]
    # write=False (a rank other than 0): checked, not written
    other = tmp_path / "other"
    out.check_manifest(other, desc(), {}, write=False)
    assert other.is_dir() and not (other / "_rewardkit_scores.json").exists()
    with pytest.raises(UsageError, match="holds scores of a different reward"):
        out.check_manifest(folder, desc("0" * 16), {}, write=False)


def test_check_manifest_refusal_names_every_difference(tmp_path):
    old = {"reward": "pick", "config": {"x": 1, "y": 2, "device": "cpu", "w": "/old/w"}, "rewardkit_version": "0.1",
           "columns": {"image": "img"}, "content": {"w": "content:aaa", "v": "content:vvv"}, "fingerprint": "1" * 16}
    (tmp_path / "_rewardkit_scores.json").write_text(json.dumps(old), encoding="utf-8")
    new = {"reward": "hps", "config": {"x": 2, "y": 2, "device": "cuda", "z": 3, "w": "/new/w", "u": "/u"},
           "rewardkit_version": "0.2", "columns": {"image": "pic"}, "content": {"w": "content:bbb", "u": "content:uuu"},
           "fingerprint": "2" * 16}
    with pytest.raises(UsageError) as e:
        out.check_manifest(tmp_path, new, {})
    assert str(e.value) == (
        f"{tmp_path} holds scores of a different reward (reward 'pick' -> 'hps'; config u, w, x, z; "
        "the weights u names (/u) are not the ones scored before (no content recorded -> content:uuu); "
        "the weights v names (None) are not the ones scored before (content:vvv -> not a local path); "
        "the weights w names (/new/w) are not the ones scored before (content:aaa -> content:bbb); "
        f"columns; rewardkit 0.1 -> 0.2: {'1' * 16} vs {'2' * 16}); its finished shards cannot be reused. "
        "Use another --output folder (or --overwrite to rescore every shard)")
    # only the fingerprint differs (a manifest without config or content: written before they were kept)
    (tmp_path / "_rewardkit_scores.json").write_text(
        json.dumps({"reward": "r", "rewardkit_version": "1.0", "columns": {"image": "img"}, "fingerprint": "3" * 16}))
    with pytest.raises(UsageError) as e:
        out.check_manifest(tmp_path, desc(config={}), {})
    assert f"different reward (fingerprint: {'3' * 16} vs {FP});" in str(e.value)
    with pytest.raises(UsageError) as e:
        out.check_manifest(tmp_path, desc(config={"device": "cpu", "k": 1}), {})
    assert f"different reward (config k: {'3' * 16} vs {FP});" in str(e.value)  # the device is never a change


def test_check_manifest_overwrite_clears_the_scores_only_when_writing(tmp_path):
    (tmp_path / "_rewardkit_scores.json").write_text(json.dumps(desc("9" * 16)))
    scored_file(tmp_path / "s0.parquet", "9" * 16)
    scored_file(tmp_path / "_partial" / "s1" / "00000000.parquet", "9" * 16)
    (tmp_path / "_quarantine").mkdir()
    (tmp_path / "_quarantine" / "s2.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    out.check_manifest(tmp_path, desc(), {}, overwrite=True, write=False)  # a rank other than 0 removes nothing
    assert (tmp_path / "s0.parquet").exists() and (tmp_path / "_partial").exists()
    assert json.loads((tmp_path / "_rewardkit_scores.json").read_text())["fingerprint"] == "9" * 16
    out.check_manifest(tmp_path, desc(), {"shards": []}, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_rewardkit_scores.json", "notes.txt"]
    assert json.loads((tmp_path / "_rewardkit_scores.json").read_text()) == {**desc(), "shards": []}
    # nothing to clear (no score file, no _partial, no _quarantine): overwriting is no error
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "_rewardkit_scores.json").write_text(json.dumps(desc("9" * 16)))
    out.check_manifest(bare, desc(), {}, overwrite=True)
    assert json.loads((bare / "_rewardkit_scores.json").read_text())["fingerprint"] == FP


# ------------------------------------------------------------------------------- finished, partial, quarantined

def test_finished_reads_the_fingerprint_of_the_final_file(tmp_path):
    assert out.finished(tmp_path, "s0", desc()) is False
    scored_file(tmp_path / "s0.parquet", FP)
    assert out.finished(tmp_path, "s0", desc()) is True
    scored_file(tmp_path / "s1.parquet", "e" * 16)
    with pytest.raises(UsageError) as e:
        out.finished(tmp_path, "s1", desc())
    assert str(e.value) == (f"{tmp_path / 's1.parquet'}: written by another reward (fingerprint {'e' * 16} vs {FP}); "
                            "remove it or use another --output folder")
    scored_file(tmp_path / "s2.parquet", None)  # no metadata at all
    with pytest.raises(UsageError, match=f"fingerprint None vs {FP}"):
        out.finished(tmp_path, "s2", desc())


def test_partial_parts_are_sorted_counted_and_refused_from_another_reward(tmp_path):
    assert out.partial_parts(tmp_path, "s0", desc()) == [] and out.partial_rows(tmp_path, "s0", desc()) == 0
    d = tmp_path / "_partial" / "s0"
    p1 = scored_file(d / "00000001.parquet", FP, rows=3)
    p0 = scored_file(d / "00000000.parquet", FP, rows=5)
    (d / "00000002.parquet.tmp").write_bytes(b"half")  # a group being written: not a part
    assert out.partial_parts(tmp_path, "s0", desc()) == [p0, p1]
    assert out.partial_rows(tmp_path, "s0", desc()) == 8
    scored_file(d / "00000002.parquet", "a" * 16)
    with pytest.raises(UsageError) as e:
        out.partial_parts(tmp_path, "s0", desc())
    assert str(e.value) == (f"{d / '00000002.parquet'}: rows of shard s0 scored by another reward (fingerprint "
                            f"{'a' * 16} vs {FP}); remove {d} or use another --output folder")
    scored_file(d / "00000002.parquet", None)  # a part without rewardkit's metadata: refused the same way
    with pytest.raises(UsageError, match=f"scored by another reward \\(fingerprint None vs {FP}\\)"):
        out.partial_rows(tmp_path, "s0", desc())


def test_quarantine_round_trip_and_manifest_record(tmp_path):
    assert out.quarantined(tmp_path) == []
    out.unquarantine(tmp_path, "nothing")  # nothing there: no error
    out.quarantine(tmp_path, "s1", "/data/s1.tar", "bad tar")
    out.quarantine(tmp_path, "s0", "/data/s0.tar", "bad header")
    q = tmp_path / "_quarantine"
    assert sorted(p.name for p in q.iterdir()) == ["s0.json", "s1.json"]
    assert json.loads((q / "s1.json").read_text()) == {"shard": "s1", "path": "/data/s1.tar", "reason": "bad tar"}
    assert out.quarantined(tmp_path) == [{"shard": "s0", "path": "/data/s0.tar", "reason": "bad header"},
                                         {"shard": "s1", "path": "/data/s1.tar", "reason": "bad tar"}]
    scored_file(tmp_path / "s0.parquet", FP)  # scored since: no longer left out
    assert [r["shard"] for r in out.quarantined(tmp_path)] == ["s1"]
    (tmp_path / "_rewardkit_scores.json").write_text(json.dumps({"fingerprint": FP, "shards": ["s0", "s1"]}))
    bad = out.record_quarantine(tmp_path)
    assert bad == [{"shard": "s1", "path": "/data/s1.tar", "reason": "bad tar"}]
    assert (tmp_path / "_rewardkit_scores.json").read_text() == json.dumps(
        {"fingerprint": FP, "shards": ["s0", "s1"], "quarantined": bad}, indent=2)
    assert not list(tmp_path.glob("*.tmp"))
    out.unquarantine(tmp_path, "s1")
    assert out.quarantined(tmp_path) == [] and not (q / "s1.json").exists() and (q / "s0.json").exists()


# ----------------------------------------------------------------------------------------------- shard writer

def _read(path: Path):
    return pq.read_table(path)


def test_shard_writer_columns_values_and_metadata(tmp_path):
    w = out.ShardWriter(tmp_path / "o", "s0", "/in/s0.parquet", desc(), pa.int64(), ["text faith", "q"])
    assert w.rows == 0 and w.resumed == 0 and w.parts == [] and w.schema is None
    w.write([7, 8], [rec(0.5, dimensions={"text faith": 1.5}), rec(None, valid=False, error="bad image")])
    w.write([9], [rec(2, dimensions={"text faith": None, "q": 3})])
    assert w.rows == 3 and w.invalid == 1 and not w.final.exists()
    assert w.tmp == tmp_path / "o" / "s0.parquet.tmp"  # the documented name of a shard being joined
    w.commit()
    assert w.final == tmp_path / "o" / "s0.parquet" and not w.tmp.exists()
    t = _read(w.final)
    assert t.schema.names == ["shard", "row", "id", "score", "valid", "error", "dim_text_faith", "dim_q"]
    assert [str(f.type) for f in t.schema] == ["string", "int64", "int64", "double", "bool", "string", "double",
                                               "double"]
    got = t.to_pydict()
    assert got["shard"] == ["s0"] * 3 and got["row"] == [0, 1, 2] and got["id"] == [7, 8, 9]
    assert got["score"][0] == 0.5 and math.isnan(got["score"][1]) and got["score"][2] == 2.0
    assert got["valid"] == [True, False, True] and got["error"] == [None, "bad image", None]
    assert got["dim_text_faith"][0] == 1.5 and math.isnan(got["dim_text_faith"][1])
    assert math.isnan(got["dim_text_faith"][2])
    assert math.isnan(got["dim_q"][0]) and math.isnan(got["dim_q"][1]) and got["dim_q"][2] == 3.0
    assert json.loads(t.schema.metadata[b"rewardkit"]) == {**desc(), "input_shard": "/in/s0.parquet"}
    assert not (tmp_path / "o" / "_partial").exists()


def test_shard_writer_rationale_column_and_bad_ids(tmp_path):
    w = out.ShardWriter(tmp_path, "j", "/in/j", desc(), pa.string(), [])
    w.write(["a", "b"], [rec(1.0), rec(2.0, rationale="why")])
    w.write(["c"], [rec(3.0)])
    w.commit()
    t = _read(tmp_path / "j.parquet")
    assert t.schema.names[-1] == "rationale" and t.column("rationale").to_pylist() == [None, "why", None]
    w2 = out.ShardWriter(tmp_path, "k", "/in/k", desc(), pa.int64(), [])
    with pytest.raises(UsageError) as e:
        w2.write(["not a number"], [rec(1.0)])
    assert str(e.value).startswith("shard k: an id cannot be stored as int64 (")
    w3 = out.ShardWriter(tmp_path, "empty", "/in/e", desc(), pa.int64(), ["d"])
    w3.commit()  # no row at all: an empty score file with every column, no rationale
    t = _read(tmp_path / "empty.parquet")
    assert t.num_rows == 0 and t.schema.names == ["shard", "row", "id", "score", "valid", "error", "dim_d"]


def test_shard_writer_commits_row_groups_and_resumes_after_them(tmp_path, monkeypatch):
    monkeypatch.setattr(out, "ROW_GROUP", 4)
    ids = list(range(100, 111))
    w = out.ShardWriter(tmp_path, "s", "/in/s", desc(), pa.int64(), [])
    w.write(ids[:3], [rec(float(i), rationale=None) for i in ids[:3]])  # a judge: every record has a rationale
    parts = tmp_path / "_partial" / "s"
    assert not parts.exists()  # 3 rows < a row group: still pending
    w.write(ids[3:4], [rec(float(ids[3]), rationale="r")])  # exactly a row group: committed
    assert sorted(p.name for p in parts.iterdir()) == ["00000000.parquet"]
    assert pq.ParquetFile(parts / "00000000.parquet").metadata.num_rows == 4
    w.write(ids[4:6], [rec(float(i), valid=False) for i in ids[4:6]])
    w.abort()  # killed: the two pending rows are lost, the committed group stays
    assert w.rows == 6 and sorted(p.name for p in parts.iterdir()) == ["00000000.parquet"]
    r = out.ShardWriter(tmp_path, "s", "/in/s", desc(), pa.int64(), [])
    assert r.resumed == 4 and r.rows == 4 and r.rationale is True and r.schema is not None  # the first run's schema
    r.write(ids[4:9], [rec(float(i), rationale=None) for i in ids[4:9]])  # 5 rows: one more group, 1 pending
    assert sorted(p.name for p in parts.iterdir()) == ["00000000.parquet", "00000001.parquet"]
    assert r.rows == 9
    out.quarantine(tmp_path, "z", "/in/z", "x")  # another folder under the output: untouched by commit
    other = out.ShardWriter(tmp_path, "other", "/in/o", desc(), pa.int64(), [])  # another unfinished shard
    other.write([1, 2, 3, 4], [rec(1.0)] * 4)
    other.abort()
    r.commit()
    t = _read(tmp_path / "s.parquet")
    assert t.column("row").to_pylist() == list(range(9)) and t.column("id").to_pylist() == ids[:9]
    assert t.column("rationale").to_pylist() == [None, None, None, "r", None, None, None, None, None]
    assert pq.ParquetFile(tmp_path / "s.parquet").metadata.num_row_groups == 3  # 4 + 4 + 1, as flushed
    assert json.loads(pq.read_schema(tmp_path / "s.parquet").metadata[b"rewardkit"])["input_shard"] == "/in/s"
    assert not parts.exists() and (tmp_path / "_partial" / "other").is_dir()
    # the last unfinished shard committed: no empty _partial folder stays
    o = out.ShardWriter(tmp_path, "other", "/in/o", desc(), pa.int64(), [])
    assert o.resumed == 4
    o.commit()
    assert not (tmp_path / "_partial").exists() and _read(tmp_path / "other.parquet").num_rows == 4


def test_shard_writer_refuses_rows_of_another_reward(tmp_path):
    scored_file(tmp_path / "_partial" / "s" / "00000000.parquet", "b" * 16)
    with pytest.raises(UsageError, match="rows of shard s scored by another reward"):
        out.ShardWriter(tmp_path, "s", "/in/s", desc(), pa.int64(), [])


def test_atomic_parquet_appears_only_on_commit(tmp_path):
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    f = tmp_path / "sub" / "x.parquet"
    w = out.AtomicParquet(f, schema)
    w.write({"a": [1, 2], "b": ["x", "y"]})
    w.write({"a": [3], "b": [None]})
    assert w.rows == 3 and not f.exists() and (tmp_path / "sub" / "x.parquet.tmp").exists()
    w.commit()
    assert not (tmp_path / "sub" / "x.parquet.tmp").exists()
    assert _read(f).to_pydict() == {"a": [1, 2, 3], "b": ["x", "y", None]}
    g = out.AtomicParquet(tmp_path / "y.parquet", schema)
    g.write({"a": [1], "b": ["x"]})
    g.abort()
    assert not (tmp_path / "y.parquet").exists()


# ---------------------------------------------------------------------------------------------- reading back

def test_read_scores_in_manifest_order_without_quarantined_shards(tmp_path):
    with pytest.raises(UsageError) as e:
        out.read_scores(tmp_path)
    assert str(e.value) == (f"{tmp_path}: not a scores folder (no _rewardkit_scores.json; write one with `rewardkit "
                            "score --dataset ... --output DIR`)")
    (tmp_path / "_rewardkit_scores.json").write_text(json.dumps({"fingerprint": FP}))
    table, meta = out.read_scores(tmp_path)
    assert table is None and meta == {"fingerprint": FP, "quarantined": []}
    for name, rows in (("b", 2), ("a", 1)):
        pq.write_table(pa.table({"shard": [name] * rows, "row": list(range(rows))}), tmp_path / f"{name}.parquet")
    (tmp_path / "_rewardkit_scores.json").write_text(json.dumps({"fingerprint": FP, "shards": ["b", "c", "a", "d"]}))
    with pytest.raises(UsageError) as e:
        out.read_scores(tmp_path)
    assert str(e.value) == (f"{tmp_path}: shard c has no scores yet (the scoring run did not finish; rerun "
                            "`rewardkit score` with the same --output to resume)")
    out.quarantine(tmp_path, "d", "/in/d", "bad")
    out.quarantine(tmp_path, "c", "/in/c", "bad")
    table, meta = out.read_scores(tmp_path)
    assert table.to_pydict() == {"shard": ["b", "b", "a"], "row": [0, 1, 0]}
    assert meta == {"fingerprint": FP, "shards": ["b", "c", "a", "d"], "quarantined": ["c", "d"]}
    table, _ = out.read_scores(tmp_path, columns=["row"])
    assert table.column_names == ["row"]
