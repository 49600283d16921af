"""PARROT stage records know their dataset by its content, not by how ``data.train`` spells it: rows are keyed by
index, so records of an edited file would be paired with other rows. Bug: the check compared the path string, so
the same file named another way (relative, ``./``, a symlink) was refused and an edited file at the same path was
accepted, mixing the old rows' rationales with the new rows."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from PIL import Image

from rewardkit.errors import ConfigError
from rewardkit.fingerprint import file_digest
from rewardkit.parrot.pipeline import DataCfg, ParrotConfig, Pipeline, TeacherCfg

ROWS = [{"prompt": f"a cat {i}", "image_a": "bright.png", "image_b": "dark.png", "label": "A"} for i in range(4)]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture()
def data(tmp_path, monkeypatch):
    """``tmp_path/pairs/pairs.jsonl`` (4 rows, images beside it); the working directory is ``tmp_path``, the
    fingerprint memo in the test's own cache."""
    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "pairs"
    d.mkdir()
    for name, v in (("bright.png", 255), ("dark.png", 0)):
        Image.fromarray(np.full((16, 16, 3), v, dtype=np.uint8)).save(d / name)
    _write(d / "pairs.jsonl", ROWS)
    return d / "pairs.jsonl"


def _cfg(tmp_path, train, **data_kw):
    return ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train=str(train), **data_kw),
                        teacher=TeacherCfg(judge="scripted"), batch_size=4)


def _records(tmp_path):
    return [json.loads(x) for x in (tmp_path / "out" / "rationales.jsonl").read_text().splitlines()]


def test_the_same_file_spelled_another_way_resumes(tmp_path, data):
    """Relative, ``./``, absolute, through a symlink, or a copy elsewhere: the same rows, so the records are this
    run's (nothing is asked again). Each record names the resolved path and the content."""
    assert Pipeline(_cfg(tmp_path, "pairs/pairs.jsonl"), progress=False).rationalize() == 4
    recs = _records(tmp_path)
    assert {r["data"] for r in recs} == {str(data.resolve())}
    assert {r["data_content"] for r in recs} == {f"content:{file_digest(data)}"}
    os.symlink(data.parent, tmp_path / "link")
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in data.parent.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    for spelling in ("./pairs/pairs.jsonl", str(data), "link/pairs.jsonl", "pairs/../pairs/pairs.jsonl",
                     str(copy / "pairs.jsonl")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no "could not be verified" warning: the content was compared)
            assert Pipeline(_cfg(tmp_path, spelling), progress=False).rationalize() == 0, spelling
    assert len(_records(tmp_path)) == 4


@pytest.mark.parametrize("change", ["edited", "reordered", "appended", "truncated"])
def test_a_changed_file_at_the_same_path_is_refused(tmp_path, data, change):
    """Rows edited in place (same size), reordered, appended or removed: refused at every stage's start, with
    what differs and how to go on."""
    pipe = Pipeline(_cfg(tmp_path, data), progress=False)
    pipe.rationalize()
    pipe.filter()
    rows = [dict(r) for r in ROWS]
    if change == "edited":
        rows[2]["prompt"] = "a dog 2"
    elif change == "reordered":
        rows = [rows[1], rows[0], *rows[2:]]
    elif change == "appended":
        rows.append({**ROWS[0], "prompt": "a new row"})
    else:
        rows = rows[:3]
    before = data.read_bytes()
    _write(data, rows)
    assert data.read_bytes() != before
    for stage in ("rationalize", "filter", "project", "sft"):
        with pytest.raises(ConfigError, match=r"the same path, other content: the file was changed since.*"
                                              r"keyed by row index.*restore the dataset"):
            Pipeline(_cfg(tmp_path, "pairs/pairs.jsonl"), progress=False).check_stage(stage)
    _write(data, ROWS)  # put back: resumes again
    assert Pipeline(_cfg(tmp_path, data), progress=False).rationalize() == 0


def test_another_dataset_is_refused_and_a_folder_is_its_row_files(tmp_path, data):
    """Another file's rows are another dataset; the folder holding the file reads the same rows (its
    ``*.jsonl``), so it resumes; ``max_samples`` is not part of the identity (a longer run resumes)."""
    other = tmp_path / "other.jsonl"
    _write(other, ROWS[:2])
    Pipeline(_cfg(tmp_path, data, max_samples=2), progress=False).rationalize()
    with pytest.raises(ConfigError, match=r"data: .*other\.jsonl.*now \(another dataset\)"):
        Pipeline(_cfg(tmp_path, other), progress=False).check_stage("rationalize")
    assert Pipeline(_cfg(tmp_path, "pairs"), progress=False).rationalize() == 2      # rows 2 and 3 only


def test_records_written_before_content_fingerprints(tmp_path, data):
    """Records naming their dataset by the path string only (written before ``data_content``): the same place
    (any spelling) resumes with a warning that the content could not be checked; another place is refused.
    New records carry the content."""
    pipe = Pipeline(_cfg(tmp_path, data), progress=False)
    pipe.rationalize(rows=[0, 1])
    store = tmp_path / "out" / "rationales.jsonl"
    old = [{k: v for k, v in r.items() if k != "data_content"} | {"data": "pairs/pairs.jsonl"}
           for r in _records(tmp_path)]
    _write(store, old)
    with pytest.warns(UserWarning, match=r"2 record\(s\) written before dataset fingerprints.*could not be verified"):
        assert Pipeline(_cfg(tmp_path, "./pairs/pairs.jsonl"), progress=False).rationalize() == 2
    recs = _records(tmp_path)
    assert ["data_content" in r for r in recs] == [False, False, True, True]
    _write(store, [r | {"data": "elsewhere/pairs.jsonl"} for r in old])
    with pytest.raises(ConfigError, match=r"data: 'elsewhere/pairs.jsonl' in the file, .*pairs/pairs.jsonl' now"):
        Pipeline(_cfg(tmp_path, data), progress=False).check_stage("rationalize")


def test_a_hub_dataset_is_its_datasets_fingerprint(tmp_path, monkeypatch):
    """A hub id (no local path): its ``datasets`` fingerprint (id, configuration, revision commit, split) is the
    content; another revision's rows are refused, the same resume. (``load_pairs`` stands in for the hub.)"""
    import datasets

    import rewardkit.train.data as data_mod

    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    fp = {"value": "aaaa"}

    def load_pairs(source, **kw):
        assert source == "someone/pairs" and kw.get("max_samples") is None
        ds = datasets.Dataset.from_list([{"prompt": "a cat", "image_a": None, "image_b": None, "label": "A"}])
        ds._fingerprint = fp["value"]
        return ds, None

    monkeypatch.setattr(data_mod, "load_pairs", load_pairs)
    cfg = _cfg(tmp_path, "someone/pairs")
    pipe = Pipeline(cfg, progress=False)
    assert pipe._data_fields() == {"data": "someone/pairs", "data_content": "datasets:train:aaaa"}
    (tmp_path / "out" / "rationales.jsonl").write_text(json.dumps(
        {"row": 0, "status": "ok", "teacher_spec": "scripted", "template": pipe.template.id, "seed": 0,
         **pipe._data_fields()}) + "\n")
    Pipeline(cfg, progress=False).check_stage("rationalize")
    fp["value"] = "bbbb"
    with pytest.raises(ConfigError, match=r"datasets:train:aaaa\) in the file, .*datasets:train:bbbb\) now "
                                          r"\(another dataset\)"):
        Pipeline(cfg, progress=False).check_stage("rationalize")
