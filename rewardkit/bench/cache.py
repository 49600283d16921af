"""On-disk score cache: one SQLite file per (reward, configuration), keyed by content hashes.

Rows are committed after every scored chunk, so an interrupted run resumes where it stopped and a re-run
with a new metric costs nothing. Only numbers, flags and strings are stored (no pickles).

Nothing read back is trusted: the file must be an SQLite database with this module's tables and schema
version (:data:`SCHEMA_VERSION`, stored in ``meta``), else :class:`CacheFileError` says how to recover
(``--cache-dir`` elsewhere, or delete the file). Each row read is validated (a score is a finite number with
``|x| <= 1e15`` and inside the reward's ``score_range`` when known, a probability lies in [0, 1], ``valid``
is 0 / 1, texts are strings); a row that fails is not used: it is re-scored and overwritten, with a warning
naming the file and the number of bad rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sqlite3
import threading
import warnings
from pathlib import Path
from typing import Any, Iterable

from ..errors import RewardkitError
from ..fingerprint import content_config, content_identity, file_digest  # noqa: F401  (re-exported)

__all__ = ["ScoreCache", "CacheFileError", "SCHEMA_VERSION", "default_cache_dir", "reward_fingerprint",
           "sample_key", "pair_key", "content_identity", "reward_identity", "file_digest"]

#: Version of the on-disk layout (tables and columns below). Bump it when they change.
SCHEMA_VERSION = 1
_MAX_ABS = 1e15  # no reward scores beyond this; larger cached values are tampering or corruption
_COLUMNS = {"scores": ["key", "score", "valid", "error"], "pairs": ["key", "prob_a", "valid", "error"],
            "verdicts": ["key", "verdict", "error"], "meta": ["key", "value"]}


class CacheFileError(RewardkitError, OSError):
    """The score-cache file is not a valid rewardkit cache (garbage, another program's, a newer schema)."""

    def __init__(self, path: Any, problem: str):
        self.path = path
        super().__init__(f"score cache {path}: {problem}. Delete that file (its scores are simply recomputed) "
                         "or pass --cache-dir DIR (cache_dir=...) to use another cache folder.")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, score REAL, valid INTEGER NOT NULL, error TEXT);
CREATE TABLE IF NOT EXISTS pairs (key TEXT PRIMARY KEY, prob_a REAL, valid INTEGER NOT NULL, error TEXT);
CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, verdict TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


def default_cache_dir() -> Path:
    """``$REWARDKIT_CACHE/bench``, else ``$XDG_CACHE_HOME/rewardkit/bench``, else ``~/.cache/rewardkit/bench``."""
    if os.environ.get("REWARDKIT_CACHE"):
        return Path(os.environ["REWARDKIT_CACHE"]) / "bench"
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "rewardkit" / "bench"


def reward_fingerprint(name: str, cls: str, config: dict[str, Any], *, reward: Any = None,
                       memo_dir: str | Path | None = None) -> str:
    """Hash of what determines a reward's scores: registry name, class and configuration **with every local
    file or directory it names replaced by its content digest** (:func:`rewardkit.fingerprint.content_config`:
    weights replaced at the same path give another fingerprint, an equal checkpoint at another path the same
    one), and with ``reward`` its judge's identity and template ids (:func:`reward_identity`: a template edited
    and re-versioned under the same name, a judge served under another model name). ``memo_dir`` keeps file
    digests between runs (keyed by path, size, mtime, ctime, inode)."""
    ident = {"name": name, "class": cls, "config": content_config(config, memo_dir)}
    if reward is not None:
        ident["reward"] = reward_identity(reward)
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def reward_identity(reward: Any) -> dict[str, Any]:
    """What a reward object says about its judge(s) and template(s): every judge backend's ``describe()`` and
    every template's id (family/name@version) among its attributes, and its sub-rewards' (a composite's)."""
    from ..judges.base import JudgeBackend
    from ..judges.templates import Template

    out: dict[str, Any] = {}
    for k, v in sorted(vars(reward).items()):
        if isinstance(v, Template):
            out[k] = v.id
        elif isinstance(v, JudgeBackend):
            try:
                out[k] = v.describe()
            except Exception as exc:  # noqa: BLE001 - an identity that cannot be read is part of the key
                out[k] = f"<describe failed: {type(exc).__name__}>"
        elif isinstance(v, dict) and k == "rewards":
            out[k] = {str(n): reward_identity(r) for n, r in sorted(v.items()) if hasattr(r, "__dict__")}
    return out


