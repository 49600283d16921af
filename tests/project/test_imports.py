"""`import rewardkit` stays light: no heavy ML library is imported until a reward needs it.

One subprocess checks every stage (the package, the public API and registry, the bench modules, the judge
modules), recording ``sys.modules`` after each: one interpreter start instead of four.
"""

import json
import subprocess
import sys

import pytest

HEAVY = ["transformers", "diffusers", "trl", "peft", "vllm", "datasets", "accelerate", "scipy", "matplotlib"]

STAGES = {
    "package": "import rewardkit",
    "api": ("from rewardkit import Reward, RewardOutput, load_reward, list_rewards\n"
            "list_rewards()\nimport rewardkit.cli\nrewardkit.cli.build_parser()\n"
            "from rewardkit.registry import get_reward_class\n[get_reward_class(n) for n in list_rewards()]"),
    "bench": ("import rewardkit.bench, rewardkit.bench.harness, rewardkit.bench.data, rewardkit.bench.report, "
              "rewardkit.bench.synthetic, rewardkit.commands.bench"),
    "judges": ("import rewardkit.judges, rewardkit.judges.transformers_backend, rewardkit.judges.openai_backend, "
               "rewardkit.judges.vllm_backend, rewardkit.rewards.evr"),
    "datasets": ("import rewardkit.datasets, rewardkit.datasets.scoring, rewardkit.datasets.filtering, "
                 "rewardkit.datasets.expr, rewardkit.datasets.parrot, rewardkit.datasets.ray_engine, "
                 "rewardkit.integrations.ray, rewardkit.commands.filter"),
}
# what each stage must not have imported (cumulative: every stage runs after the previous ones)
FORBIDDEN = {
    "package": HEAVY + ["torch"],          # even torch waits until the contract is touched
    "api": HEAVY,
    "bench": ["transformers", "diffusers", "trl", "peft", "vllm", "datasets", "matplotlib"],
    "judges": ["transformers", "vllm", "httpx", "diffusers", "trl", "peft", "datasets"],
    "datasets": ["ray", "pyarrow", "pandas", "datasets", "transformers"],
}


@pytest.mark.slow
def test_imports_stay_light():
    code = "import json, sys\nseen = {}\n"
    for name, stmt in STAGES.items():
        code += f"{stmt}\nseen[{name!r}] = sorted(m.split('.')[0] for m in sys.modules)\n"
    code += "print(json.dumps(seen))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for stage, bad in FORBIDDEN.items():
        loaded = sorted(set(bad) & set(seen[stage]))
        assert not loaded, f"after {stage!r}: {loaded} imported"
