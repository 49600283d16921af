"""What a reward's weights ARE, not where they lie: the one content fingerprint every resumable thing keys on.

Dataset scoring (``rewardkit score --dataset``), the bench score cache, PARROT stage records and RL resume
decide whether old results may be reused by comparing fingerprints. Keying on the ``--model`` string would
silently mix two models when new weights appear at the same path (a ``latest/`` folder, a moved symlink);
keying on the content refuses that, and accepts an equal checkpoint copied to another path.

- :func:`file_digest`: BLAKE2b-128 of a file's bytes (all of them: safetensors headers alone would miss a
  retrained tensor of the same shape), memoised by ``(resolved path, size, mtime_ns, ctime_ns, inode)``.
  A file replaced (new inode), rewritten (new mtime / ctime) or resized is hashed again; the ctime cannot be
  set back by a program (``os.utime`` sets the mtime only), so even an in-place rewrite that restores the
  mtime is seen. The memo lives in this process and, with ``memo_dir``, in ``memo_dir/file-digests.json``
  (:func:`default_memo_dir`), so a multi-GB checkpoint is hashed once per version (0.37 GiB/s measured on
  one core of the shared 2-core development machine; 0.2 ms for a memoised file), not once per run.
- :func:`content_config`: a configuration with every string that names a local file or folder (also the path
  part of a judge spec ``transformers:/path``) replaced by ``content:<digest>``; a hub id cached locally
  becomes ``<id>@<snapshot commit>``. Hash this instead of the configuration: same weights, same key.
- :func:`content_identity`: ``{resolved path: digest}`` of the same strings (what changed, for messages).

Standard library only (``huggingface_hub`` is asked, lazily, for a cached hub snapshot's commit; no network).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

__all__ = ["file_digest", "file_digests", "dir_digest", "content_config", "content_identity", "default_memo_dir",
           "config_fingerprint", "content_changes"]

_DIGESTS: dict[tuple, str] = {}  # (resolved path, size, mtime_ns, ctime_ns, inode) -> digest, this process
_DIGEST_LOCK = threading.Lock()
_MEMO_FILE = "file-digests.json"
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
#: configuration keys naming a file the reward writes as its own memo of a judge's answers (already keyed by
#: judge and template inside): growing during a run, they are not part of the weights' identity
MEMO_KEYS = frozenset({"applicability_cache"})


def default_memo_dir() -> Path:
    """``$REWARDKIT_CACHE/fingerprints``, else ``$XDG_CACHE_HOME/rewardkit/fingerprints``, else
    ``~/.cache/rewardkit/fingerprints``."""
    if os.environ.get("REWARDKIT_CACHE"):
        return Path(os.environ["REWARDKIT_CACHE"]) / "fingerprints"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rewardkit" / "fingerprints"


def _load_memo(memo_dir: str | Path | None) -> dict[str, Any]:
    if memo_dir is None:
        return {}
    try:
        data = json.loads((Path(memo_dir).expanduser() / _MEMO_FILE).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_memo(memo_dir: str | Path | None, memo: dict[str, Any]) -> None:
    if memo_dir is None:
        return
    d = Path(memo_dir).expanduser()
    try:  # best effort (a read-only cache folder only costs hashing again): write then rename, never half a file
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{_MEMO_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(memo), encoding="utf-8")
        os.replace(tmp, d / _MEMO_FILE)
    except OSError:
        pass


def file_digest(path: str | Path, memo: dict[str, Any] | None = None) -> str:
    """BLAKE2b of a file's bytes, memoised by (resolved path, size, mtime_ns, ctime_ns, inode): a file replaced
    or rewritten (even with the same size and its old mtime) is hashed again."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    with _DIGEST_LOCK:
        hit = _DIGESTS.get(key)
    if hit is None and memo is not None:
        rec = memo.get(str(p))
        if isinstance(rec, list) and len(rec) == 5 and tuple(rec[:4]) == key[1:]:
            hit = str(rec[4])
    if hit is None:
        h = hashlib.blake2b(digest_size=16)
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 22)
                if not b:
                    break
                h.update(b)
        hit = h.hexdigest()
    with _DIGEST_LOCK:
        _DIGESTS[key] = hit
    if memo is not None:
        memo[str(p)] = [*key[1:], hit]
    return hit


def dir_files(root: Path) -> list[tuple[str, Path]]:
    """``(relative posix name, path)`` of every file under ``root``, sorted, hidden entries skipped, **symlinked
    subfolders followed** (a model folder assembled from links to other folders: their weights are content
    too), each real folder once (a link cycle ends there)."""
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = Path(dirpath)
        for name in filenames:
            f = base / name
            if not name.startswith(".") and f.is_file():
                out.append((f.relative_to(root).as_posix(), f))
    return sorted(out)


def dir_digest(root: str | Path, memo: dict[str, Any] | None = None) -> str:
    """Digest of a folder: its files' relative names and :func:`file_digest` (where it lies does not count)."""
    h = hashlib.blake2b(digest_size=16)
    for rel, f in dir_files(Path(root)):
        h.update(f"{rel}\x1f{file_digest(f, memo)}\x1e".encode())
    return h.hexdigest()


