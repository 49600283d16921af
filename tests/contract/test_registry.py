from __future__ import annotations

import sys
import types
from importlib import metadata

import pytest

from rewardkit import registry
from rewardkit.errors import RegistryError
from rewardkit.reward import Reward, RewardOutput


class Dummy(Reward):
    name = "dummy-plugin"

    def _score(self, batch):
        return RewardOutput(scores=[0.0] * len(batch))


@pytest.fixture
def fresh_registry(monkeypatch):
    registry._reset()
    monkeypatch.setattr(registry, "_programmatic", {})
    yield
    registry._reset()


def _fake_eps(monkeypatch, entries):
    mod = types.ModuleType("fake_plugin_mod")
    mod.Dummy = Dummy
    monkeypatch.setitem(sys.modules, "fake_plugin_mod", mod)
    eps = [metadata.EntryPoint(name=n, value=v, group=registry.ENTRY_POINT_GROUP) for n, v in entries]
    monkeypatch.setattr(registry.importlib_metadata, "entry_points", lambda group=None: eps)


def test_builtins_listed_and_loadable():
    names = registry.list_rewards()
    assert {"clipscore", "pickscore"} <= set(names)
    assert registry.get_reward_class("clip").name == "clipscore"  # alias
    assert registry.resolve_name("PickScore") == "pickscore"


def test_unknown_name_suggests_closest():
    with pytest.raises(RegistryError) as info:
        registry.load_reward("pickscor")
    assert "Did you mean 'pickscore'" in str(info.value)
    with pytest.raises(RegistryError, match="Did you mean 'clipscore'"):
        registry.load_reward("clipscroe")


def test_entry_point_plugin(monkeypatch, fresh_registry):
    _fake_eps(monkeypatch, [("dummy-plugin", "fake_plugin_mod:Dummy")])
    assert "dummy-plugin" in registry.list_rewards()
    r = registry.load_reward("dummy-plugin")
    assert isinstance(r, Dummy) and r(["x.png"], "p", on_error="nan").errors[0].startswith("file not found")


def test_two_entries_claiming_one_name_is_an_error(monkeypatch, fresh_registry):
    _fake_eps(monkeypatch, [("dummy-plugin", "fake_plugin_mod:Dummy"), ("dummy-plugin", "other:Thing")])
    with pytest.raises(RegistryError, match="claimed by several entries"):
        registry.load_reward("dummy-plugin")


def test_plugin_cannot_shadow_builtin(monkeypatch, fresh_registry):
    _fake_eps(monkeypatch, [("pickscore", "fake_plugin_mod:Dummy")])
    with pytest.raises(RegistryError, match="claimed by several entries"):
        registry.get_reward_class("pickscore")


def test_register_reward_programmatically(fresh_registry):
    registry.register_reward("dummy-plugin", Dummy)
    assert registry.get_reward_class("dummy-plugin") is Dummy
    with pytest.raises(RegistryError, match="already registered"):
        registry.register_reward("clipscore", Dummy)


def test_ls_metadata_table_matches_the_classes():
    """`rewardkit ls` reads built-ins from the generated `_reward_meta.py`; it must equal what the classes say.
    On failure: python -m rewardkit.commands.ls --regenerate"""
    from rewardkit._reward_meta import META
    from rewardkit.commands.ls import builtin_metadata

    assert META == builtin_metadata(), "stale rewardkit/_reward_meta.py: python -m rewardkit.commands.ls --regenerate"


def test_ls_imports_no_reward_module_and_no_torch():
    import subprocess

    code = ("import sys; from rewardkit.cli import main; rc = main(['ls', '--json']); "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('rewardkit.rewards')); "
            "assert rc == 0 and not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert '"name": "hpsv3"' in res.stdout


def test_ls_describes_a_runtime_registered_class_by_importing_it(fresh_registry):
    from rewardkit.commands.ls import describe_rewards

    class Described(Reward):
        """A reward registered at run time."""
        name, tasks, dimensions, extras = "described", ("edit",), ("a", "b"), ()

        def _score(self, batch):  # pragma: no cover - never called
            raise AssertionError

    mod = types.ModuleType("rk_test_described")
    mod.Described = Described
    sys.modules["rk_test_described"] = mod
    try:
        registry.register_reward("described", "rk_test_described:Described")
        row = {r["name"]: r for r in describe_rewards()}["described"]
    finally:
        del sys.modules["rk_test_described"]
    assert row["tasks"] == ["edit"] and row["dimensions"] == ["a", "b"] and row["installed"] is True
    assert row["summary"] == "A reward registered at run time."
