"""``rewardkit filter``: keep the rows of a dataset that its scores select, in the dataset's own format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import EXIT_CODES_HELP, EXIT_OK, UsageError

DESCRIPTION = """Keep the rows of a dataset selected by scores from `rewardkit score --dataset`. Examples:
  rewardkit filter --dataset data/ --scores scores/ --where 'score >= 6.5' --output kept/
  rewardkit filter --dataset 'shards/*.tar' --scores scores/ --top-k 1 --group-by prompt --output best_of_n/
  rewardkit filter --dataset data/ --scores hps=hps_scores/ --scores aes=aes_scores/ \\
      --where 'hps > 0.27 and aes >= 5.5' --top-p 0.5 --by aes --output kept/

Expressions: comparisons (< <= > >= == !=, chains such as 1 < score < 5), and / or / not, + - * /, numbers,
'strings' and column names; `backticks` quote any other name. Score columns: score, valid, dim_<dimension>
(named folders: NAME, NAME.valid, NAME.dim_<dimension>); any other name is a column of the data (prompt = the
prompt column the scores used). Invalid rows (for any reward given) are always dropped. Output: Parquet in ->
Parquet shards, WebDataset in -> .tar shards, a Hugging Face dataset in -> a save_to_disk folder (OUTPUT/data),
plus OUTPUT/_rewardkit_filter.json, the report."""


def add_parser(sub) -> None:
    p = sub.add_parser("filter", help="keep dataset rows by score (threshold, top-k / top-p per group)",
                       description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", nargs="+", required=True, metavar="PATH",
                   help="the dataset the scores were computed on (as given to `rewardkit score --dataset`)")
    p.add_argument("--scores", action="append", required=True, metavar="[NAME=]DIR",
                   help="scores folder; repeat as NAME=DIR to combine several rewards")
    p.add_argument("--output", "-o", type=Path, required=True, help="folder for the kept rows")
    p.add_argument("--where", help="keep rows where this holds, e.g. 'score >= 6.5'")
    p.add_argument("--top-k", type=int, help="keep the best K rows of each group (the whole set without --group-by)")
    p.add_argument("--top-p", type=float, help="keep the best fraction P (rounded up) of each group")
    p.add_argument("--group-by", help="column grouping rows for --top-k / --top-p, e.g. prompt")
    p.add_argument("--by", help="column ranked by --top-k / --top-p (default score, or the first NAME)")
    p.add_argument("--lowest", action="store_true", help="rank ascending (lower-is-better rewards)")
    p.add_argument("--format", dest="data_format", choices=("parquet", "webdataset", "hf"),
                   help="the dataset's format (default: what the scores recorded)")
    p.add_argument("--split", help="split of a Hugging Face DatasetDict")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _scores(values: list[str]):
    named = [v for v in values if "=" in v.split("/")[0]]
    if named and len(named) != len(values):
        raise UsageError("--scores: name every folder (NAME=DIR) or give one unnamed folder")
    if not named:
        if len(values) > 1:
            raise UsageError("--scores: several folders need names: --scores hps=DIR1 --scores aes=DIR2")
        return values[0]
    out = {}
    for v in values:
        name, folder = v.split("=", 1)
        if not name.isidentifier():
            raise UsageError(f"--scores {v}: the name must be a plain identifier (letters, digits, _)")
        out[name] = folder
    return out


def run(args: argparse.Namespace) -> int:
    if args.where is None and args.top_k is None and args.top_p is None:
        raise UsageError("nothing to filter by: give --where, --top-k or --top-p")
    if args.where is not None and not args.where.strip():
        raise UsageError("--where is empty: give a condition such as 'score >= 6.5' (or leave --where out)")
    from ..datasets.filtering import filter_dataset

    rep = filter_dataset(args.dataset, _scores(args.scores), args.output, where=args.where, top_k=args.top_k,
                         top_p=args.top_p, group_by=args.group_by, by=args.by, lowest=args.lowest,
                         format=args.data_format, split=args.split, progress=not args.no_progress)
    print(f"kept {rep.kept} of {rep.total} rows ({rep.invalid} invalid, {rep.failed_where} failed --where, "
          f"{rep.below_top} outside the top); wrote {rep.output}", file=sys.stderr)
    if rep.quarantined:
        print(f"note: {len(rep.quarantined)} shard(s) were quarantined when scored (no scores, nothing kept): "
              f"{', '.join(rep.quarantined)}", file=sys.stderr)
    return EXIT_OK
