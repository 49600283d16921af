"""docs/integrations.md, verl-omni: the multi-reward configuration the page documents, read from the page and run
through a transcription of verl-omni's ``MultiVisualRewardManager`` (tests/helpers/verl_omni.py, verl-project/
verl-omni @ a1139baf, ``reward_loop/reward_manager/multi.py``) with the documented ``my_reward.py`` (a tiny
PickScore), one sample per call as the manager calls it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers.verl_omni import MultiVisualRewardManager

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
GOOD = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
#: a uint8 image the reward cannot score (aspect ratio 300 past rewardkit's bound of 200): NaN + the reason
STRIP = torch.zeros((3, 1, 300), dtype=torch.uint8)


def _documented_entries() -> dict[str, dict[str, str]]:
    """``reward.reward_functions`` as the page's command line sets it (Hydra ``+key=value`` overrides)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### verl-omni's multi-reward manager"):]
    block = section[section.index("```bash"):section.index("```", section.index("```bash") + 7)]
    entries: dict[str, dict[str, str]] = {}
    for key, field, value in re.findall(r"\+reward\.reward_functions\.(\w+)\.(\w+)=(\S+)", block):
        entries.setdefault(key, {})[field] = value
    assert "reward.reward_manager.name=MultiVisualRewardManager" in block
    return entries


def _module(tmp_path: Path, clip_dir: Path, **policy) -> Path:
    """The documented my_reward.py, with the tiny checkpoint for the model and ``policy`` (nan_policy ...)."""
    extra = "".join(f", {k}={v!r}" for k, v in policy.items())
    path = tmp_path / f"my_reward_{len(list(tmp_path.glob('my_reward_*.py')))}.py"
    path.write_text("from rewardkit.integrations.verl import verl_compute_score\n"
                    f"compute_score = verl_compute_score('pickscore', model={str(clip_dir)!r}, device='cpu', "
                    f"micro_batch=32, max_wait_s=0.02{extra})\n", encoding="utf-8")
    return path


def _manager(entries, module: Path, **override) -> MultiVisualRewardManager:
    return MultiVisualRewardManager({k: {**e, "path": str(module), **override} for k, e in entries.items()})


def _call(manager, image, prompt="a cat"):
    return manager.run_single(data_source="t2i", solution_image=image, ground_truth=prompt, extra_info={})


def test_documented_config_stops_the_step_instead_of_a_made_up_zero(tmp_path, tiny_clip_dir):
    """The documented entry (`required=true`, the default `nan_policy="raise"`): a sample the reward cannot score
    stops the step with the reason; a good sample gets its score, weighted. The same entry without `required`
    (verl-omni's default) turns the error into a reward of exactly 0.0, which is what the page warns about.
    Bugs caught: the page's config losing `required=true` (the first assertion then sees 0.0), the adapter
    returning a value for an unscorable sample, the documented field names not being the manager's."""
    from rewardkit.integrations import NonFiniteRewardError
    from rewardkit.integrations.verl import verl_compute_score

    entries = _documented_entries()
    assert entries == {"pickscore": {"path": "my_reward.py", "name": "compute_score", "weight": "1.0",
                                     "required": "true"}}
    module = _module(tmp_path, tiny_clip_dir)
    honest = _manager(entries, module)
    with pytest.raises(RuntimeError, match="Required sub-reward 'pickscore' failed") as err:
        _call(honest, STRIP)
    assert isinstance(err.value.__cause__, NonFiniteRewardError) and "aspect ratio 300" in str(err.value)
    direct = verl_compute_score("pickscore", model=str(tiny_clip_dir), device="cpu")(solution_image=GOOD,
                                                                                       ground_truth="a cat")
    out = _call(honest, GOOD)
    assert out["reward_score"] == pytest.approx(direct["score"]) and direct["score"] != 0.0
    assert out["reward_extra_info"]["reward/pickscore/valid"] == 1.0
    # verl-omni's default (no `required`): the error becomes a reward of 0.0, as the page says
    lenient = _manager({k: {f: v for f, v in e.items() if f != "required"} for k, e in entries.items()}, module)
    assert _call(lenient, STRIP)["reward_score"] == 0.0


def test_documented_fill_policy_reports_the_invalid_sample(tmp_path, tiny_clip_dir):
    """The page's other option: `nan_policy="fill"` with a chosen `fill_value` (-7.5 here, weight 2.0 from an
    override): the sample gets weight x fill = -15.0 and `reward/pickscore/valid` = 0.0 in the manager's logs;
    another error (no prompt anywhere: `ground_truth` is not a string) still stops the step under `required`."""
    entries = _documented_entries()
    manager = _manager(entries, _module(tmp_path, tiny_clip_dir, nan_policy="fill", fill_value=-7.5), weight="2.0")
    out = _call(manager, STRIP)
    assert out["reward_score"] == -15.0 and out["reward_extra_info"]["reward/pickscore/valid"] == 0.0
    assert out["reward_extra_info"]["reward/pickscore"] == -7.5
    with pytest.raises(RuntimeError, match="no prompt for this sample"):
        _call(manager, GOOD, prompt=None)
