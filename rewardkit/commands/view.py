"""``rewardkit view``: one self-contained HTML report of score / compare outputs, bench records and rl runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import EXIT_CODES_HELP, UsageError

DESCRIPTION = """Write one static HTML page (no server, no network: open it from disk or mail it) showing what
rewardkit wrote. Inputs, in any mix:
  score outputs (rewardkit score --output, JSONL) and Parquet files with the same columns
  compare outputs (rewardkit compare --output, JSONL)
  bench records (rewardkit bench --output, JSON)
  rl run folders (rewardkit rl nft's output_dir, holding metrics.jsonl)
  dataset score folders (rewardkit score --dataset --output): joined back to the dataset's images and prompts
Two or more score files on the same images are also compared: ranks, disagreements, a scatter plot.
Examples:
  rewardkit view outputs/t2i_scores.jsonl -o outputs/report.html
  rewardkit view clip.jsonl pickscore.jsonl hpsv3.jsonl -o outputs/rewards.html
  rewardkit view results/*.json -o outputs/bench.html
  rewardkit view runs/nft-sd3 -o outputs/run.html
  rewardkit view outputs/best_of_3_scores -o outputs/best_of_3.html
  rewardkit view big_scores.parquet -o outputs/big.html --thumbs folder"""


def add_parser(sub) -> None:
    p = sub.add_parser("view", help="an HTML report of scores, comparisons, bench records and rl runs",
                       description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", type=Path, help="score/compare JSONL, Parquet, bench JSON, rl run folders")
    p.add_argument("--output", "-o", type=Path, default=Path("report.html"),
                   help="the HTML file to write (default report.html)")
    p.add_argument("--title", help="page title (default: the input names)")
    p.add_argument("--label", dest="labels", action="extend", nargs="+", metavar="NAME",
                   help="one name per input, in order (default: the file names)")
    p.add_argument("--thumbs", choices=("embed", "folder"), default="embed",
                   help="embed: thumbnails inside the HTML (one file; default); folder: written to "
                        "<output>_files/ beside it, the enlarged view links the original (large sets)")
    p.add_argument("--thumb-size", type=int, default=256, help="longest side of a thumbnail in pixels (default 256)")
    p.add_argument("--page-size", type=int, default=50, help="table rows per page (default 50)")
    p.add_argument("--full-size", type=int, default=1024,
                   help="embed: longest side of the enlarged image embedded for images larger than their thumbnail "
                        "(default 1024; 0: the enlarged view is the thumbnail)")
    p.add_argument("--full-budget", type=float, default=32, metavar="MB",
                   help="embed: at most this many MB of enlarged images in the page (default 32); past it the "
                        "enlarged view is the thumbnail, and says so")


def run(args: argparse.Namespace) -> int:
    from ..view import ViewInputError, build_report

    try:
        out = build_report(args.inputs, args.output, title=args.title, thumbs=args.thumbs,
                           thumb_size=args.thumb_size, labels=args.labels, page_size=args.page_size,
                           full_size=args.full_size, full_budget_mb=args.full_budget)
    except ViewInputError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB): open it in a browser", file=sys.stderr)
    return 0
