"""Every registered reward passes the conformance checks on its tiny, offline instance."""

from __future__ import annotations

import pytest

from rewardkit.conformance import CHECKS
from rewardkit.registry import get_reward_class, list_rewards

_instances: dict[str, object] = {}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    def _get(name: str):
        if name not in _instances:
            cls = get_reward_class(name)
            _instances[name] = cls.tiny(str(tmp_path_factory.mktemp(f"conf-{name}")))
        return _instances[name]

    return _get


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", list_rewards())
def test_conformance(name, check, build):
    reward = build(name)
    assert reward.name == name or name in getattr(reward, "aliases", ()), \
        f"registry name {name!r} but reward.name {reward.name!r}"
    CHECKS[check](reward)


def test_every_reward_has_a_tiny_instance():
    from rewardkit.reward import Reward

    missing = [n for n in list_rewards() if get_reward_class(n).tiny.__func__ is Reward.tiny.__func__]
    assert not missing, f"rewards without a tiny() test instance: {missing}"


def test_thread_safety_call_sizes_follow_what_the_reward_declares():
    """``check_thread_safety``: a ``thread_safe`` reward gets 8 reference + 8 x 16 concurrent calls of 2 samples
    (a short and a long prompt: the tokenizer race of issue 9); a serialised one 8 + 8 calls of one sample,
    short and long prompts alternating (only its plumbing runs concurrently: shorter scoring leaves more calls
    inside each other's); a ``batch_relative`` one keeps 2 samples per call (one sample has no statistics)."""
    import threading

    import numpy as np
    import torch

    from rewardkit.conformance import check_thread_safety
    from rewardkit.reward import Reward, RewardOutput

    class Spy(Reward):
        name = "spy"
        tasks = frozenset({"t2i"})

        def __init__(self, **kw):
            super().__init__(**kw)
            self.seen, self._seen_lock = [], threading.Lock()

        def _score(self, batch):
            with self._seen_lock:
                self.seen.append(tuple(len(p) > 200 for p in batch.prompts))
            return RewardOutput(scores=torch.tensor([np.asarray(im, np.float32).mean() for im in batch.images]))

    class SafeSpy(Spy):
        thread_safe = True

    class RelativeSpy(Spy):
        batch_relative = True

    serial, safe, relative = Spy(), SafeSpy(), RelativeSpy()
    for r in (serial, safe, relative):
        check_thread_safety(r)
    assert len(serial.seen) == 16 and sorted(set(serial.seen)) == [(False,), (True,)]
    assert serial.seen[:8] == [(i % 2 == 1,) for i in range(8)]          # the reference calls, in order
    assert len(safe.seen) == 8 + 8 * 16 and all(sorted(s) == [False, True] for s in safe.seen)
    assert len(relative.seen) == 16 and all(sorted(s) == [False, True] for s in relative.seen)
