"""``rewardkit compare``: which of two images a reward prefers, P(A preferred over B)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import EXIT_CODES_HELP, UsageError, count, invalid_summary
from ._common import load_reward_cli

DESCRIPTION = """Compare two candidate images under one prompt: P(A preferred over B) from a reward
(for score-based rewards sigmoid((score_A - score_B) / temperature); judges answer the pair directly).
Several pairs: A1.png B1.png A2.png B2.png ... (images in pairs, A then B). Examples:
  rewardkit compare --reward pickscore a.png b.png --prompt 'a red bicycle'
  rewardkit compare --reward preference --model ./my-rm a.png b.png --sources src.png --prompt 'make it red'"""


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="P(image A preferred over image B) under a reward",
                       description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", nargs="+", metavar="IMAGE", help="A B (or A1 B1 A2 B2 ...): candidates, in pairs")
    p.add_argument("--reward", "-r", required=True, help="registry name (see `rewardkit ls`)")
    p.add_argument("--model", "-m", help="hub id or local checkpoint directory for model-backed rewards")
    p.add_argument("--prompt", "-p", required=True, help="prompt / instruction shared by every pair")
    p.add_argument("--sources", nargs="+", metavar="IMAGE", help="source / reference image(s) (editing rewards)")
    p.add_argument("--output", "-o", type=Path, help="write one JSON result per pair to this JSONL file")
    p.add_argument("--device", help="torch device, e.g. cpu, cuda (default: cuda if available)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16")
    p.add_argument("--config", type=Path, help="YAML file with the reward's options")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override reward options")


def run(args: argparse.Namespace) -> int:
    from .score import reward_kwargs

    if len(args.pairs) % 2:
        raise UsageError(f"give images in pairs (A B ...), got {len(args.pairs)}")
    kwargs = reward_kwargs(args)
    reward = load_reward_cli(args.reward, args.config, kwargs)
    a, b = args.pairs[0::2], args.pairs[1::2]
    out = reward.compare(a, b, args.prompt, sources=[list(args.sources)] * len(a) if args.sources else None,
                         on_error="nan")
    rows = []
    for i, (x, y) in enumerate(zip(a, b)):
        ok = bool(out.valid[i])
        row = {"image_a": x, "image_b": y, "prompt": args.prompt, "prob_a": float(out.prob_a[i]) if ok else None,
               "valid": ok, "error": out.errors[i]}
        if out.scores_a is not None and ok:
            row.update(score_a=float(out.scores_a[i]), score_b=float(out.scores_b[i]))
        rows.append(row)
        if ok:
            winner = x if row["prob_a"] > 0.5 else y if row["prob_a"] < 0.5 else "tie"
            extra = f"  (scores {row['score_a']:.6g} vs {row['score_b']:.6g})" if "score_a" in row else ""
            print(f"P({x} preferred over {y}) = {row['prob_a']:.4f}  -> {winner}{extra}")
        else:
            print(f"{x} vs {y}: NaN  ({row['error']})")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {count(len(rows), 'result')} to {args.output}", file=sys.stderr)
    return invalid_summary(sum(not r["valid"] for r in rows), len(rows), "pairs")
