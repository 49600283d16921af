"""``rewardkit soup``: average N LoRA adapters' weight deltas exactly (Stage 3 of the arena-rubric recipe)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import EXIT_CODES_HELP, UsageError

DESCRIPTION = """Average N LoRA adapters' weight deltas exactly: the soup's delta is sum_i w_i * s_i * B_i A_i
(s_i = alpha_i / r_i), written as one rank-concatenated adapter (peft's "linear" combination is not this).
Inputs: peft adapter directories (adapter_config.json + adapter_model.safetensors), or rewardkit preference
model directories (rewardkit train preference with lora.enabled=true: the reward token's trained row and the
head are averaged too, and the output is a preference model). Safetensors only: .bin / .pt pickles are
refused. Weights default to 1/N each; with trained token rows, modules_to_save or heads they must sum to 1.
Examples:
  rewardkit soup run_a/model run_b/model --output soup/                   # two preference models
  rewardkit soup run_a/adapter run_b/adapter --output soup/               # peft adapters (rank r_a + r_b)
  rewardkit soup a b --weights 0.3 0.7 --output soup/                     # weighted
  rewardkit soup a b --base ./FLUX.2-dev/transformer --output merged/     # merged full weights
  rewardkit soup --config recipes/arena_rubric/stage3.yaml                # the YAML's soup: section"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "soup", help="average LoRA adapters' weight deltas exactly (LoRA soup)",
        description=DESCRIPTION, epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("adapters", nargs="*", type=Path, help="peft LoRA adapter directories or rewardkit LoRA preference model directories")
    p.add_argument("--output", "-o", type=Path, help="directory to write")
    p.add_argument("--weights", "-w", type=float, nargs="+", help="one weight per adapter (default 1/N each)")
    p.add_argument("--base", type=Path,
                   help="base checkpoint directory (*.safetensors): write merged full weights instead of an adapter")
    p.add_argument("--config", "-c", type=Path,
                   help="YAML with a `soup:` section {adapters, weights, output, base}; flags override it")


def _from_config(args: argparse.Namespace) -> None:
    from ..config import _read_yaml
    from ..errors import ConfigError

    data = _read_yaml(args.config)
    section = data.get("soup", data)
    if not isinstance(section, dict):
        raise ConfigError(f"{args.config}: `soup` must be a mapping")
    unknown = set(section) - {"adapters", "weights", "output", "base"}
    if unknown:
        raise ConfigError(f"{args.config}: unknown soup key(s) {sorted(unknown)}; allowed: adapters, weights, output, base")
    if not args.adapters:
        args.adapters = [Path(p) for p in section.get("adapters") or []]
    if args.weights is None and section.get("weights") is not None:
        args.weights = [float(w) for w in section["weights"]]
    if args.output is None and section.get("output"):
        args.output = Path(section["output"])
    if args.base is None and section.get("base"):
        args.base = Path(section["base"])


def run(args: argparse.Namespace) -> int:
    from ..compose.soup import lora_soup

    if args.config is not None:
        _from_config(args)
    if not args.adapters:
        raise UsageError("give adapter directories (or --config with soup.adapters)")
    if args.output is None:
        raise UsageError("--output is required (or soup.output in --config)")
    if args.weights is not None and len(args.weights) != len(args.adapters):
        raise UsageError(f"{len(args.weights)} weights for {len(args.adapters)} adapters")
    out = lora_soup(args.adapters, args.output, args.weights, base=args.base)
    kind = "merged weights" if args.base else "preference model" if (out / "preference_config.json").is_file() \
        else "adapter"
    print(f"wrote the {kind} averaging {len(args.adapters)} adapters to {out}", file=sys.stderr)
    return 0
