"""More examples of the Composition page (api/compose.md): loaded by scripts/api_examples.py."""

# two rewards without a model, so that the values are exact
_REWARDS = '''\
class Brightness(Reward):
    "Mean pixel value in [0, 1]."
    name = "brightness"
    tasks = frozenset({"t2i"})
    uses_prompt = False

    def _score(self, batch):
        return RewardOutput(scores=torch.tensor([np.asarray(im, np.float32).mean() / 255 for im in batch.images]))

class Darkness(Brightness):
    name = "darkness"

    def _score(self, batch):
        return RewardOutput(scores=1 - super()._score(batch).scores)
'''

EXAMPLES = [(
    "A weighted sum, a z-scored composite and a group-relative reward of your own rewards",
    '''\
import numpy as np
import torch
from rewardkit import Reward, RewardOutput
from rewardkit.compose.composite import AxisScores, AxisSpec, Composite, WeightedSum, build_composite
from rewardkit.compose.group import GroupReward, group_keys_of

''' + _REWARDS + '''
images = [np.full((4, 4, 3), v, np.uint8) for v in (51, 102, 153, 204)]       # brightness 0.2, 0.4, 0.6, 0.8
mine = {"bright": Brightness(), "dark": Darkness()}
ws = WeightedSum(axes=[{"name": "bright"}, {"name": "dark", "weight": 0.5}], rewards=mine)
print([round(s, 4) for s in ws(images).scores.tolist()])                     # b + 0.5 (1 - b)
comp = Composite(axes=[{"name": "bright"}], rewards={"bright": Brightness()})  # z-scored over the call
print([round(s, 3) for s in comp(images).scores.tolist()])                   # (b - 0.5) / (0.2236 + 1e-4)
print(isinstance(comp.axes[0], AxisSpec), comp.axes[0].weight)
parts = comp.axis_scores(images)                                             # the formula's inputs, no statistic
print(isinstance(parts, AxisScores), [round(s, 2) for s in parts.raw["bright"].tolist()])
yaml_like = {"axes": [{"name": "jpeg", "reward": "jpeg-compressibility"}], "normalize": "none"}
print(build_composite(yaml_like).axes[0].reward)                             # from a mapping or a YAML file
group = GroupReward(Brightness(), mode="rank")                               # rank within each prompt's images
prompts = ["a cat", "a cat", "a dog", "a dog"]
print(group(images, prompts).scores.tolist(), group_keys_of(prompts, None, "prompt"))
''',
    '''\
[0.6, 0.7, 0.8, 0.9]
[-1.341, -0.447, 0.447, 1.341]
True 1.0
True [0.2, 0.4, 0.6, 0.8]
jpeg-compressibility
[0.0, 1.0, 0.0, 1.0] ['a cat', 'a cat', 'a dog', 'a dog']
'''), (
    "The group math and the composition functions, by hand",
    '''\
import torch
from rewardkit.compose.functions import additive_penalty, group_zscore, intent_gate
from rewardkit.compose.group_math import (all_pairs, bt_probs, group_index, group_rank, group_zscore_host,
                                          normalised_rank, sample_pairs, winrates)

x = torch.tensor([1.0, 3.0, 5.0, 5.0])
keys = ["a", "a", "b", "b"]
print(group_index(keys), all_pairs([0, 1, 2]))
print(normalised_rank(torch.tensor([3.0, 1.0, 2.0, 2.0])).tolist())           # ties share their average rank
print(group_rank(x, keys).tolist(), [round(v, 4) for v in group_zscore_host(x, keys).tolist()])
print(group_zscore(x, keys).tolist())                                         # a group without spread: 0
p = bt_probs(torch.tensor([0.0, 1.0, 2.0]), all_pairs([0, 1, 2]))            # sigmoid(v_i - v_j)
print([round(v, 4) for v in p.tolist()])
win, n = winrates(3, all_pairs([0, 1, 2]), p)
print([round(v, 4) for v in win.tolist()], n.tolist())
print(len(sample_pairs(list(range(10)), max_pairs=20)), len(sample_pairs([0, 1, 2], max_pairs=20)))
print(intent_gate(["strict", "open", None]).tolist())
print(additive_penalty(torch.tensor([1.0, 1.0]), torch.tensor([False, True]), penalty=2.0).tolist())
''',
    '''\
{'a': [0, 1], 'b': [2, 3]} [(0, 1), (0, 2), (1, 2)]
[1.0, 0.0, 0.5, 0.5]
[0.0, 1.0, 0.5, 0.5] [-0.9999, 0.9999, 0.0, 0.0]
[-1.0, 1.0, 0.0, 0.0]
[0.2689, 0.1192, 0.2689]
[0.1941, 0.5, 0.8059] [2, 2, 2]
20 3
[1.0, 0.0, 0.0]
[1.0, -1.0]
'''), (
    "Rubrics: a question tree, a judge's answers and the score",
    '''\
import numpy as np
import torch
from rewardkit.compose.rubric import (Question, QuestionTree, RubricCache, answer_trees, parse_intent,
                                     parse_question_list, tree_score, unanswered, yes_no_conversation)
from rewardkit.judges.base import JudgeBackend

tree = parse_question_list('[{"id": "q1", "question": "Is there a cat?"}, '
                           '{"id": "q2", "question": "Is the cat black?", "parents": ["q1"]}]')
print([(q.id, q.parents) for q in tree.questions], isinstance(tree.questions[0], Question))
print(parse_intent("Strict - the prompt names exact counts"), parse_intent("**Open**"))

class CatJudge(JudgeBackend):
    "Yes to 'Is there a cat?' (0.9), No to everything else (0.2)."
    def generate(self, conversations, **kw):
        return [["Yes"] for _ in conversations]

    def choice_probs(self, conversations, choices):
        texts = [conv[-1]["content"][-1]["text"] for conv in conversations]
        return torch.tensor([[0.9, 0.1] if "Is there a cat" in t else [0.2, 0.8] for t in texts])

image = np.zeros((8, 8, 3), np.uint8)
print(len(yes_no_conversation([image], "Is there a cat?")[0]["content"]))          # the image, then the question
probs = answer_trees(CatJudge(), [image], [tree], question_format="{question}", system=None)
print({k: round(v, 2) for k, v in probs[0].items()})                               # q2 asked: q1 was a yes
print(tree_score(tree, {"q1": True, "q2": False}), tree_score(tree, {"q1": False, "q2": None}))
print([q.id for q in unanswered(tree, {"q1": 0.9, "q2": float("nan")})])
cache = RubricCache()                                                              # in memory; a path: JSONL
print("a black cat" in cache, len(cache), isinstance(tree, QuestionTree))
''',
    '''\
[('q1', ()), ('q2', ('q1',))] True
strict open
2
{'q1': 0.9, 'q2': 0.2}
0.5 0.0
['q2']
False 0 True
'''),
]

