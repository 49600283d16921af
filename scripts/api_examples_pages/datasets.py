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
