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


def test_two_processes_opening_one_new_file_both_get_it(tmp_path, monkeypatch):
    # The bug this catches (seen in CI: a torchrun-sharded bench, two ranks starting together): the version stamp
    # was checked, then inserted; a rank that stamped the new file in between made the other's insert fail
    # (UNIQUE constraint failed: meta.key -> CacheFileError). Here a second cache opens the file (and stamps it)
    # at the worst moment: right before the first one writes its stamp (after its check, in the old order).
    import rewardkit.bench.cache as cache_mod

    real_connect = sqlite3.connect
    state = {"done": False}

    class Racing:
        def __init__(self, db):
            self._db = db

        def __getattr__(self, name):
            return getattr(self._db, name)

        def execute(self, sql, *args):
            if sql.startswith("INSERT") and "schema_version" in sql and not state["done"]:
                state["done"] = True
                monkeypatch.setattr(cache_mod.sqlite3, "connect", real_connect)
                ScoreCache(tmp_path, "r", "fp").close()  # the other rank: creates and stamps the file
            return self._db.execute(sql, *args)

    import contextlib

    # without the set-up lock (the first defence, tested below): the stamp itself must take the race
    monkeypatch.setattr(cache_mod, "_setup_lock", lambda path: contextlib.nullcontext())
    monkeypatch.setattr(cache_mod.sqlite3, "connect", lambda *a, **k: Racing(real_connect(*a, **k)))
    with _open(tmp_path) as c:
        c.put_scores([("a", 0.5, True, None)])
        path = c.path
    assert state["done"]
    db = sqlite3.connect(str(path))
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION),)]
    db.close()


def test_a_file_being_set_up_by_another_process_is_waited_for(tmp_path):
    # The bug this catches: two ranks setting one new file up at once ("database is locked" from SQLite's journal
    # switch, at once, not after its busy timeout). The set-up holds a lock file; an opener waits for it.
    import fcntl
    import threading

    path = tmp_path / "r" / "fp.sqlite"
    path.parent.mkdir(parents=True)
    opened = []
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # another process is setting the file up
        t = threading.Thread(target=lambda: opened.append(_open(tmp_path)))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not opened  # waits: it never reaches a half set-up file
        fcntl.flock(fh, fcntl.LOCK_UN)
    t.join(60)
    assert len(opened) == 1 and opened[0].path == path
    opened[0].close()