EXAMPLES += [(
    "Generating question trees and intent labels with a judge",
    '''\
from rewardkit.compose.rubric import classify_intents, generate_trees
from rewardkit.judges import load_template
from rewardkit.judges.base import JudgeBackend

class Scripted(JudgeBackend):
    "Answers by a script: questions and the label 'strict' for the zebra prompt, nothing usable for the other."
    def generate(self, conversations, **kw):
        texts = [" ".join(p["text"] for p in conv[-1]["content"] if p["type"] == "text") for conv in conversations]
        return [["Strict"] if "zebra" in t and t.startswith("Classify the intent") else
                ['["Is there a zebra?", "Is the zebra on a beach?"]'] if "zebra" in t else ["I cannot say"]
                for t in texts]

    def choice_probs(self, conversations, choices):
        raise NotImplementedError

template = load_template("rubric", "constraints")          # the published generator and classifier prompts
cache = generate_trees(Scripted(), ["a zebra on a beach", "a quokka"], template)
print([q.text for q in cache.tree("a zebra on a beach").questions])
print(cache.tree("a quokka"), cache.get("a quokka")["error"] is not None)   # no made-up questions: none, and why
cache = classify_intents(Scripted(), ["a zebra on a beach", "a quokka"], template, cache=cache)
print(cache.get("a zebra on a beach")["intent"], cache.get("a quokka")["intent"])
''',
    '''\
['Is there a zebra?', 'Is the zebra on a beach?']
None True
strict None
'''),
]

