"""Issue 9, item 11: the bench score cache validates what it reads and refuses files it cannot trust."""

from __future__ import annotations

import math
import sqlite3

import pytest

from rewardkit.bench.cache import SCHEMA_VERSION, CacheFileError, ScoreCache


def _open(tmp_path, **kw):
    return ScoreCache(tmp_path, "r", "fp", **kw)


def _tamper(path, sql, *args):
    db = sqlite3.connect(str(path))
    db.execute(sql, args)
    db.commit()
    db.close()


def test_round_trip_and_schema_version(tmp_path):
    with _open(tmp_path) as c:
        c.put_scores([("a", 0.5, True, None), ("b", float("nan"), False, "bad image")])
        c.put_pairs([("p", 0.25, True, None)])
        path = c.path
    with _open(tmp_path) as c:
        got = c.get_scores(["a", "b", "zz"])
        assert got["a"] == (0.5, True, None) and math.isnan(got["b"][0]) and got["b"][1:] == (False, "bad image")
        assert c.get_pairs(["p"]) == {"p": (0.25, True, None)}
    db = sqlite3.connect(str(path))
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


@pytest.mark.parametrize("table, value, valid", [
    ("scores", 1e300, 1), ("scores", -1e300, 1), ("scores", "abc", 1), ("scores", b"\x00", 1),
    ("scores", None, 1), ("scores", 0.5, 7), ("scores", 0.5, "yes"), ("scores", 0.7, 0),
    ("pairs", 1.5, 1), ("pairs", -0.1, 1), ("pairs", "abc", 1), ("pairs", None, 1),
])
def test_tampered_rows_are_not_used(tmp_path, table, value, valid):
    with _open(tmp_path) as c:
        c.put_scores([("k", 0.5, True, None)])
        c.put_pairs([("k", 0.5, True, None)])
        path = c.path
    col = "score" if table == "scores" else "prob_a"
    _tamper(path, f"UPDATE {table} SET {col} = ?, valid = ? WHERE key = 'k'", value, valid)
    with _open(tmp_path) as c:
        with pytest.warns(RuntimeWarning, match="ignored 1 malformed row"):
            got = c.get_scores(["k"]) if table == "scores" else c.get_pairs(["k"])
        assert got == {} and c.n_bad_rows == 1  # a miss: the harness re-scores and overwrites it


def test_wrong_type_error_text_is_not_used(tmp_path):
    with _open(tmp_path) as c:
        c.put_scores([("k", float("nan"), False, "x")])
        path = c.path
    _tamper(path, "UPDATE scores SET error = ? WHERE key = 'k'", b"\x00\x01")
    with _open(tmp_path) as c, pytest.warns(RuntimeWarning):
        assert c.get_scores(["k"]) == {}


def test_score_range_from_describe(tmp_path):
    with _open(tmp_path) as c:
        c.put_scores([("k", 5.0, True, None)])
    with _open(tmp_path, describe={"score_range": [0.0, 1.0]}) as c, pytest.warns(RuntimeWarning):
        assert c.get_scores(["k"]) == {}


@pytest.mark.parametrize("content", [b"this is not a database" * 100, b"\x00" * 4096,
                                     b"SQLite format 3\x00" + b"\xff" * 4000])
def test_garbage_file_gives_the_remedy(tmp_path, content):
    d = tmp_path / "r"
    d.mkdir()
    (d / "fp.sqlite").write_bytes(content)
    with pytest.raises(CacheFileError, match=r"fp\.sqlite.*Delete that file.*--cache-dir"):
        _open(tmp_path)


def test_foreign_schema_and_newer_version_are_refused(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    db = sqlite3.connect(str(d / "fp.sqlite"))
    db.execute("CREATE TABLE scores (key TEXT, blob BLOB)")
    db.commit()
    db.close()
    with pytest.raises(CacheFileError, match="table 'scores' has columns"):
        _open(tmp_path)
    (d / "fp.sqlite").unlink()
    with _open(tmp_path) as c:
        path = c.path
    _tamper(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(CacheFileError, match="schema version '99'.*--cache-dir"):
        _open(tmp_path)
