"""More examples of the Reports page (api/view.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "The pieces of a report: rows, sections, thumbnails, rank correlations",
    '''\
import io
import json
import tempfile
from pathlib import Path

from PIL import Image
from rewardkit.view import collect, embed_json, render_html
from rewardkit.view.images import ImageStore, thumbnail_bytes, thumbnail_data_uri
from rewardkit.view.multi import average_ranks, rewards_section, spearman
from rewardkit.view.scores import ViewInputError, is_pairs, read_rows, score_section

folder = Path(tempfile.mkdtemp())
Image.new("RGB", (600, 300), (200, 30, 30)).save(folder / "red.png")
encoded, mime = thumbnail_bytes(folder / "red.png", size=64)
print(mime, Image.open(io.BytesIO(encoded)).size, thumbnail_data_uri(folder / "red.png")[:15])
print(average_ranks([0.9, 0.1, 0.5, 0.5]), spearman([1, 2, 3], [10, 20, 30]), spearman([1, 2], [2, 1]))
print(embed_json({"html": "</script><b>"}))              # safe inside <script type="application/json">
for name, score in (("a", 0.9), ("b", 0.2)):
    row = {"image": str(folder / "red.png"), "prompt": "a red square", "score": score, "valid": True}
    (folder / f"{name}.jsonl").write_text(json.dumps(row) + "\\n")
rows = read_rows(folder / "a.jsonl")
print(rows[0]["_line"], is_pairs(rows))
store = ImageStore(folder, mode="embed")
section = score_section(folder / "a.jsonl", rows, store, "a")
print(section["kind"], len(section["rows"]))
other = score_section(folder / "b.jsonl", read_rows(folder / "b.jsonl"), store, "b")
print(rewards_section([section, other])["kind"])          # two score files of the same images: joined
sections = collect([folder / "a.jsonl", folder / "b.jsonl"], store)   # what `rewardkit view` does
print([s["kind"] for s in sections])
page = render_html({"sections": sections}, title="my report")
print(page.startswith("<!DOCTYPE html>"), "<title>my report</title>" in page)
(folder / "bad.jsonl").write_text("{not json\\n")
try:
    read_rows(folder / "bad.jsonl")
except ViewInputError as exc:
    print("ViewInputError:", "bad.jsonl" in str(exc), "line 1" in str(exc))   # names the file and the line
''',
    '''\
image/png (64, 32) data:image/png;
[1.0, 4.0, 2.5, 2.5] 1.0 None
{"html":"\\u003c/script\\u003e\\u003cb\\u003e"}
1 False
scores 1
rewards
['rewards', 'scores', 'scores']
True True
ViewInputError: True True
'''),
]

EXAMPLES += [(
    "Compare outputs, bench records and RL runs: what `rewardkit view` recognises",
    '''\
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from rewardkit.view.bench import bench_section, is_bench_record
from rewardkit.view.images import ImageStore
from rewardkit.view.rl import eval_grids, is_rl_run, rl_section
from rewardkit.view.scores import is_pairs, pairs_section, read_jsonl, read_parquet

folder = Path(tempfile.mkdtemp())
store = ImageStore(folder, mode="embed")
Image.new("RGB", (8, 8), (200, 30, 30)).save(folder / "a.png")
Image.new("RGB", (8, 8), (30, 30, 200)).save(folder / "b.png")
pair = {"image_a": "a.png", "image_b": "b.png", "prompt": "a red square", "prob_a": 0.8, "valid": True}
(folder / "compare.jsonl").write_text(json.dumps(pair) + "\\n")             # `rewardkit compare` output
rows = read_jsonl(folder / "compare.jsonl")
print(is_pairs(rows), pairs_section(folder / "compare.jsonl", rows, store, "compare")["kind"])
pq.write_table(pa.table({"image": ["a.png"], "score": [0.5]}), folder / "scores.parquet")
print(read_parquet(folder / "scores.parquet")[0]["score"])
bench = {"reward": {"name": "pickscore", "config": {}}, "benchmarks": {}}                 # a bench record
(folder / "bench.json").write_text(json.dumps(bench))
print(is_bench_record(folder / "bench.json"), is_bench_record(folder / "compare.jsonl"),
      bench_section([folder / "bench.json"], store)["kind"])
run = folder / "run"                                                         # an RL run folder
run.mkdir()
(run / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "reward_mean": 0.1}) + "\\n")
Image.new("RGB", (8, 8)).save(run / "eval-epoch-2.png")
print(is_rl_run(run), [(epoch, p.name) for epoch, p in eval_grids(run)], rl_section(run, store, "run")["kind"])
''',
    '''\
True pairs
0.5
True False bench
True [(2, 'eval-epoch-2.png')] rl
'''),
]
