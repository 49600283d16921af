"""`rewardkit parrot rationalize | filter | project | sft | run --config recipe.yaml [key=value ...]`.

PARROT: anchored rationales from preference pairs, the label-free consistency filter, pointwise projection
and SFT of a RationalRewards student (see `docs/parrot.md`). Every stage resumes where a crashed run
stopped; `run` chains all four.

    rewardkit parrot run --config recipes/parrot/tiny.yaml output_dir=runs/parrot-tiny
    rewardkit parrot filter --config recipes/parrot/qwen3_vl.yaml      # stage 2 only (its report is printed)
    torchrun --nproc_per_node 8 -m rewardkit.cli parrot sft --config recipes/parrot/qwen3_vl.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

STAGES = ("rationalize", "filter", "project", "sft", "run")


_HELP = {"rationalize": "stage 1: anchored pairwise rationales (teacher sees the label)",
         "filter": "stage 2: label-free consistency check; keep-rate report",
         "project": "stage 3: pointwise critiques of each image of the kept pairs",
         "sft": "stage 4: SFT of the student (TRL SFTTrainer; torchrun / accelerate for DDP)",
         "run": "stages 1-4 in order"}


def add_parser(sub) -> None:
    p = sub.add_parser("parrot", help="PARROT: rationales from preference pairs -> RationalRewards student",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = p.add_subparsers(dest="parrot_stage", metavar="STAGE")
    for name in STAGES:
        sp = stages.add_parser(name, help=_HELP[name], description=_HELP[name])
        sp.add_argument("--config", "-c", type=Path, help="recipe YAML (see recipes/parrot/)")
        sp.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. teacher.judge=openai:http://127.0.0.1:8000/v1 batch_size=32")
        sp.add_argument("--output-dir", help="shortcut for output_dir=...")
        sp.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
        sp.add_argument("--no-progress", action="store_true", help="no progress bars")
        if name == "rationalize":
            from ._datasets import add_pair_args

            add_pair_args(sp)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from ..config import load_config
    from ..parrot.pipeline import ParrotConfig, Pipeline

    if not getattr(args, "parrot_stage", None):
        print("rewardkit parrot: error: give a stage: rewardkit parrot STAGE --config recipe.yaml; stages: "
              + ", ".join(STAGES), file=sys.stderr)
        return 2
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    cfg = load_config(ParrotConfig, args.config, overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
        return 0
    if args.parrot_stage == "rationalize" and args.dataset:  # stage 1 shard by shard (docs/datasets.md)
        from ._datasets import run_parrot_dataset

        return run_parrot_dataset(args, cfg)
    main = int(os.environ.get("RANK", "0")) == 0
    if args.no_progress:
        _no_progress_bars()
    pipe = Pipeline(cfg, progress=not args.no_progress and main)
    from ..config import save_config

    if main:
        save_config(cfg, Path(cfg.output_dir) / "parrot_config.yaml")
    stage = args.parrot_stage
    if stage in ("rationalize", "filter", "project") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print("rewardkit parrot: stages 1-3 run in one process (the judge batches); launch only `sft` with "
              "torchrun / accelerate", file=__import__("sys").stderr)
        return 2
    if stage == "rationalize":
        n = pipe.rationalize()
        _print({"stage": stage, "written": n, "records": len(pipe.rationales),
                "status": _counts(pipe.rationales.records.values(), "status")})
    elif stage == "filter":
        pipe.filter()
        _print(pipe.report())
    elif stage == "project":
        n = pipe.project()
        _print({"stage": stage, "written": n, "records": len(pipe.projected),
                "status": _counts(pipe.projected.records.values(), "status")})
    elif stage == "sft":
        from ..parrot.sft import train_sft

        summary = train_sft(pipe)
        if main:
            _print(summary)
    else:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            print("rewardkit parrot run: run stages 1-3 in one process, then launch `parrot sft` with torchrun",
                  file=__import__("sys").stderr)
            return 2
        report = pipe.run_stages()
        _print({"filter": {k: report[k] for k in ("records", "counts", "keep_rate", "keep_rate_parsed")},
                "projected": _counts(pipe.projected.records.values(), "status")})
        from ..parrot.sft import train_sft

        summary = train_sft(pipe)
        _print(summary)
        print(f"load it with: rewardkit.load_reward('rational', model={summary['model']!r})")
    return 0


def _no_progress_bars() -> None:
    """``--no-progress`` silences every bar, not only the pipeline's: the Hub's and transformers' (weights
    loading), datasets' (Arrow cache writes, maps) and, through ``Pipeline.progress``, the Trainer's."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read when datasets is imported
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()


def _counts(recs, key) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in recs:
        out[r[key]] = out.get(r[key], 0) + 1
    return out


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))
