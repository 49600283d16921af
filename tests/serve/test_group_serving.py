"""A served ``GroupReward``: a request carries whole groups (ids in each sample's metadata), the dynamic batcher
never splits a request nor merges it with another (the reward is ``batch_relative``), so remote group rewards equal
a direct call on the same groups."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rewardkit.testing import random_images


def test_served_group_reward_keeps_each_requests_groups_whole(tiny_clip_dir):
    from rewardkit import GroupReward, load_reward
    from rewardkit.client import RemoteReward
    from rewardkit.server import ServerConfig, serve_in_thread

    g = GroupReward(load_reward("pickscore", model=str(tiny_clip_dir), device="cpu"), mode="rank", group_by="uid")
    handle = serve_in_thread(g, ServerConfig(max_batch=64, max_wait_ms=50.0))
    try:
        remote = RemoteReward(url=handle.url)
        images = random_images(8, seed=4)
        # two requests, each with two whole groups of two, sent at once: a merge would not change the groups
        # (ids differ) but a split would leave groups of one (NaN)
        metas = [[{"uid": f"r{r}g{k // 2}"} for k in range(4)] for r in range(2)]
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda r: remote(images[4 * r:4 * r + 4], "a cube", metadata=metas[r]), range(2)))
        for r, out in enumerate(outs):
            want = g(images[4 * r:4 * r + 4], "a cube", metadata=metas[r])
            assert out.valid.all() and torch.allclose(out.scores, want.scores)
            assert sorted(out.scores.tolist()) == pytest.approx([0.0, 0.0, 1.0, 1.0])
    finally:
        handle.stop()
