"""On-disk score cache: one SQLite file per (reward, configuration), keyed by content hashes.

Rows are committed after every scored chunk, so an interrupted run resumes where it stopped and a re-run
with a new metric costs nothing. Only numbers, flags and strings are stored (no pickles).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable

__all__ = ["ScoreCache", "default_cache_dir", "reward_fingerprint", "sample_key", "pair_key"]

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


def reward_fingerprint(name: str, cls: str, config: dict[str, Any]) -> str:
    """Hash of what determines a reward's scores: registry name, class and configuration."""
    blob = json.dumps({"name": name, "class": cls, "config": config}, sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def sample_key(image_hash: str, prompt: str | None, source_hashes: Iterable[str]) -> str:
    """Key of one (image, prompt, sources) sample."""
    blob = "\x1f".join([image_hash, prompt if prompt is not None else "\x00", *source_hashes])
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def pair_key(first_hash: str, second_hash: str, prompt: str | None, source_hashes: Iterable[str]) -> str:
    """Key of one ordered comparison (first shown as A)."""
    return sample_key(first_hash + ">" + second_hash, prompt, source_hashes)


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
        # timeout: several processes (a torchrun-sharded bench) write one file; SQLite serialises the writers
        self._db = sqlite3.connect(target, check_same_thread=False, timeout=120.0)
        if self.path is not None:
            # WAL + NORMAL: a commit survives the process being killed (what resuming needs) without an
            # fsync per chunk; only an OS crash can lose the last chunks, which are then simply re-scored.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        if describe is not None:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('reward', ?)", (json.dumps(describe, default=str),))
        self._db.commit()

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
        out: dict[str, tuple[float, bool, str | None]] = {}
        with self._lock:
            for s in range(0, len(keys), 500):
                chunk = keys[s:s + 500]
                q = f"SELECT key, score, valid, error FROM scores WHERE key IN ({','.join('?' * len(chunk))})"
                for k, score, valid, err in self._db.execute(q, chunk):
                    out[k] = (float("nan") if score is None else float(score), bool(valid), err)
        return out

    def put_scores(self, rows: list[tuple[str, float, bool, str | None]]) -> None:
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?)",
                [(k, s if (v and math.isfinite(s)) else None, int(bool(v)), e) for k, s, v, e in rows])
            self._db.commit()

    # --------------------------------------------------------------------------- pairwise judgements
    def get_pairs(self, keys: list[str]) -> dict[str, tuple[float, bool, str | None]]:
        out: dict[str, tuple[float, bool, str | None]] = {}
        with self._lock:
            for s in range(0, len(keys), 500):
                chunk = keys[s:s + 500]
                q = f"SELECT key, prob_a, valid, error FROM pairs WHERE key IN ({','.join('?' * len(chunk))})"
                for k, p, valid, err in self._db.execute(q, chunk):
                    out[k] = (float("nan") if p is None else float(p), bool(valid), err)
        return out

    def put_pairs(self, rows: list[tuple[str, float, bool, str | None]]) -> None:
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO pairs VALUES (?, ?, ?, ?)",
                [(k, p if (v and math.isfinite(p)) else None, int(bool(v)), e) for k, p, v, e in rows])
            self._db.commit()

    def get_verdicts(self, keys: list[str]) -> dict[str, tuple[str | None, str | None]]:
        out: dict[str, tuple[str | None, str | None]] = {}
        with self._lock:
            for s in range(0, len(keys), 500):
                chunk = keys[s:s + 500]
                q = f"SELECT key, verdict, error FROM verdicts WHERE key IN ({','.join('?' * len(chunk))})"
                for k, v, err in self._db.execute(q, chunk):
                    out[k] = (v, err)
        return out

    def put_verdicts(self, rows: list[tuple[str, str | None, str | None]]) -> None:
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", rows)
            self._db.commit()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {t: int(self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                    for t in ("scores", "pairs", "verdicts")}
