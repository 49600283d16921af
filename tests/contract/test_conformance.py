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