EXAMPLES += [(
    "A LoRA soup: the exact average of two adapters' deltas, by hand",
    '''\
import json
import tempfile
from pathlib import Path

import safetensors.torch
import torch
from rewardkit.compose.soup import (LoraAdapter, lora_soup, match_module, merge_into_checkpoint, read_adapter,
                                    save_soup_adapter, soup_deltas, soup_extras)

root = Path(tempfile.mkdtemp())
def adapter(name, r, alpha, A, B):                 # a peft adapter folder, written by hand
    (root / name).mkdir()
    (root / name / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": alpha,
                                                                 "target_modules": ["q"]}))
    safetensors.torch.save_file({"base_model.model.q.lora_A.weight": torch.tensor(A),
                                 "base_model.model.q.lora_B.weight": torch.tensor(B)},
                                str(root / name / "adapter_model.safetensors"))
    return root / name

a = adapter("a", 1, 2, [[1.0, 2.0]], [[3.0], [4.0]])          # s = alpha / r = 2: dW = 2 B A
b = adapter("b", 1, 1, [[1.0, 0.0]], [[0.0], [1.0]])          # s = 1:             dW = B A
ada, adb = read_adapter(a), read_adapter(b)
print(isinstance(ada, LoraAdapter), ada.scaling)
q = "base_model.model.q"                                       # peft's module name
dw = soup_deltas([ada, adb])[q]                                # 1/2 (2 B_a A_a) + 1/2 (B_b A_b)
print(dw.tolist())
print(soup_extras([ada, adb], [0.5, 0.5]))                     # no trainable-token rows, no modules_to_save
out = save_soup_adapter([ada, adb], root / "soup")             # one rank-concatenated adapter, scaling 1
again = read_adapter(out)
print(torch.allclose(again.B[q] @ again.A[q] * again.scaling[q], dw))
(root / "base").mkdir()
safetensors.torch.save_file({"model.q.weight": torch.zeros(2, 2)}, str(root / "base" / "model.safetensors"))
print(match_module(q, ["model.q", "model.k"]))                # the base checkpoint's module it names
merged = merge_into_checkpoint({q: dw}, root / "base", root / "merged")
print(safetensors.torch.load_file(str(merged / "model.safetensors"))["model.q.weight"].tolist())   # 0 + dW
print(lora_soup([a, b], root / "merged2", base=root / "base").name)   # the same in one call
''',
    '''\
True {'base_model.model.q': 2.0}
[[3.0, 6.0], [4.5, 8.0]]
({}, {})
True
model.q
[[3.0, 6.0], [4.5, 8.0]]
merged2
'''),
]

EXAMPLES += [(
    'Souping two LoRA preference models: heads averaged, adapters exactly',
    '''\
import json
import tempfile
from pathlib import Path

import safetensors.torch
import torch
from rewardkit.compose.soup import read_adapter, soup_preference_models

root = Path(tempfile.mkdtemp())
def preference_model(name, B, head_w, head_b):     # the folder `rewardkit train preference` (lora.enabled) writes
    d = root / name
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 1, "lora_alpha": 1, "target_modules": ["q"]}))
    safetensors.torch.save_file({"base_model.model.q.lora_A.weight": torch.tensor([[1.0, 0.0]]),
                                 "base_model.model.q.lora_B.weight": torch.tensor(B)},
                                str(d / "adapter" / "adapter_model.safetensors"))
    safetensors.torch.save_file({"w": torch.tensor(head_w), "b": torch.tensor(head_b)}, str(d / "head.safetensors"))
    (d / "processor").mkdir()
    (d / "processor" / "tokenizer.json").write_text("{}")
    (d / "preference_config.json").write_text(json.dumps({"format": "rewardkit-preference", "weights": "lora",
                                                          "head": "linear", "base_model": "tiny"}))
    return d

a = preference_model("a", [[2.0], [0.0]], [[1.0, 2.0]], [1.0])
b = preference_model("b", [[0.0], [4.0]], [[3.0, 6.0]], [5.0])
out = soup_preference_models([a, b], root / "soup", weights=[0.25, 0.75])     # the weights must sum to 1
head = safetensors.torch.load_file(str(out / "head.safetensors"))
print(head["w"].tolist(), head["b"].tolist())              # 0.25 * a + 0.75 * b, parameter by parameter
ad = read_adapter(out / "adapter")
q = "base_model.model.q"
print((ad.B[q] @ ad.A[q] * ad.scaling[q]).tolist())        # 0.25 B_a A_a + 0.75 B_b A_b, exactly
print(sorted(p.name for p in out.iterdir()), json.loads((out / "soup.json").read_text())["weights"])
''',
    '''\
[[2.5, 5.0]] [4.0]
[[0.5, 0.0], [3.0, 0.0]]
['adapter', 'head.safetensors', 'preference_config.json', 'processor', 'soup.json'] [0.25, 0.75]
'''),
]