def _hub_snapshot(repo_id: str) -> str | None:
    """The commit of the locally cached snapshot a hub id resolves to (``main``), or None (not cached, no
    ``huggingface_hub``): a model updated in the cache under the same id gives another key. No network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for fname in ("config.json", "model_index.json", "open_clip_config.json"):
        try:
            hit = try_to_load_from_cache(repo_id, fname)
        except Exception:  # noqa: BLE001 - an id the hub library refuses is simply not a cached model
            return None
        if isinstance(hit, str):
            parts = Path(hit).parts
            if "snapshots" in parts and parts.index("snapshots") + 1 < len(parts):
                return parts[parts.index("snapshots") + 1]
    return None


def _local(s: str) -> Path | None:
    if not s.strip() or s.strip() in (".", "..") or len(s) >= 4096:
        return None
    try:
        p = Path(s).expanduser()
        return p if p.exists() else None
    except (OSError, ValueError):
        return None


def _string_content(s: str, memo: dict[str, Any], found: dict[str, str]) -> str | None:
    """``content:<digest>`` for a string naming a local file / folder (or ``backend:<that>`` for a judge spec),
    ``<id>@<commit>`` for a locally cached hub id, else None (the string stands for itself)."""
    cands = [("", s)]
    if ":" in s and not s.startswith(("http://", "https://")):
        cands.append((s.split(":", 1)[0] + ":", s.split(":", 1)[1]))
    for prefix, cand in cands:
        p = _local(cand)
        if p is None:
            continue
        try:
            digest = file_digest(p, memo) if p.is_file() else dir_digest(p, memo)
        except OSError:
            continue
        found[str(p.resolve())] = digest
        return f"{prefix}content:{digest}"
    if _HUB_ID.fullmatch(s) and not os.path.exists(s):
        commit = _hub_snapshot(s)
        if commit is not None:
            found[f"hub:{s}"] = commit
            return f"{s}@{commit}"
    return None


def _walk(x: Any, memo: dict[str, Any], found: dict[str, str]) -> Any:
    if isinstance(x, dict):
        return {k: (v if k in MEMO_KEYS else _walk(v, memo, found)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_walk(v, memo, found) for v in x]
    if isinstance(x, str):
        c = _string_content(x, memo, found)
        return x if c is None else c
    return x


def _memoised(memo_dir: str | Path | None, fn: Any) -> Any:
    """``fn(memo)`` with the digest memo of ``memo_dir`` loaded, and written back when ``fn`` added to it."""
    memo = _load_memo(memo_dir)
    before = dict(memo)
    out = fn(memo)
    if memo != before:
        _save_memo(memo_dir, memo)
    return out


def file_digests(paths: Any, memo_dir: str | Path | None = None) -> list[str]:
    """:func:`file_digest` of each of ``paths``, in order, memoised in ``memo_dir`` (None: this process only)."""
    return _memoised(memo_dir, lambda memo: [file_digest(f, memo) for f in paths])


def _run(config: Any, memo_dir: str | Path | None) -> tuple[Any, dict[str, str]]:
    found: dict[str, str] = {}
    return _memoised(memo_dir, lambda memo: _walk(config, memo, found)), found


def content_config(config: Any, memo_dir: str | Path | None = None) -> Any:
    """``config`` (nested dicts / lists) with every string naming a local file or folder replaced by
    ``content:<digest>`` (a judge spec ``backend:/path`` by ``backend:content:<digest>``), a locally cached hub
    id by ``<id>@<commit>``; other values as they are. A reward's own answer memo (``applicability_cache``) is
    left as written. Two configurations differing only in where equal weights lie give equal results."""
    return _run(config, memo_dir)[0]


def content_identity(config: Any, memo_dir: str | Path | None = None) -> dict[str, str]:
    """``{resolved path: digest}`` (``hub:<id>``: the cached snapshot's commit) for every string of ``config``
    that :func:`content_config` replaces."""
    return _run(config, memo_dir)[1]


def config_fingerprint(config: Any, memo_dir: str | Path | None = None, digest_size: int = 8) -> str:
    """Hex BLAKE2b of :func:`content_config` (JSON, keys sorted): equal for equal weights at any path."""
    blob = json.dumps(content_config(config, memo_dir), sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=digest_size).hexdigest()


def content_changes(old: Any, new: Any, where: str = "") -> list[str]:
    """Dotted names whose content differs between two :func:`content_config` results (``[]`` when ``old`` is
    None: a record written before content was kept is not checked). Only values that are content on either
    side count (``content:`` / ``@commit``): a path string changed with equal content is no change."""
    if old is None:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new))
                for c in content_changes(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in content_changes(a, b, f"{where}[{i}]")]

    def is_content(v: Any) -> bool:
        return isinstance(v, str) and ("content:" in v or bool(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", v)))

    return [where or "(root)"] if (is_content(old) or is_content(new)) and old != new else []
