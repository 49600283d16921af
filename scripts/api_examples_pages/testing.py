"""More examples of the Testing kit page (api/testing.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "Each conformance check alone, and a reward that breaks one",
    '''\
import numpy as np
import torch
from rewardkit import Reward, RewardOutput
from rewardkit.conformance import (check_bad_sample_isolated, check_chunking, check_compare, check_config_pickle,
                                   check_deterministic, check_empty_batch, check_input_kinds, check_output_contract,
                                   check_tensor_batch, check_thread_safety, sample_inputs)

class Brightness(Reward):
    "Mean pixel value in [0, 1]."
    name = "brightness"
    tasks = frozenset({"t2i"})
    uses_prompt = False

    def _score(self, batch):
        return RewardOutput(scores=torch.tensor([np.asarray(im, np.float32).mean() / 255 for im in batch.images]))

class Noisy(Brightness):
    "Adds fresh noise to every score: not deterministic."
    def _score(self, batch):
        out = super()._score(batch)
        return RewardOutput(scores=out.scores + torch.rand(len(out.scores)))

x = sample_inputs(Brightness(), n=4)                  # deterministic images and prompts for the reward's tasks
print(len(x["images"]), x["images"][0].size, x["sources"])
reward = Brightness()
print(check_output_contract(reward).scores.shape)
for check in (check_deterministic, check_chunking, check_input_kinds, check_tensor_batch, check_thread_safety,
              check_config_pickle, check_bad_sample_isolated, check_empty_batch, check_compare):
    check(reward)                                     # each raises AssertionError on a failure
print("all passed")
try:
    check_deterministic(Noisy())
except AssertionError as exc:
    print("AssertionError:", str(exc).split(":")[0])
''',
    '''\
4 (32, 32) None
torch.Size([4])
all passed
AssertionError: two identical calls (scores)
'''), (
    "The tiny models: real classes, random weights, written like real checkpoints",
    '''\
import tempfile
from pathlib import Path

from rewardkit.testing import (build_tiny_tokenizer, random_images, save_tiny_checkpoint, tiny_clip, tiny_qwen2_5_vl,
                               tiny_qwen3_vl)

print([im.size for im in random_images(2, size=16)], random_images(1)[0].tobytes() == random_images(1)[0].tobytes())
tok = build_tiny_tokenizer()                          # a byte-level BPE trained in-process; Yes / No are one token
print(tok.convert_ids_to_tokens(tok("Yes", add_special_tokens=False).input_ids))
for build in (tiny_clip, tiny_qwen2_5_vl, tiny_qwen3_vl):
    model, processor = build()
    print(type(model).__name__, sum(p.numel() for p in model.parameters()) < 2_000_000)
folder = save_tiny_checkpoint("clip", Path(tempfile.mkdtemp()) / "tiny-clip")
print(sorted(p.name for p in folder.iterdir() if p.suffix in (".json", ".safetensors"))[:3])
''',
    '''\
[(16, 16), (16, 16)] True
['Yes']
CLIPModel True
Qwen2_5_VLForConditionalGeneration True
Qwen3VLForConditionalGeneration True
['config.json', 'model.safetensors', 'processor_config.json']
'''), (
    "A tiny checkpoint for vLLM",
    '''\
# needs a CUDA GPU and the vllm extra: not run by the test suite
from rewardkit.judges import load_judge
from rewardkit.testing import save_tiny_vllm_checkpoint

path = save_tiny_vllm_checkpoint("/tmp/tiny-vllm-qwen", dtype="bfloat16")   # head size 64, as vLLM's kernels need
judge = load_judge(f"vllm:{path}", gpu_memory_utilization=0.2)
''',
    ""),
]
