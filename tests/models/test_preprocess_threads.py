"""Per-image pre-processing on a few threads (rewardkit._threads): the same results as one thread, in order,
errors raised as in a loop, the size from REWARDKIT_PREPROCESS_THREADS, and a pool that works in a forked
child (a DataLoader worker) instead of waiting forever on threads that did not survive the fork."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

import pytest
import torch

from rewardkit import _threads


def test_results_in_order_on_the_pool(monkeypatch):
    monkeypatch.setenv("REWARDKIT_PREPROCESS_THREADS", "3")
    names = set()

    def f(x):
        names.add(threading.current_thread().name)
        time.sleep(0.001)  # the runs overlap (a pool thread done already would take the next run)
        return x * x

    assert _threads.map_images(f, range(50)) == [x * x for x in range(50)]
    # one contiguous run per thread: the caller's and two of the pool's
    assert threading.current_thread().name in names
    assert len([n for n in names if n.startswith("rewardkit-preprocess")]) == 2
    names.clear()
    assert _threads.map_images(f, [7]) == [49]  # one item: on the calling thread
    assert names == {threading.current_thread().name}


def test_one_thread_runs_on_the_caller(monkeypatch):
    monkeypatch.setenv("REWARDKIT_PREPROCESS_THREADS", "1")
    seen = []
    assert _threads.map_images(lambda x: seen.append(threading.current_thread().name) or x, [1, 2, 3]) == [1, 2, 3]
    assert set(seen) == {threading.current_thread().name}


def test_the_first_error_in_item_order_is_raised_after_every_run_ends(monkeypatch):
    monkeypatch.setenv("REWARDKIT_PREPROCESS_THREADS", "3")
    done = []

    def f(x):
        if x in (4, 8):  # one error in the pool's first run, one in its second
            raise KeyError(f"item {x}")
        done.append(x)
        return x

    with pytest.raises(KeyError, match="item 4"):
        _threads.map_images(f, range(9))
    # runs [0, 1, 2], [3, 4, 5], [6, 7, 8]: each stops at its error, and all have stopped when it is raised
    assert sorted(done) == [0, 1, 2, 3, 6, 7]

    def g(x):
        if x == 1:
            raise ValueError("caller's run")
        return x

    with pytest.raises(ValueError, match="caller's run"):
        _threads.map_images(g, range(9))


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_thread_count_is_refused(monkeypatch, bad):
    monkeypatch.setenv("REWARDKIT_PREPROCESS_THREADS", bad)
    with pytest.raises(ValueError, match="REWARDKIT_PREPROCESS_THREADS"):
        _threads.map_images(str, [1, 2])


def test_default_is_the_usable_cpus_at_most_8(monkeypatch):
    monkeypatch.delenv("REWARDKIT_PREPROCESS_THREADS", raising=False)
    n = _threads.preprocess_threads()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert n == max(1, min(8, usable))


def _child(q):
    q.put(_threads.map_images(lambda x: x + 1, range(8)))


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_gets_a_pool_of_its_own(monkeypatch):
    monkeypatch.setenv("REWARDKIT_PREPROCESS_THREADS", "2")
    assert _threads.map_images(lambda x: x, range(4)) == [0, 1, 2, 3]  # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(30)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive, "the forked child waited on its parent's pool threads"
    assert p.exitcode == 0 and q.get(timeout=5) == list(range(1, 9))


@pytest.mark.parametrize("threads", ["1", "4"])
def test_batched_pixel_values_equal_the_processor_on_any_thread_count(monkeypatch, threads, tiny_clip_dir):
    """The pixel paths that resize on the pool (Qwen-VL and CLIP) still equal transformers' PIL processors bit
    for bit, whatever the thread count: mixed sizes, resized up, down and not at all."""
    import transformers

    from rewardkit.models.pil_pixels import clip_pil_pixel_values, pil_pixel_values
    from rewardkit.testing import TINY_KINDS, random_images

    monkeypatch.setenv("REWARDKIT_PREPROCESS_THREADS", threads)
    ims = random_images(6, sizes=[(32, 32), (40, 64), (64, 40), (33, 47), (96, 24), (56, 56)], seed=5)
    ip = transformers.AutoProcessor.from_pretrained(tiny_clip_dir).image_processor
    assert torch.equal(clip_pil_pixel_values(ims, ip), ip(images=ims, return_tensors="pt")["pixel_values"])
    qip = TINY_KINDS["qwen2_5_vl"]()[1].image_processor
    got, ref = pil_pixel_values(ims, qip), qip(images=ims, return_tensors="pt")
    assert torch.equal(got["pixel_values"], ref["pixel_values"])
    assert torch.equal(got["image_grid_thw"], ref["image_grid_thw"])
