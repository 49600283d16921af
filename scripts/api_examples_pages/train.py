"""More examples of the Training page (api/train.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "Tie models, uncertainty losses and the schedule, by hand",
    '''\
import math

import torch
from rewardkit.train.losses import (davidson_loss, davidson_probs, lr_at, pairwise_accuracy, rao_kupper_loss,
                                    rao_kupper_probs, reward_stats, uncertainty_hpsv3_loss, uncertainty_loss,
                                    uncertainty_probit_loss, winner_loser)

r_a, r_b = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0])
labels = torch.tensor([0, 2, 1])                       # A wins, a tie, B wins (rewardkit.train.data's codes)
p_ab, p_ba, p_tie = (t.exp() for t in davidson_probs(r_a, r_b, nu=1.0))
print([round(v, 4) for v in (p_ab + p_ba + p_tie).tolist()])          # each row a distribution over 3 outcomes
# Davidson, equal rewards and nu = 1: P(tie) = nu / (2 + nu) = 1/3
print(round(p_tie[1].item(), 4), round(davidson_loss(r_a, r_b, labels).item(), 4))
lp = rao_kupper_probs(r_a, r_b, theta=2.0)
print(round(sum(t.exp() for t in lp)[0].item(), 4), round(rao_kupper_loss(r_a, r_b, labels).item(), 4))
print(pairwise_accuracy(r_a, r_b, labels))                             # the tie is left out
w, l = winner_loser(r_a[[0, 2]], r_b[[0, 2]], labels[[0, 2]])
print(w.tolist(), l.tolist())
mu_w, mu_l, zero = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0])   # log sigma 0: sigma 1
probit = uncertainty_probit_loss(mu_w, zero, mu_l, zero)
print(round(probit.item(), 4), round(-math.log(0.5 * (1 + math.erf(1 / math.sqrt(2) / math.sqrt(2)))), 4))
hps = uncertainty_hpsv3_loss(mu_w, zero, mu_l, zero, samples=32, seed=0)     # Monte Carlo over sigma's noise
print(bool(torch.isfinite(hps)), torch.equal(uncertainty_loss(mu_w, zero, mu_l, zero, form="probit"), probit))
print([round(lr_at(s, base_lr=1.0, total_steps=10, warmup_steps=2), 3) for s in (0, 1, 2, 6, 9)])
print(reward_stats(torch.tensor([1.0, 2.0, 3.0])))
''',
    '''\
[1.0, 1.0, 1.0]
0.3333 0.8197
1.0 0.7338
(1.0, 2)
[1.0, 3.0] [0.0, 2.0]
0.2741 0.2741
True True
[0.5, 1.0, 1.0, 0.5, 0.038]
{'reward_mean': 2.0, 'reward_std': 0.8164966106414795, 'reward_min': 1.0, 'reward_max': 3.0}
'''), (
    "Preference data: labels, a synthetic set, conversions and the preflight check",
    '''\
import datasets
from rewardkit.train.data import (BadRow, DataRowError, convert_chosen_rejected, normalize_label, preflight_pairs,
                                  synthetic_brightness_pairs)

print([normalize_label(x) for x in ("A", "b", "tie")])
ds = synthetic_brightness_pairs(4, seed=0)             # the brighter image wins
print(len(ds), sorted(ds.column_names))
print(preflight_pairs(ds))                             # every row readable: no BadRow
hf = datasets.Dataset.from_dict({"prompt": ["a cat"], "chosen": ["missing.png"], "rejected": ["also_missing.png"]})
rows = convert_chosen_rejected(hf)
print(rows[0]["image_a"], rows[0]["label"])
bad = preflight_pairs(rows)
print(isinstance(bad[0], BadRow), bad[0].index, bad[0].column, issubclass(DataRowError, Exception))
''',
    '''\
[0, 1, 2]
4 ['image_a', 'image_b', 'label', 'prompt']
[]
missing.png A
True 0 image_a True
'''),
]

EXAMPLES += [(
    "Training a tiny Bradley–Terry reward model on a synthetic task",
    '''\
import tempfile

from rewardkit.train.data import load_pairs
from rewardkit.train.preference_config import DataArgs, LoraArgs, LossArgs, ModelArgs, OptimArgs
from rewardkit.train.trainer import PreferenceTrainer, train_preference

print(DataArgs().train, LossArgs().kind, LoraArgs().enabled, ModelArgs().head, OptimArgs().lr)   # the defaults
pairs, base_dir = load_pairs("synthetic:brightness", synthetic_size=8)      # the brighter image wins
print(len(pairs), pairs[0]["label"])
config = {"model": {"backbone": "tiny:qwen2_5_vl"},    # a real Qwen2.5-VL class, random weights, hidden size 32
          "data": {"train": "synthetic:brightness", "eval": "synthetic:brightness", "synthetic_size": 16},
          "micro_batch_size": 4, "global_batch_size": 4, "max_steps": 2, "eval_batch_size": 16,
          "output_dir": tempfile.mkdtemp()}
summary = train_preference(config)                     # builds a PreferenceTrainer and runs its loop
print(summary["step"], 0 <= summary["eval_accuracy"] <= 1, sorted(summary)[:3])
''',
    '''\
synthetic:brightness bt False linear 1e-05
8 B
2 True ['eval_accuracy', 'eval_loss', 'eval_margin']
'''),
]

EXAMPLES += [(
    "Pick-a-Pic's layout, and the trainer's command line in your own script",
    '''\
import argparse
import contextlib
import io

import datasets
from rewardkit.train.data import convert_pickapic
from rewardkit.train.trainer import add_arguments, run_cli

pickapic = datasets.Dataset.from_dict({"caption": ["a cat", "a dog", "a fox"], "jpg_0": [b"..."] * 3,
                                       "jpg_1": [b"..."] * 3, "label_0": [1.0, 0.0, 0.5], "best_image_uid": [""] * 3})
pairs = convert_pickapic(pickapic)                     # label_0 1 / 0 / 0.5: A / B / tie
print(sorted(pairs.column_names), list(pairs["label"]))

parser = argparse.ArgumentParser(prog="mytrain")       # the trainer's command line inside your own script
add_arguments(parser)
args = parser.parse_args(["--print-config", "--output-dir", "runs/x", "optim.lr=3e-5", "max_steps=10"])
print(args.overrides, args.output_dir)
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    code = run_cli(args)                               # --print-config: the resolved config as YAML, no training
lines = buf.getvalue().splitlines()
print(code, lines[0], [x.strip() for x in lines if x.strip().startswith(("lr:", "max_steps:"))])
''',
    '''\
['image_a', 'image_b', 'label', 'prompt'] ['A', 'B', 'tie']
['optim.lr=3e-5', 'max_steps=10'] runs/x
0 output_dir: runs/x ['lr: 3.0e-05', 'max_steps: 10']
'''),
]

EXAMPLES += [(
    'Collating preference pairs for one forward pass (a tiny model), a bad row skipped',
    '''\
import torch
from rewardkit.models.preference import PreferenceModel
from rewardkit.train.data import PairCollator, synthetic_brightness_pairs

model = PreferenceModel.from_backbone("tiny:qwen2_5_vl")     # a real Qwen2.5-VL class, random weights
rows = list(synthetic_brightness_pairs(3, seed=0))            # PIL images, a prompt, the brighter image wins
rows[0] = {**rows[0], "image_a": rows[0]["image_b"], "image_b": rows[0]["image_a"], "label": "A"}   # swapped
rows[1] = {**rows[1], "image_b": "missing.png"}               # an unreadable row
batch = PairCollator(model, skip_bad=True)(rows)              # [a_1..a_3, b_1..b_3]: one forward pass
print(sorted(batch), batch["inputs"]["input_ids"].shape[0])
# skip_bad (what the trainer uses): the bad row becomes a copy of the first good one, with weight 0
print(batch["keep"].tolist(), batch["weight"].tolist(), batch["skipped"][0].index)
print([r["label"] for r in rows], batch["labels"].tolist())   # A -> 0, B -> 1; row 1 is row 0's copy
with torch.no_grad():
    rewards, _ = model(**batch["inputs"])
print(rewards.shape)                                          # r(a_i) then r(b_i)
''',
    '''\
['inputs', 'keep', 'labels', 'margin', 'skipped', 'weight'] 6
[True, False, True] [1.0, 0.0, 1.0] 1
['A', 'B', 'B'] [0, 0, 1]
torch.Size([6])
'''),
]
