"""A group spread over 2 gloo processes (flow_grpo / DiffusionNFT's K-repeat sampler) gets the same group rewards
as one process scoring all of it: ``multi_score`` completes the groups with one all-gather."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

WORKER = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import torch
    sys.path.insert(0, os.environ["ROOT"])
    from tests.helpers.pairwise_judges import QualityJudge, solid
    from rewardkit import GroupReward, distributed, load_reward
    from rewardkit.integrations.flow_grpo import multi_score
    from rewardkit.rewards.unifiedreward import UnifiedReward

    assert distributed.init_from_env("gloo")
    r = distributed.rank()
    QS = [0.1, 0.6, 0.3, 0.8, 0.5, 0.2, 0.9, 0.4]
    PROMPTS = ["a", "b"] * 4
    mine = list(range(r * 4, r * 4 + 4))            # each group of 4 is spread over both processes
    ims = solid([QS[i] for i in mine])
    pixels = torch.stack([torch.from_numpy(np.array(im, dtype=np.float32)).permute(2, 0, 1) / 255
                          for im in ims])
    judge = GroupReward(UnifiedReward(judge=QualityJudge(bias=0.1), template="2.0", reencode="none",
                                      both_orders=False))
    pick = GroupReward(load_reward("pickscore", model=os.environ["CLIP"], device="cpu"), mode="rank")
    out = {}
    for name, g in (("judge", judge), ("rank", pick)):
        fn = multi_score("cpu", {name: 1.0}, rewards={name: g})
        got, _ = fn(pixels, tuple(PROMPTS[i] for i in mine), tuple({} for _ in mine))
        out[name] = got[name].tolist()
    json.dump(out, open(os.environ["OUT"] + str(r), "w"))
    torch.distributed.destroy_process_group()
''')


@pytest.mark.slow
@pytest.mark.distributed
def test_a_group_split_over_two_gloo_processes_equals_one_process(tmp_path, tiny_clip_dir):
    import numpy as np
    import torch

    from rewardkit import GroupReward, load_reward
    from rewardkit.integrations.flow_grpo import multi_score
    from rewardkit.rewards.unifiedreward import UnifiedReward
    from tests.helpers.gloo import run_two_gloo_workers
    from tests.helpers.pairwise_judges import QualityJudge, solid

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ROOT=root, OUT=str(tmp_path / "out"), CLIP=str(tiny_clip_dir), OMP_NUM_THREADS="1")
    run_two_gloo_workers(script, env)  # the 2 ranks torchrun would start, without its agent (tests/helpers/gloo.py)
    got = [json.loads((tmp_path / f"out{r}").read_text()) for r in (0, 1)]
    qs = [0.1, 0.6, 0.3, 0.8, 0.5, 0.2, 0.9, 0.4]
    prompts = ("a", "b") * 4
    ims = solid(qs)
    pixels = torch.stack([torch.from_numpy(np.array(im, dtype=np.float32)).permute(2, 0, 1) / 255
                          for im in ims])
    judge = GroupReward(UnifiedReward(judge=QualityJudge(bias=0.1), template="2.0", reencode="none",
                                      both_orders=False))
    pick = GroupReward(load_reward("pickscore", model=str(tiny_clip_dir), device="cpu"), mode="rank")
    for name, g in (("judge", judge), ("rank", pick)):
        one, _ = multi_score("cpu", {name: 1.0}, rewards={name: g})(pixels, prompts, tuple({} for _ in qs))
        assert got[0][name] + got[1][name] == pytest.approx(one[name].tolist(), abs=1e-6)
        # groups of 4 (not the per-process halves of 2): each group's ranks are 0, 1/3, 2/3, 1 / win rates sum to 2
        assert sum(one[name][0::2]) == pytest.approx(2.0, abs=1e-5)