def sample_key(image_hash: str, prompt: str | None, source_hashes: Iterable[str]) -> str:
    """Key of one (image, prompt, sources) sample."""
    blob = "\x1f".join([image_hash, prompt if prompt is not None else "\x00", *source_hashes])
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def pair_key(first_hash: str, second_hash: str, prompt: str | None, source_hashes: Iterable[str]) -> str:
    """Key of one ordered comparison (first shown as A)."""
    return sample_key(first_hash + ">" + second_hash, prompt, source_hashes)


@contextlib.contextmanager
def _setup_lock(path: Path | None):
    """One process at a time sets a cache file up (journal mode, tables, version stamp): the ranks of a
    torchrun-sharded bench open the same new file together, and SQLite answers a journal-mode switch or a
    read-to-write upgrade that races another writer with "database is locked" at once, not after its busy
    timeout. A lock file beside the cache (``fcntl``; where that is missing, no lock)."""
    if path is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ScoreCache:
    """SQLite cache at ``root/<reward name>/<fingerprint>.sqlite``; ``root=None`` keeps it in memory."""

    def __init__(self, root: str | Path | None, reward_name: str, fingerprint: str,
                 describe: dict[str, Any] | None = None):
        if root is None:
            self.path = None
            target = ":memory:"
        else:
            d = Path(root).expanduser() / reward_name.replace("/", "_")
            d.mkdir(parents=True, exist_ok=True)
            self.path = d / f"{fingerprint}.sqlite"
            target = str(self.path)
        self._lock = threading.Lock()
        rng = (describe or {}).get("score_range")
        self._range = (float(rng[0]), float(rng[1])) if isinstance(rng, (list, tuple)) and len(rng) == 2 else None
        self._n_bad = 0
        try:
            # timeout: several processes (a torchrun-sharded bench) write one file; SQLite serialises the writers
            self._db = sqlite3.connect(target, check_same_thread=False, timeout=120.0)
        except sqlite3.Error as exc:
            raise CacheFileError(target, f"cannot be opened ({exc})") from None
        try:
            with _setup_lock(self.path):
                if self.path is not None:
                    # WAL + NORMAL: a commit survives the process being killed (what resuming needs) without an
                    # fsync per chunk; only an OS crash can lose the last chunks, which are then simply re-scored.
                    self._db.execute("PRAGMA journal_mode=WAL")
                    self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
                self._check_schema()
                if describe is not None:
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES ('reward', ?)",
                                     (json.dumps(describe, default=str),))
                self._db.commit()
        except sqlite3.DatabaseError as exc:  # "file is not a database", malformed image, ...
            self._db.close()
            raise CacheFileError(target, f"is not a valid SQLite database ({exc})") from None
        except CacheFileError:
            self._db.close()
            raise

    def _check_schema(self) -> None:
        """Tables with the expected columns, and a schema version this code reads (stamped on new files)."""
        for table, cols in _COLUMNS.items():
            have = [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]
            if have != cols:
                raise CacheFileError(self.path or ":memory:", f"table {table!r} has columns {have}, expected {cols}")
        # a new file, or one written before the version was stored (same tables): stamp it. OR IGNORE: another
        # process opening the same new file (the ranks of a torchrun-sharded bench) may have stamped it between
        # a check and this insert; the version read back is then theirs, checked like any other
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if str(row[0]) != str(SCHEMA_VERSION):
            raise CacheFileError(self.path, f"has schema version {row[0]!r}; this rewardkit reads version "
                                            f"{SCHEMA_VERSION}")

    # --------------------------------------------------------------------------- validation of rows read
    def _number(self, x: Any, lo: float, hi: float) -> float | None:
        """A stored number if well-formed (real, not bool, finite, within [lo, hi]); None otherwise."""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        x = float(x)
        return x if (math.isfinite(x) and lo <= x <= hi) else None

    @staticmethod
    def _text(x: Any) -> bool:
        return x is None or isinstance(x, str)

    def _row(self, value: Any, valid: Any, err: Any, lo: float, hi: float) -> tuple[float, bool, str | None] | None:
        """A validated ``(value, valid, error)`` or None (bad row: not used, re-scored)."""
        if isinstance(valid, bool) or valid not in (0, 1) or not self._text(err):
            return None
        if valid:
            v = self._number(value, lo, hi)
            return None if v is None else (v, True, err)
        if value is not None:  # invalid rows are written with a NULL score
            return None
        return (float("nan"), False, err)

    def _flag_bad(self, n: int) -> None:
        if n:
            self._n_bad += n
            warnings.warn(f"score cache {self.path or ':memory:'}: ignored {n} malformed row(s) (non-finite, "
                          "out-of-range or wrong-type values); they are re-scored and overwritten", RuntimeWarning,
                          stacklevel=3)

    @property
    def n_bad_rows(self) -> int:
        """Rows read from this cache that failed validation (and were re-scored)."""
        return self._n_bad

    def _select(self, table: str, cols: str, keys: list[str]):
        try:
            for s in range(0, len(keys), 500):
                chunk = keys[s:s + 500]
                q = f"SELECT {cols} FROM {table} WHERE key IN ({','.join('?' * len(chunk))})"
                yield from self._db.execute(q, chunk)
        except sqlite3.DatabaseError as exc:
            raise CacheFileError(self.path, f"cannot be read ({exc})") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "ScoreCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------------------- scalar scores
    def get_scores(self, keys: list[str]) -> dict[str, tuple[float, bool, str | None]]:
        """``{key: (score, valid, error)}`` for the keys present."""
        lo, hi = self._range or (-_MAX_ABS, _MAX_ABS)
        return self._get_values("scores", "score", keys, max(lo, -_MAX_ABS), min(hi, _MAX_ABS))

    def put_scores(self, rows: list[tuple[str, float, bool, str | None]]) -> None:
        self._put_values("scores", rows)

    # --------------------------------------------------------------------------- pairwise judgements
    def get_pairs(self, keys: list[str]) -> dict[str, tuple[float, bool, str | None]]:
        """``{key: (P(a preferred), valid, error)}`` for the keys present."""
        return self._get_values("pairs", "prob_a", keys, 0.0, 1.0)

    def put_pairs(self, rows: list[tuple[str, float, bool, str | None]]) -> None:
        self._put_values("pairs", rows)

    def _get_values(self, table: str, column: str, keys: list[str], lo: float,
                    hi: float) -> dict[str, tuple[float, bool, str | None]]:
        """Rows of a (key, value, valid, error) table; a row that fails :meth:`_row`'s checks is left out and
        counted (:meth:`_flag_bad`)."""
        out: dict[str, tuple[float, bool, str | None]] = {}
        bad = 0
        with self._lock:
            for k, x, valid, err in self._select(table, f"key, {column}, valid, error", keys):
                row = self._row(x, valid, err, lo, hi)
                if row is None:
                    bad += 1
                else:
                    out[k] = row
        self._flag_bad(bad)
        return out

    def _put_values(self, table: str, rows: list[tuple[str, float, bool, str | None]]) -> None:
        """A value is stored only when valid and finite (NULL otherwise: never a stand-in number)."""
        with self._lock:
            self._db.executemany(
                f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?)",
                [(k, x if (v and math.isfinite(x)) else None, int(bool(v)), e) for k, x, v, e in rows])
            self._db.commit()

    def get_verdicts(self, keys: list[str]) -> dict[str, tuple[str | None, str | None]]:
        out: dict[str, tuple[str | None, str | None]] = {}
        bad = 0
        with self._lock:
            for k, v, err in self._select("verdicts", "key, verdict, error", keys):
                if not (self._text(v) and self._text(err)) or (v is None and err is None):
                    bad += 1
                else:
                    out[k] = (v, err)
        self._flag_bad(bad)
        return out

    def put_verdicts(self, rows: list[tuple[str, str | None, str | None]]) -> None:
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", rows)
            self._db.commit()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {t: int(self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                    for t in ("scores", "pairs", "verdicts")}
