"""Runnable examples for the API reference pages (issue 40, item 7): scripts/docs_hooks.py appends each page's
examples, with their output, under "Examples"; tests/docs/test_api_examples.py runs every one and checks that it
prints exactly the output shown. Each example is self-contained and offline (tiny models from
`rewardkit.testing`, written to a temporary folder) and runs in seconds. The examples of the longer pages live in
scripts/api_examples_pages/<page>.py (``EXAMPLES``, the same triples), appended here to api/<page>.md's. An example
whose code says ``# needs ...`` (a CUDA GPU, say) is shown without output and not run; its output is "".

Nothing here is part of the package."""

from __future__ import annotations

# API page -> [(title, code, the exact output it prints)]
API_EXAMPLES: dict[str, list[tuple[str, str, str]]] = {
    "api/reward.md": [(
        "Scoring a batch, a bad sample included",
        '''\
import tempfile

import numpy as np
import rewardkit
from rewardkit.testing import save_tiny_checkpoint

model = save_tiny_checkpoint("clip", tempfile.mkdtemp() + "/tiny-clip")  # random weights: a real CLIP class
reward = rewardkit.load_reward("clipscore", model=str(model), convention="cosine")
red = np.full((64, 64, 3), (200, 30, 30), dtype=np.uint8)
out = reward([red, red, b"not an image"], "a red square", on_error="nan")
print(out.scores.shape, out.scores.dtype, out.valid.tolist())
print(out.scores[0] == out.scores[1], out.errors[2])
print(reward.name, sorted(reward.tasks), reward.higher_is_better, reward.score_range)
''',
        '''\
torch.Size([3]) torch.float32 [True, True, False]
tensor(True) bytes is not a recognised image format
clipscore ['t2i'] True (-1.0, 1.0)
'''),
    ],
    "api/registry.md": [(
        "Names, aliases and plugins",
        '''\
import rewardkit
from rewardkit.registry import resolve_name

print(resolve_name("HPS"), resolve_name("clip-score"), resolve_name("arena_rm"))
print("pickscore" in rewardkit.list_rewards(), "hps" in rewardkit.list_rewards(include_aliases=True))
try:
    rewardkit.load_reward("pickscor")
except Exception as exc:
    print(type(exc).__name__, str(exc).split(" Known")[0])
''',
        '''\
hpsv2 clipscore preference
True True
RegistryError unknown reward 'pickscor'. Did you mean 'pickscore', 'pick-score', 'clipscore'?
'''),
    ],
    "api/rewards.md": [(
        "PickScore is logit_scale.exp() times the cosine of CLIP's embeddings",
        """\
import tempfile

import numpy as np
import torch
import rewardkit
from rewardkit.testing import save_tiny_checkpoint

model = str(save_tiny_checkpoint("clip", tempfile.mkdtemp() + "/tiny-clip"))
image = np.full((64, 64, 3), (30, 160, 60), dtype=np.uint8)
pick = rewardkit.load_reward("pickscore", model=model)
cos = rewardkit.load_reward("clipscore", model=model, convention="cosine")
scale = pick.backbone.logit_scale            # the checkpoint's logit_scale.exp()
print(torch.allclose(pick([image], "a green square").scores, scale * cos([image], "a green square").scores))
print(rewardkit.load_reward("clipscore", model=model).config.convention)  # Hessel et al.: 2.5 * max(cos, 0)
""",
        """\
True
hessel
"""),
    ],
    "api/compose.md": [(
        "The pure composition functions",
        """\
import torch
from rewardkit.compose.functions import combine, veto, zscore

pref = torch.tensor([1.0, 2.0, 3.0, 4.0])
z = zscore(pref)                              # per-batch z-score (population std)
print([round(v, 4) for v in z.tolist()])
fired = torch.tensor([False, False, False, True])
print([round(v, 4) for v in veto(z, fired).tolist()])  # a fired detector removes the positive part
print(combine([torch.tensor([1.0, 2.0]), torch.tensor([10.0, 0.0])], [0.5, 0.1]).tolist())
""",
        """\
[-1.3416, -0.4472, 0.4472, 1.3416]
[-1.3416, -0.4472, 0.4472, 0.0]
[1.5, 1.0]
"""),
    ],
    "api/bench.md": [(
        "Pairwise accuracy without ties, by hand",
        """\
from rewardkit.bench.metrics import accuracy_without_ties

human = [1, 1, -1, 0]                 # A better, A better, B better, a tie (left out)
model = [0.3, -0.2, -1.5, 0.7]        # the reward's margins score(A) - score(B)
m = accuracy_without_ties(human, model)
print(m.value, m.n)                   # 2 of the 3 untied pairs agree
""",
        """\
0.6666666666666666 3
"""),
    ],
    "api/train.md": [(
        "The Bradley–Terry loss is -log sigmoid(r_w - r_l)",
        """\
import math

import torch
from rewardkit.train.losses import bradley_terry_loss

r_w, r_l = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.5])
loss = bradley_terry_loss(r_w, r_l)
by_hand = (-math.log(1 / (1 + math.exp(-1.0))) - math.log(1 / (1 + math.exp(1.0)))) / 2
print(round(loss.item(), 6), round(by_hand, 6))
""",
        """\
0.813262 0.813262
"""),
    ],
    "api/rl.md": [(
        "The flow-matching schedule and the EMA decay",
        """\
from rewardkit.rl.schedule import ema_decay, flow_sigmas

print([round(s, 4) for s in flow_sigmas(4, shift=3.0).tolist()])  # SD3's shifted sigmas, 1 -> 0
print([round(ema_decay(step), 3) for step in (0, 10, 100, 1000)])
""",
        """\
[1.0, 0.8577, 0.6022, 0.0089, 0.0]
[0.1, 0.55, 0.9, 0.9]
"""),
    ],
    "api/view.md": [(
        "A report of a score file",
        """\
import json
import tempfile
from pathlib import Path

from PIL import Image
from rewardkit.view import build_report

folder = Path(tempfile.mkdtemp())
Image.new("RGB", (64, 64), (200, 30, 30)).save(folder / "red.png")
row = {"image": str(folder / "red.png"), "prompt": "a red square", "score": 0.9, "valid": True, "error": None}
(folder / "scores.jsonl").write_text(json.dumps(row) + "\\n")
page = build_report([folder / "scores.jsonl"], folder / "report.html")
print(page.name, "<script type=\\"application/json\\" id=\\"rk-data\\">" in page.read_text())
""",
        """\
report.html True
"""),
    ],
    "api/testing.md": [(
        "A reward of your own through the conformance checks",
        """\
import numpy as np
from rewardkit import Reward, RewardOutput
from rewardkit.conformance import check_reward

class Brightness(Reward):
    'Mean pixel value in [0, 1].'
    name = "brightness"
    tasks = frozenset({"t2i"})
    uses_prompt = False

    def _score(self, batch):
        import torch
        return RewardOutput(scores=torch.tensor([np.asarray(im, dtype=np.float32).mean() / 255 for im in batch.images]))

check_reward(Brightness())   # shape, dtype, determinism, chunking, PIL == uint8 == float, threads, pickling, ...
print(round(Brightness()([np.full((8, 8, 3), 51, np.uint8)], "").scores.item(), 6))  # 51 / 255
""",
        """\
0.2
"""),
    ],
    "api/serve.md": [(
        "A reward server and its client in one process",
        """\
import tempfile

import numpy as np
import torch
import rewardkit
from rewardkit.client import RemoteReward
from rewardkit.server import serve_in_thread
from rewardkit.testing import save_tiny_checkpoint

local = rewardkit.load_reward("pickscore", model=str(save_tiny_checkpoint("clip", tempfile.mkdtemp() + "/c")))
server = serve_in_thread(local)               # 127.0.0.1, an ephemeral port
remote = RemoteReward(url=server.url)
image = np.full((32, 32, 3), 90, dtype=np.uint8)
print(torch.equal(remote([image], "a grey square").scores, local([image], "a grey square").scores))
remote.close()
server.stop()
""",
        """\
True
"""),
    ],
    "api/datasets.md": [(
        "Score a Parquet dataset, keep the best image of each prompt",
        """\
import io
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from rewardkit import Reward, RewardOutput
from rewardkit.datasets.filtering import filter_dataset
from rewardkit.datasets.scoring import score_dataset

class Brightness(Reward):
    'Mean pixel value in [0, 1].'
    name = "brightness"
    tasks = frozenset({"t2i"})
    uses_prompt = False

    def _score(self, batch):
        return RewardOutput(scores=torch.tensor([np.asarray(im, dtype=np.float32).mean() / 255 for im in batch.images]))

def png(level):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (level, level, level)).save(buf, format="PNG")
    return buf.getvalue()

root = Path(tempfile.mkdtemp())
pq.write_table(pa.table({"prompt": ["a cat", "a cat", "a dog", "a dog"], "image": [png(v) for v in (51, 102, 204, 153)]}),
               root / "data.parquet")
score_dataset(Brightness(), root / "data.parquet", root / "scores", progress=False)   # one score file per shard
print([round(s, 2) for s in pq.read_table(root / "scores").column("score").to_pylist()])       # level / 255
filter_dataset(root / "data.parquet", root / "scores", root / "kept", top_k=1, group_by="prompt", progress=False)
kept = pq.read_table(root / "kept")
print(kept.column("prompt").to_pylist(), [Image.open(io.BytesIO(b)).getpixel((0, 0))[0] for b in kept.column("image").to_pylist()])
""",
        """\
[0.2, 0.4, 0.8, 0.6]
['a cat', 'a dog'] [102, 204]
"""),
    ],
}


def _add_page_files() -> None:
    import importlib.util
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parent / "api_examples_pages").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"rk_api_examples_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        API_EXAMPLES.setdefault(f"api/{path.stem}.md", []).extend(mod.EXAMPLES)


_add_page_files()
