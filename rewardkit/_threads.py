"""A few threads for the per-image work of a batch that releases the GIL (PIL's resize): the images of one
call are resized side by side instead of one after the other, the calling thread taking its share.

The pool is shared by the whole process, made on first use and again in a forked child (a pool's threads do
not survive ``fork``: a DataLoader worker would otherwise wait forever). Its size is
``REWARDKIT_PREPROCESS_THREADS`` when set (1: everything on the calling thread), else the CPUs this process may
run on, at most 8. The work and its order are the same as on one thread, so the results are identical.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

__all__ = ["preprocess_threads", "map_images"]

_MAX_DEFAULT = 8
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] | None = None  # (pid, workers) it was made for


def preprocess_threads() -> int:
    """Threads for per-image pre-processing: ``REWARDKIT_PREPROCESS_THREADS`` (a positive integer) or the
    usable CPUs, at most 8."""
    env = os.environ.get("REWARDKIT_PREPROCESS_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"REWARDKIT_PREPROCESS_THREADS must be a positive integer, got {env!r}")
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT, cpus))


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_key
    key = (os.getpid(), workers)
    with _lock:
        if _pool_key != key:
            if _pool is not None and _pool_key is not None and _pool_key[0] == key[0]:
                _pool.shutdown(wait=False)  # resized in this process; a forked child's copy has no threads
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rewardkit-preprocess")
            _pool_key = key
        return _pool


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    return [fn(x) for x in chunk]


def map_images(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]`` with the items cut into one contiguous run per thread: the calling thread
    does the first run, the pool the others (two hand-offs per call, not one per item: a hand-off costs about
    as much as resizing a 64-px image). The first error in item order is raised, as in the loop, once every
    run has finished."""
    items = list(items)
    size = preprocess_threads()
    n = min(size, len(items))
    if n < 2 or threading.current_thread().name.startswith("rewardkit-preprocess"):
        return [fn(x) for x in items]  # (a pool thread never waits on its own pool)
    bounds = [len(items) * k // n for k in range(n + 1)]
    chunks = [items[bounds[k]:bounds[k + 1]] for k in range(n)]
    pool = _get_pool(size - 1)
    futures = [pool.submit(_run_chunk, fn, c) for c in chunks[1:]]
    out: list[Any] = []
    error: BaseException | None = None
    try:
        out.extend(_run_chunk(fn, chunks[0]))
    except BaseException as exc:  # noqa: BLE001 - raised below, after the other runs are done
        error = exc
    for f in futures:
        try:
            part = f.result()
        except BaseException as exc:  # noqa: BLE001
            error = error or exc
            continue
        out.extend(part)
    if error is not None:
        raise error
    return out
