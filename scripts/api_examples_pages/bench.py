"""More examples of the Benchmarks page (api/bench.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "The metrics, by hand: ties, 4-way votes, order swaps, groups, bootstrap intervals",
    '''\
import numpy as np
from rewardkit.bench.metrics import (MetricValue, accuracy_with_ties, accuracy_with_ties_at, accuracy_with_ties_naive,
                                     bootstrap_ci, bootstrap_ratio_ci, bootstrap_ties_ci, bootstrap_weights,
                                     flip_verdict, genaibench_4way, group_accuracy, mmrb2_official,
                                     normalise_4way_verdict, order_agreement, ratio_units, verdict_from_margin)

h = [1, -1, 0, 1]                        # human: A, B, tie, A
m = [0.9, -0.4, 0.05, 0.02]              # the reward's margins score(A) - score(B)
print(accuracy_with_ties_at(h, m, eps=0.1))              # |m| <= 0.1 a predicted tie: all right but the last
best = accuracy_with_ties(h, m)                           # the best threshold, fitted
print(isinstance(best, MetricValue), best.value, accuracy_with_ties_naive(h, m)[0])
print([verdict_from_margin(x) for x in (0.3, -0.1, 0.0, float("nan"))], flip_verdict("A"), flip_verdict("tie"))
votes, verdicts = ["leftvote", "tievote"], ["[[A>B]]", "B>A"]
print(normalise_4way_verdict("[[A=B=Good]] because"), genaibench_4way(votes, verdicts).value)
print(mmrb2_official(["A", "B"], ["A", "A"], ["B", "A"]).value)   # 4 answers, 3 right (the swap flips back)
print(order_agreement(["A", "B", "A"], ["B", "A", "A"]).value)    # the third changed its mind under the swap
print(group_accuracy(["g", "g", "g"], [1, 1, 1], [0.5, 0.2, 0.1]).value)   # every row of the group right
w = bootstrap_weights(n_units=3, n_boot=4, seed=0)
print(w.shape, w.sum(axis=1).tolist())                    # each resample draws 3 units
num, den = ratio_units("accuracy_without_ties", h=h, m=m)
print(num.tolist(), den.tolist())
lo, hi = bootstrap_ratio_ci(num, den, n_boot=200, seed=0)
print(0 <= lo <= hi <= 1, bootstrap_ci(lambda idx: float(np.mean(np.asarray(m)[idx])), 4, n_boot=50) is not None)
print(bootstrap_ties_ci(h, m, n_boot=50, seed=0) is not None)
''',
    '''\
0.75
True 0.75 0.75
['A', 'B', 'tie', None] B tie
A=B=GOOD 0.5
0.75
0.6666666666666666
1.0
(4, 3) [3, 3, 3, 3]
[1.0, 1.0, 0.0, 1.0] [1.0, 1.0, 0.0, 1.0]
True True
True
'''), (
    "Benchmark specs and a GenEval image folder, read and summarised",
    '''\
import json
import tempfile
from pathlib import Path

from PIL import Image
from rewardkit.bench.geneval import (GenEvalFolder, format_summary, read_layout, read_metadata_file, read_results,
                                     summarize, write_results)
from rewardkit.bench.spec import BenchmarkSpec, get_spec, list_benchmarks

print(list_benchmarks()[:3])
spec = get_spec("mmrb2/t2i")
print(isinstance(spec, BenchmarkSpec), spec.task, spec.metrics)

root = Path(tempfile.mkdtemp())                           # GenEval's layout: <index>/metadata.jsonl, samples/*.png
rows = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"}]
(root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
(root / "images" / "00000" / "samples").mkdir(parents=True)
(root / "images" / "00000" / "metadata.jsonl").write_text(json.dumps(rows[0]))
Image.new("RGB", (8, 8)).save(root / "images" / "00000" / "samples" / "0000.png")
folders = read_layout(root / "images", read_metadata_file(root / "metadata.jsonl"))
print(isinstance(folders[0], GenEvalFolder), folders[0].index, [p.name for p in folders[0].images])
records = [{"filename": str(folders[0].images[0]), "tag": "single_object", "metadata": json.dumps(rows[0]),
            "correct": True, "reason": "", "details": {}}]            # what score_layout writes per image
path = write_results(records, root / "results.jsonl")
summary = summarize(read_results(path))
print(summary["images"], summary["overall"])
print(format_summary(summary).rstrip())                   # what GenEval's summary_scores.py prints
''',
    '''\
['editreward/2pair', 'editreward/3pair', 'editreward/4pair']
True t2i ('mmrb2_official', 'accuracy_without_ties', 'accuracy_with_ties')
True 0 ['0000.png']
1 1.0
Summary
=======
Total images: 1
Total prompts: 1
% correct images: 100.00%
% correct prompts: 100.00%

Task breakdown
==============
single_object    = 100.00% (1 / 1)

Overall score (avg. over tasks): 1.00000
'''),
]

EXAMPLES += [(
    "The harness end to end on a synthetic copy of two benchmarks",
    '''\
import tempfile

import numpy as np
import torch
from rewardkit import Reward, RewardOutput
from rewardkit.bench.harness import check_data_dir_keys, evaluate
from rewardkit.bench.spec import get_spec
from rewardkit.bench.synthetic import write_synthetic_benchmarks

class Brightness(Reward):
    "Mean pixel value in [0, 1]."
    name = "brightness"
    tasks = frozenset({"t2i"})
    uses_prompt = False

    def _score(self, batch):
        return RewardOutput(scores=torch.tensor([np.asarray(im, np.float32).mean() / 255 for im in batch.images]))

data = tempfile.mkdtemp()
write_synthetic_benchmarks(data, n_pairs=12)       # the benchmarks' own file layouts, tiny random images
result = evaluate(Brightness(), "mmrb2/t2i,genaibench/t2i", data_dir=data, cache_dir=None, n_boot=50, progress=False)
for name in ("mmrb2/t2i", "genaibench/t2i"):
    metrics = result[name].metrics
    print(name, sorted(metrics), all(0 <= m.value <= 1 for m in metrics.values() if m.value is not None))
try:
    check_data_dir_keys({"mmrb3": data}, [get_spec("mmrb2/t2i")])   # a typo in NAME=DIR is refused
except Exception as exc:
    print(type(exc).__name__)
''',
    '''\
mmrb2/t2i ['accuracy_with_ties', 'accuracy_without_ties', 'mmrb2_official'] True
genaibench/t2i ['accuracy_with_ties', 'accuracy_without_ties'] True
BenchDataError
'''),
]

EXAMPLES += [(
    "The pairs a reward got wrong, and the --by columns a run's rows have",
    '''\
import io

import numpy as np
from PIL import Image
from rewardkit.bench.data import Comparison
from rewardkit.bench.harness import (BenchDataError, Predictions, by_columns, check_by_columns, wrong_indices,
                                     wrong_pairs)

def png(level):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (level, level, level)).save(buf, format="PNG")
    return buf.getvalue()

labels = [1, -1, 1, 0]                                 # human: A, B, A, tie
rows = [Comparison(index=i, item_id=f"p{i}", group_id=f"p{i}", prompt="a cat", image_a=png(10 * i),
                   image_b=png(200), label=h, raw_label="AB"[h < 0], extra={"meta": '{"category": "animals"}'})
        for i, h in enumerate(labels)]
margin = np.array([0.5, 0.2, -0.9, 0.3])             # the reward's score(A) - score(B)
# wrong: a human preference, a finite margin of the other sign; most confident first
print(wrong_indices(rows, margin))                     # row 2 (|-0.9|), then row 1 (|0.2|); the tie is no mistake
pred = Predictions(margin=margin, forward=["A", "A", "B", "A"], reverse=[None] * 4)
record = wrong_pairs(rows, pred, keep=1, thumb=16)     # what `--wrong-examples 1` keeps in the record
pair = record["pairs"][0]
print(record["n_wrong"], pair["index"], pair["margin"], pair["forward"], pair["image_a"][:22])
found, columns = by_columns(rows, ["meta.category", "model_a", "lang"])   # `--by`: which names the rows have
print(sorted(found), "lang" in columns, {"meta", "model_a", "prompt"} <= columns)
try:
    check_by_columns(sorted({"meta.category", "model_a", "lang"} - found), columns, ["mybench/t2i"])
except BenchDataError as exc:
    print(str(exc).split(";")[0])                     # then the columns there are
''',
    '''\
[2, 1]
2 2 -0.9 B data:image/png;base64,
['meta.category'] False True
--by / by: 'lang', 'model_a' is in none of mybench/t2i
'''),
]
