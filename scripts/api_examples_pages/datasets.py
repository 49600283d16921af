"""More examples of the Datasets page (api/datasets.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "Shards, filter expressions and the keep mask, by hand",
    '''\
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rewardkit.datasets.expr import Expression, parse_expression
from rewardkit.datasets.filtering import FilterReport, select
from rewardkit.datasets.output import dim_column
from rewardkit.datasets.readers import Columns
from rewardkit.datasets.scoring import RewardSpec, ScoreSummary, is_spec
from rewardkit.datasets.sources import Dataset, Shard, brace_count, expand_braces, looks_like_hub_id, open_dataset

print(expand_braces("data-{000..002}.tar"), brace_count("a-{0..9}-{00..99}.tar"))
print(looks_like_hub_id("org/dataset"), looks_like_hub_id("./data/part.parquet"))
root = Path(tempfile.mkdtemp())
for i in range(2):
    pq.write_table(pa.table({"prompt": ["a cat", "a dog"], "image": [b"", b""]}), root / f"part-{i}.parquet")
ds = open_dataset(str(root / "part-*.parquet"))          # one shard per Parquet file (a hub id: row ranges)
print(isinstance(ds, Dataset), ds.format, [s.name for s in ds.shards], isinstance(ds.shards[0], Shard))
print(Columns(image="jpg", prompt="txt"))
expr = parse_expression("score >= 0.5 and valid")
print(isinstance(expr, Expression), expr.columns)
cols = {"score": np.array([0.9, 0.4, 0.7, np.nan]), "valid": np.array([True, True, True, False]),
        "prompt": np.array(["a cat", "a cat", "a dog", "a dog"])}
keep, counts = select(cols, ["valid"], where="score >= 0.5")
print(keep.tolist(), counts)
keep, _ = select(cols, ["valid"], top_k=1, group_by="prompt")           # the best image of each prompt
print(keep.tolist(), FilterReport(total=4, kept=int(keep.sum())).kept)
spec = RewardSpec("jpeg-compressibility")                 # a picklable recipe: each worker builds its own model
print(is_spec(spec), spec.build().name, dim_column("faithfulness/q 1"), ScoreSummary(output="scores").rows)
''',
    '''\
['data-000.tar', 'data-001.tar', 'data-002.tar'] 1000
True False
True parquet ['part-0', 'part-1'] True
Columns(image='jpg', prompt='txt', sources=(), id=None)
True ['score', 'valid']
[True, False, True, False] {'invalid': 1, 'failed_where': 1, 'below_top': 0}
[True, False, True, False] 2
True jpeg-compressibility dim_faithfulness_q_1 0
'''),
]

EXAMPLES += [(
    "Reading shards row by row: a WebDataset tar and a Parquet file, scored a batch at a time",
    '''\
import io
import tarfile
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from rewardkit.datasets.readers import (Columns, TooLarge, count_rows, id_type, iter_batches, iter_columns,
                                        iter_wds_samples, max_tar_member, resolve, resolve_image, shard_base,
                                        split_name, wds_value)
from rewardkit.datasets.scoring import RewardSpec, manifest_extra, plan, read_guarded, score_batch
from rewardkit.datasets.sources import open_dataset
from rewardkit.integrations.ray import RewardScorer

def png(level):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (level, level, level)).save(buf, format="PNG")
    return buf.getvalue()

root = Path(tempfile.mkdtemp())
with tarfile.open(root / "shard-000.tar", "w") as tar:             # WebDataset: <key>.<ext> members
    for key, level in (("s0", 40), ("s1", 200)):
        for ext, data in (("png", png(level)), ("txt", b"a grey square")):
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
key, sample, members = next(iter_wds_samples(str(root / "shard-000.tar")))
print(key, sorted(sample), split_name("dir/abc.seg.png"), wds_value(sample, "txt")[0])
print(max_tar_member() > 0, TooLarge("big.png", 10, 5).name)
ds = open_dataset(str(root / "shard-000.tar"))
cols = resolve(ds, Columns(image="png", prompt="txt"), needs_prompt=True)
print(ds.format, count_rows(ds, ds.shards[0]), id_type(ds, cols), shard_base(ds, ds.shards[0]) == str(root))
batch = next(read_guarded(iter_batches(ds, ds.shards[0], cols, batch_size=8), ds.shards[0]))
print(sorted(batch), len(batch["image"]))
records = score_batch(RewardSpec("jpeg-compressibility").build(), batch)
print([sorted(r) for r in records][0], all(r["valid"] for r in records))
values, errors = next(iter_columns(ds, ds.shards[0], ["txt"], batch_size=8))
print(values["txt"], errors)
pq.write_table(pa.table({"prompt": ["p"], "image": ["missing.png"]}), root / "rows.parquet")
value, error = resolve_image("imgs/a.png", str(root))               # a relative path, against the shard's folder
print(Path(value).relative_to(root), error)
dataset, columns, desc = plan(str(root / "rows.parquet"), RewardSpec("jpeg-compressibility"), Columns())
print(columns.image, columns.prompt, sorted(desc)[:2], sorted(manifest_extra(dataset))[:2])
scorer = RewardScorer("jpeg-compressibility", image_column="image", prompt_column=None)   # Ray Data's map_batches
out = scorer({"image": [png(40), png(200)]})
print(sorted(out), out["valid"].tolist())
''',
    '''\
s0 ['png', 'txt'] ('dir/abc', 'seg.png') b'a grey square'
True big.png
webdataset None string True
['error', 'id', 'image', 'prompt', 'sources'] 2
['dimensions', 'error', 'score', 'valid'] True
[b'a grey square', b'a grey square'] [None, None]
imgs/a.png None
image prompt ['columns', 'config'] ['format', 'inputs']
['dim_size_kb', 'error', 'image', 'score', 'valid'] [True, True]
'''),
]

EXAMPLES += [(
    "The score folder: its manifest, resumable shards and quarantined ones",
    '''\
import io
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from rewardkit.datasets.output import (AtomicParquet, check_manifest, finished, partial_dir, partial_parts,
                                       partial_rows, quarantine, quarantined, read_scores, record_quarantine,
                                       reward_description, unquarantine)
from rewardkit.datasets.readers import Columns
from rewardkit.datasets.scoring import RewardSpec, ScoreSummary, ShardReadError, plan, score_dataset

def png(level):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (level, level, level)).save(buf, format="PNG")
    return buf.getvalue()

root = Path(tempfile.mkdtemp())
for i in range(2):
    pq.write_table(pa.table({"prompt": ["p", "q"], "image": [png(40), png(200)]}), root / f"part-{i}.parquet")
summary = score_dataset(RewardSpec("jpeg-compressibility"), str(root / "part-*.parquet"), root / "scores",
                        progress=False)
print(isinstance(summary, ScoreSummary), summary.rows, summary.shards_scored)
scores, manifest = read_scores(root / "scores", columns=["id", "score"])     # one table, shards in order
print(scores.num_rows, scores.column_names, manifest["shards"])
print(sorted(reward_description(RewardSpec("jpeg-compressibility").build(), {"image": "image"}))[:3])
spec = RewardSpec("jpeg-compressibility")
_, _, desc = plan(str(root / "part-*.parquet"), spec.describe(), Columns())   # as score_dataset plans it
print(finished(root / "scores", "part-0", desc))
again = score_dataset(RewardSpec("jpeg-compressibility"), str(root / "part-*.parquet"), root / "scores",
                      progress=False)                                    # a rerun skips finished shards
print(again.shards_scored, again.shards_skipped)
check_manifest(root / "scores", desc, {}, write=False)                   # same reward: accepted
print(partial_dir(root / "scores", "part-1").name, partial_parts(root / "scores", "part-1", desc),
      partial_rows(root / "scores", "part-1", desc))                     # nothing interrupted
quarantine(root / "scores", "part-9", str(root / "part-9.parquet"), "truncated file")   # --skip-bad-shards
print([(q["shard"], q["reason"]) for q in quarantined(root / "scores")], len(record_quarantine(root / "scores")))
unquarantine(root / "scores", "part-9")                                  # scored since: no longer left out
print(quarantined(root / "scores"), issubclass(ShardReadError, Exception))
table = AtomicParquet(root / "one.parquet", pa.schema([("x", pa.int64())]))    # written to .tmp, renamed
table.write({"x": [1, 2]})
table.commit()
print(pq.read_table(root / "one.parquet").column("x").to_pylist())
''',
    '''\
True 4 2
4 ['id', 'score'] ['part-0', 'part-1']
['columns', 'config', 'content']
True
0 2
part-1 [] 0
[('part-9', 'truncated file')] 1
[] True
[1, 2]
'''),
]

EXAMPLES += [(
    "The same scoring on a Ray cluster",
    '''\
# needs a Ray cluster (`ray start --head`) and the ray extra: not run by the test suite
from rewardkit.datasets.ray_engine import score_dataset_ray
from rewardkit.datasets.scoring import RewardSpec

# one actor per GPU, each building its own model from the recipe; the output folder is score_dataset's
# (run_on_ray is the Ray Data pipeline underneath: shards -> actors -> one Parquet file per shard)
summary = score_dataset_ray(RewardSpec("pickscore", kwargs={"device": "cuda"}), "data/part-*.parquet", "scores",
                            address="auto", concurrency=4, num_gpus=1)
print(summary.rows, summary.invalid)
''',
    ""),
]

EXAMPLES += [(
    "One shard's score file, written by hand with ShardWriter",
    '''\
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rewardkit.datasets.output import ShardWriter

out = Path(tempfile.mkdtemp()) / "scores"
desc = {"reward": "brightness", "config": {}}                  # the reward's description, as the manifest holds it
writer = ShardWriter(out, "part-0", "/data/part-0.parquet", desc, pa.string(), dimensions=["quality"])
writer.write(["a", "b"], [{"score": 0.5, "valid": True, "error": None, "dimensions": {"quality": 2.0}},
                          {"score": None, "valid": False, "error": "unreadable image"}])   # as records() gives them
print(writer.rows, writer.invalid, writer.final.exists())       # buffered in row groups: no file yet
writer.commit()                                                 # written to part-0.parquet.tmp, then renamed
table = pq.read_table(out / "part-0.parquet")
print(table.column_names)
cols = table.to_pydict()
print(cols["row"], cols["score"], cols["dim_quality"], cols["error"])   # a missing value is NaN, with its reason
print(json.loads(table.schema.metadata[b"rewardkit"])["input_shard"])
''',
    '''\
2 1 False
['shard', 'row', 'id', 'score', 'valid', 'error', 'dim_quality']
[0, 1] [0.5, nan] [2.0, nan] [None, 'unreadable image']
/data/part-0.parquet
'''),
]

EXAMPLES += [(
    'PARROT stage 1 over a Parquet set of pairs (a rule-based stand-in teacher)',
    '''\
import io
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from rewardkit.datasets.parrot import PairColumns, pair_rows, rationale_batch, rationalize_dataset
from rewardkit.datasets.sources import open_dataset
from rewardkit.parrot.pipeline import ParrotConfig, Pipeline, TeacherCfg

def png(level):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (level, level, level)).save(buf, format="PNG")
    return buf.getvalue()

root = Path(tempfile.mkdtemp())
(root / "pairs").mkdir()
pq.write_table(pa.table({"pair_id": ["p0", "p1", "p2"], "caption": ["a dark room", "a lit room", "a cat"],
                         "image_a": [png(30), png(220), png(90)], "image_b": [png(200), png(40), b"not a png"],
                         "label": ["B", "A", "A"]}), root / "pairs" / "part-0.parquet")
cols = PairColumns(prompt="caption", id="pair_id")             # which columns hold the pair's parts
ds = open_dataset(str(root / "pairs"))
start, ids, rows, errors = next(pair_rows(ds, ds.shards[0], cols, batch_size=8))   # decoded, labels normalised
print(start, ids, [r["label"] for r in rows[:2]], rows[0]["image_a"].size, [e is None for e in errors])
# a rule-based stand-in teacher (brightness); a real run names a VLM: transformers:<ckpt>, vllm:<ckpt>, openai:<url>
cfg = ParrotConfig(output_dir=str(root / "work"), teacher=TeacherCfg(judge="scripted"), batch_size=8)
records = rationale_batch(Pipeline(cfg, progress=False, load_data=False), rows, errors)
print([r["status"] for r in records], records[0]["rationale_preferred"], records[2]["reason"])
print(records[0]["rationale"].splitlines()[1])               # 1 + 3 * brightness / 255, to the nearest 0.5
summary = rationalize_dataset(cfg, str(root / "pairs"), root / "rationales", columns=cols)   # every shard, resumable
print(summary.rows, summary.shards_scored, summary.invalid)
got = pq.read_table(root / "rationales" / "part-0.parquet").to_pylist()
print([(g["id"], g["status"], g["label"]) for g in got])
again = rationalize_dataset(cfg, str(root / "pairs"), root / "rationales", columns=cols)   # a rerun
print(again.rows, again.shards_skipped)                      # skips the finished shard
''',
    '''\
0 ['p0', 'p1', 'p2'] ['B', 'A'] (8, 8) [True, True, False]
['ok', 'ok', 'skipped'] B unreadable row: RewardInputError: bytes is not a recognised image format
Scores: A = 1.5, B = 3.5
3 1 1
[('p0', 'ok', 'B'), ('p1', 'ok', 'A'), ('p2', 'skipped', 'A')]
0 1
'''),
]
