"""Examples of the Integrations API page (api/integrations.md): loaded by scripts/api_examples.py."""

# a reward without a model, so that the values are exact: the mean pixel value, NaN + a reason on a black image
_BRIGHTNESS = '''\
class Brightness(Reward):
    "Mean pixel value in [0, 1]; a black image is NaN + a reason."
    name = "brightness"
    tasks = frozenset({"t2i"})
    uses_prompt = False

    def _score(self, batch):
        means = [float(np.asarray(im, dtype=np.float32).mean()) / 255 for im in batch.images]
        valid = [m > 0 for m in means]
        return RewardOutput(scores=torch.tensor([m if ok else float("nan") for m, ok in zip(means, valid)]),
                            valid=torch.tensor(valid), errors=[None if ok else "black image" for ok in valid])
'''

EXAMPLES = [(
    "flow_grpo / DiffusionNFT: multi_score and a per-reward scorer",
    '''\
import numpy as np
import torch
from rewardkit import Reward, RewardOutput
from rewardkit.integrations.flow_grpo import (FLOW_GRPO_CONVENTIONS, Convention, flow_grpo_factory,
                                              flow_grpo_scorer, multi_score)

''' + _BRIGHTNESS + '''
images = torch.stack([torch.full((3, 8, 8), 0.2), torch.full((3, 8, 8), 0.6)])  # float NCHW in [0, 1], as flow_grpo
reward_fn = multi_score("cpu", {"bright": 1.0, "also_bright": 0.5},
                        rewards={"bright": Brightness(), "also_bright": Brightness()})
scores, info = reward_fn(images, ("a cat", "a dog"), ({}, {}))
print({k: [round(v, 4) for v in s.tolist()] for k, s in scores.items()})  # "avg": flow_grpo's weighted SUM
scorer = flow_grpo_scorer(Brightness(), nan_policy="fill", fill_value=-1.0)
values, report = scorer(torch.stack([torch.zeros(3, 8, 8), images[1]]), ("a cat", "a dog"), ({}, {}))
print([round(v, 4) for v in values.tolist()], report["valid_fraction"], report["invalid"])
print(flow_grpo_factory("pickscore").__name__)       # for flow_grpo's score_functions table (built lazily)
c = FLOW_GRPO_CONVENTIONS["pickscore"]               # flow_grpo's scale for a name it knows
print(isinstance(c, Convention), dict(c.kwargs), c.source)
''',
    '''\
{'bright': [0.2, 0.6], 'also_bright': [0.2, 0.6], 'avg': [0.3, 0.9]}
[-1.0, 0.6] 0.5 {0: 'black image'}
rewardkit_pickscore
True {'scale': 0.038461538461538464} pickscore_scorer.py:46-50
'''), (
    "TRL, verl-omni and DDPO reward functions",
    '''\
import asyncio

import numpy as np
import torch
from PIL import Image
from rewardkit import Reward, RewardOutput
from rewardkit.integrations.ddpo import ddpo_reward_fn
from rewardkit.integrations.trl import AsyncTRLRewardFunction, TRLRewardFunction, message_text, trl_reward_func
from rewardkit.integrations.verl import VerlComputeScore, verl_compute_score

''' + _BRIGHTNESS + '''
grey, black = Image.new("RGB", (8, 8), (51, 51, 51)), Image.new("RGB", (8, 8), (0, 0, 0))
completions = [[{"role": "assistant", "content": "a grey square"}], [{"role": "assistant", "content": "night"}]]
print(message_text(completions[0]))                                  # the text a completion is scored against
fn = trl_reward_func(Brightness(), nan_policy="mask")     # GRPOTrainer(reward_funcs=[fn]); None: TRL skips it
values = fn(prompts=["p", "p"], completions=completions, image=[grey, black])
print(fn.__name__, isinstance(fn, TRLRewardFunction), [round(v, 4) if v is not None else v for v in values])
afn = trl_reward_func(Brightness(), nan_policy="fill", fill_value=0.0, is_async=True)
print(isinstance(afn, AsyncTRLRewardFunction), asyncio.run(afn(prompts=["p"], completions=["x"], image=[black])))

compute_score = verl_compute_score(Brightness())                      # verl-omni's custom_reward_function
chw = torch.full((3, 8, 8), 51, dtype=torch.uint8)                    # uint8 CHW, as verl-omni passes it
out = compute_score(solution_image=chw, extra_info={"prompt": "grey"})
print(isinstance(compute_score, VerlComputeScore), round(out["score"], 4), out["valid"])

reward_fn = ddpo_reward_fn(Brightness())                              # DDPOTrainer(config, reward_fn, ...)
rewards, meta = reward_fn(torch.full((2, 3, 8, 8), 0.2), ("a", "b"), ({}, {}))
print(rewards, meta["valid_fraction"])
try:
    ddpo_reward_fn(Brightness(), alignprop=True)(torch.full((1, 3, 8, 8), 0.2), ("a",), ({},))
except TypeError as exc:
    print("TypeError:", str(exc).split(" w.r.t.")[0])
''',
    '''\
a grey square
brightness True [0.2, None]
True [0.0]
True 0.2 1.0
tensor([0.2000, 0.2000]) 1.0
TypeError: AlignProp back-propagates the reward into the images, but reward 'brightness' is not differentiable
'''),
]
