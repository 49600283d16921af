"""`rewardkit rl nft` with a reward name rewardkit refuses (flow_grpo's / DiffusionNFT's host names it cannot
score): exit 2 (as every config error) with the registry's reason, before the rl extra is checked or anything
loads; it said "unknown reward 'deqa'" and listed the known rewards, without the reason."""

from __future__ import annotations

import sys
import types

import pytest

from rewardkit.cli import main


@pytest.fixture
def nothing_loads(monkeypatch):
    """The trainer (which builds the rewards first thing) and the rl extra are never reached."""
    def built(*a, **k):
        raise AssertionError("the trainer ran: the reward name was not checked first")

    trainer = types.ModuleType("rewardkit.rl.trainer")
    trainer.train_nft = built
    monkeypatch.setitem(sys.modules, "rewardkit.rl.trainer", trainer)
    monkeypatch.setitem(sys.modules, "diffusers", None)  # the missing extra would be exit 2 with another message


# what each host name is refused for (docs/integrations.md's flow_grpo table, written out here by hand)
REASONS = {"deqa": "trust_remote_code=True", "video_ocr": "scores videos", "image_similarity": "no rewardkit counterpart",
           "seedscore": "Seed-VL service"}


@pytest.mark.parametrize("name", ["deqa", "video_ocr", "image-similarity", "SeedScore"])
def test_rl_nft_names_the_reason_a_reward_name_is_refused(nothing_loads, capsys, name):
    assert main(["rl", "nft", "--config", "recipes/nft/tiny.yaml", f"rewards={{{name}: 1.0}}"]) == 2
    err = capsys.readouterr().err
    assert f"rewardkit rl: error: reward {name!r} is refused: " in err
    assert REASONS[name.lower().replace("-", "_")] in err
    assert "unknown reward" not in err and "diffusers" not in err


def test_rl_nft_an_unknown_name_is_still_unknown_with_suggestions(nothing_loads, capsys):
    assert main(["rl", "nft", "--config", "recipes/nft/tiny.yaml", "rewards={pickscor: 1.0}"]) == 2
    err = capsys.readouterr().err
    assert "unknown reward 'pickscor'. Did you mean 'pickscore'" in err and "refused" not in err


def test_the_flow_grpo_drop_in_refuses_the_same_names_with_the_same_reasons():
    """One table: the drop-in's refusals are the registry's (it had its own copy)."""
    from rewardkit.integrations.flow_grpo import _NOT_IN_REWARDKIT
    from rewardkit.registry import REFUSED, refusal_reason

    assert _NOT_IN_REWARDKIT is REFUSED
    assert {k: v for k, v in REASONS.items() if v not in REFUSED[k]} == {}
    assert refusal_reason("Video-OCR") == REFUSED["video_ocr"] and refusal_reason("pickscore") is None
