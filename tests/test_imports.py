"""`import rewardkit` stays light: no heavy ML library is imported until a reward needs it."""

import subprocess
import sys

HEAVY = ["transformers", "diffusers", "trl", "peft", "vllm", "datasets", "accelerate", "scipy", "matplotlib"]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_rewardkit_is_light():
    mods = _modules_after("import rewardkit")
    assert not [m for m in HEAVY if m in mods]
    assert "torch" not in mods  # even torch waits until the contract is touched


def test_public_api_and_registry_stay_light():
    code = ("import rewardkit\nfrom rewardkit import Reward, RewardOutput, load_reward, list_rewards\n"
            "list_rewards()\nimport rewardkit.cli\nrewardkit.cli.build_parser()\n"
            "from rewardkit.registry import get_reward_class\n[get_reward_class(n) for n in list_rewards()]")
    mods = _modules_after(code)
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]
