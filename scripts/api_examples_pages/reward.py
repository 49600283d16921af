"""More examples of the Reward contract page (api/reward.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "A reward of your own: its config, the batch it gets, the output it returns, the errors",
    '''\
from dataclasses import dataclass

import numpy as np
import torch
import rewardkit
from rewardkit.errors import (ConfigError, MissingDependencyError, RegistryError, RewardInputError, RewardkitError,
                              UsageError)
from rewardkit.registry import conflicts, get_reward_class, register_reward
from rewardkit.reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput

@dataclass
class GammaConfig(RewardConfig):
    gamma: float = 1.0

class Gamma(Reward):
    "Mean pixel value in [0, 1], to the power gamma."
    name = "gamma-demo"
    tasks = frozenset({"t2i"})
    uses_prompt = False
    score_range = (0.0, 1.0)
    Config = GammaConfig

    def _score(self, batch: RewardBatch) -> RewardOutput:   # valid samples only, as RGB PIL images
        print("batch:", len(batch.images), batch.images[0].mode, batch.indices)
        means = torch.tensor([np.asarray(im, np.float32).mean() / 255 for im in batch.images])
        return RewardOutput(scores=means ** self.config.gamma)

register_reward("gamma-demo", Gamma)              # or an entry point in your package: rewardkit.rewards
print(get_reward_class("gamma-demo") is Gamma, conflicts())
reward = rewardkit.load_reward("gamma-demo", gamma=2.0)
grey = np.full((4, 4, 3), 51, np.uint8)
out = reward([grey, b"junk", grey], on_error="nan")               # the bad sample never reaches _score
print([round(v, 4) for v in out.scores.tolist()], out.valid.tolist(), out.errors[1])
print(out.records()[1]["valid"], sorted(out.records()[0]))
pair = reward.compare([grey], [np.full((4, 4, 3), 153, np.uint8)])
print(isinstance(pair, PairwiseOutput), pair.prob_a.shape)
try:
    reward([b"junk"])
except RewardInputError as exc:
    print("RewardInputError at", exc.index)
try:
    rewardkit.load_reward("gamma-demo", gama=2.0)
except ConfigError as exc:
    print("ConfigError:", str(exc).split(";")[0])
print(str(MissingDependencyError("pytesseract", "ocr")))
print(all(issubclass(e, RewardkitError) for e in (ConfigError, MissingDependencyError, RegistryError,
                                                    RewardInputError)), issubclass(UsageError, RewardkitError))
''',
    '''\
True {}
batch: 2 RGB [0, 2]
[0.04, nan, 0.04] [True, False, True] bytes is not a recognised image format
False ['error', 'score', 'valid']
batch: 2 RGB [0, 1]
True torch.Size([1])
RewardInputError at 0
ConfigError: unknown GammaConfig key(s): gama (did you mean gamma?)
'pytesseract' is not installed. Install it with:
    pip install 'rewardkit-vision[ocr]'
True False
'''),
]
