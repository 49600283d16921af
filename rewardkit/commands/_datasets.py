"""The dataset form of ``rewardkit score`` (``--dataset``): options and the run. Standard library only at module
level (``rewardkit --help`` imports the command modules)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import EXIT_INVALID, EXIT_OK, UsageError, invalid_summary


def add_column_args(p, *, sources: bool = True) -> None:
    g = p.add_argument_group("datasets (Parquet, WebDataset .tar shards, Hugging Face datasets)")
    g.add_argument("--dataset", nargs="+", metavar="PATH",
                   help="Parquet files / folders, .tar shards (globs, {000..009} ranges), a datasets save_to_disk "
                        "folder or a hub id; scores go to one Parquet file per shard under --output (a folder)")
    g.add_argument("--format", dest="data_format", choices=("parquet", "webdataset", "hf"),
                   help="the dataset's format (default: from the files)")
    g.add_argument("--split", help="split of a Hugging Face DatasetDict / hub dataset")
    g.add_argument("--image-column",
                   help="column (WebDataset: extension) holding the image: bytes, a path relative to the shard, or "
                        "an HF Image {bytes, path} (default image / the first image extension)")
    g.add_argument("--prompt-column",
                   help="column holding the prompt (default prompt, caption or text; WebDataset txt; json.<field> "
                        "reads a field of a .json member)")
    if sources:
        g.add_argument("--source-column", "--source-columns", dest="source_columns", nargs="+", default=[],
                       metavar="COLUMN", help="column(s) holding source / reference images (editing rewards)")
    g.add_argument("--id-column", help="column holding a row id, copied to the scores (default SHARD:ROW; "
                                       "WebDataset: the sample key)")
    g.add_argument("--num-shards", type=int, help="Hugging Face datasets: cut into this many row ranges "
                                                  "(default one per arrow file)")
    g.add_argument("--overwrite", action="store_true",
                   help="rescore every shard (default: resume, skipping shards already scored)")
    g.add_argument("--skip-bad-shards", action="store_true",
                   help="a shard that cannot be read is quarantined (listed in the summary and the manifest, exit "
                        "3) instead of stopping the run; a rerun tries it again")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process (or torchrun ranks); ray: a Ray Data pipeline (pip install "
                        "'rewardkit-vision[ray]')")
    g.add_argument("--ray-address", help="Ray cluster to join: auto, or ray://HOST:PORT (default: start a local one)")
    g.add_argument("--concurrency", type=int, default=1, help="--engine ray: reward actors (default 1)")
    g.add_argument("--num-gpus", type=float, default=None,
                   help="--engine ray: GPUs per actor (default 1 when the cluster has GPUs, else 0)")


def run_dataset(args: argparse.Namespace, kwargs: dict) -> int:
    """``rewardkit score --dataset ...``: stream every shard, write score shards, print a summary."""
    if args.images or args.jsonl is not None:
        raise UsageError("give --dataset or image paths / --jsonl, not both")
    if args.output is None:
        raise UsageError("--dataset needs --output DIR (one Parquet score file per input shard goes there)")
    if args.output.exists() and not args.output.is_dir():
        raise UsageError(f"--output {args.output}: is a file; give a folder for the score shards")
    if args.prompt is not None or args.sources:
        raise UsageError("--prompt / --sources are for image paths; with --dataset name the columns "
                         "(--prompt-column, --source-column)")
    common = dict(image_column=args.image_column, prompt_column=args.prompt_column,
                  source_columns=args.source_columns, id_column=args.id_column, format=args.data_format,
                  split=args.split, num_shards=args.num_shards, batch_size=args.batch_size,
                  on_error=args.on_error, overwrite=args.overwrite, progress=not args.no_progress,
                  skip_bad_shards=args.skip_bad_shards)
    if args.ray_address and args.engine != "ray":
        raise UsageError("--ray-address needs --engine ray")
    if args.engine == "ray":
        from ..distributed import launched_world_size
        from ..datasets.ray_engine import score_dataset_ray
        from ..datasets.scoring import RewardSpec

        if launched_world_size() > 1:
            raise UsageError("--engine ray runs from one driver process; do not launch it with torchrun")

        spec = RewardSpec(args.reward, None if args.config is None else str(args.config), kwargs)
        summary = score_dataset_ray(spec, args.dataset, args.output, address=args.ray_address,
                                    concurrency=args.concurrency, num_gpus=args.num_gpus, **common)
        return _report(summary, args)
    from ..distributed import init_from_env, launched_world_size, local_device
    from ._common import load_reward_cli

    main = True
    if launched_world_size() > 1 and init_from_env():  # torchrun: shards dealt over ranks, one device each
        from ..distributed import rank

        device = local_device(kwargs.get("device"))
        if device is not None:
            kwargs["device"] = device
        main = rank() == 0
        common["progress"] = common["progress"] and main
    from ..datasets.scoring import RewardSpec, score_dataset

    class _CliSpec(RewardSpec):  # the manifest is checked first: a finished rerun never loads the model
        def build(self):
            return load_reward_cli(args.reward, args.config, kwargs)

    spec = _CliSpec(args.reward, None if args.config is None else str(args.config), kwargs)
    summary = score_dataset(spec, args.dataset, args.output, **common)
    if launched_world_size() > 1:
        from ..distributed import sum_over_ranks

        for key in ("rows", "invalid", "shards_scored", "shards_skipped"):
            setattr(summary, key, int(sum_over_ranks(getattr(summary, key))))
        if not main:
            return EXIT_OK
    return _report(summary, args)


def _report(summary, args: argparse.Namespace) -> int:
    rate = f", {summary.rows_per_second:.1f} rows/s" if summary.rows else ""
    print(f"scored {summary.rows} row(s) in {summary.shards_scored} shard(s) ({summary.invalid} invalid{rate}); "
          f"{summary.shards_skipped} shard(s) already done; scores in {Path(summary.output)}", file=sys.stderr)
    from ..datasets.output import quarantined

    bad = quarantined(Path(summary.output))  # every rank's (torchrun), as the manifest lists them
    if bad:
        print(f"error: {len(bad)} shard(s) quarantined (unreadable; listed in the manifest's \"quarantined\"; a "
              "rerun retries them):", file=sys.stderr)
        for q in bad:
            print(f"  {q['shard']}: {q['reason']}", file=sys.stderr)
        return EXIT_INVALID
    if summary.rows == 0 and summary.shards_skipped:
        return EXIT_OK
    return invalid_summary(summary.invalid, summary.rows, "rows")


def add_pair_args(sp) -> None:
    """``rewardkit parrot rationalize --dataset ...``: stage 1 over a sharded dataset of pairs."""
    g = sp.add_argument_group("a sharded dataset of pairs (Parquet, WebDataset, Hugging Face; docs/datasets.md)")
    g.add_argument("--dataset", nargs="+", metavar="PATH", help="pairs to rationalize shard by shard (instead of "
                                                               "data.train); records go to --output")
    g.add_argument("--output", type=Path, help="folder for one Parquet file of rationale records per shard")
    for slot, default in (("image-a", "image_a"), ("image-b", "image_b"), ("prompt", "prompt"), ("label", "label")):
        g.add_argument(f"--{slot}-column", default=default, help=f"column of the pair's {slot} (default {default})")
    g.add_argument("--source-column", help="column of the source image (editing pairs)")
    g.add_argument("--id-column", help="column holding a pair id (default SHARD:ROW; WebDataset: the key)")
    g.add_argument("--engine", choices=("local", "ray"), default="local", help="ray: one teacher per actor")
    g.add_argument("--ray-address", help="Ray cluster to join (auto, ray://HOST:PORT; default: a local one)")
    g.add_argument("--concurrency", type=int, default=1, help="--engine ray: teacher actors (default 1)")
    g.add_argument("--num-gpus", type=float, default=None, help="--engine ray: GPUs per actor")


def run_parrot_dataset(args: argparse.Namespace, cfg) -> int:
    if args.output is None:
        raise UsageError("--dataset needs --output DIR (one Parquet file of rationale records per shard)")
    from ..datasets.parrot import PairColumns, rationalize_dataset

    cols = PairColumns(image_a=args.image_a_column, image_b=args.image_b_column, prompt=args.prompt_column,
                       label=args.label_column, source=args.source_column, id=args.id_column)
    s = rationalize_dataset(cfg, args.dataset, args.output, columns=cols, engine=args.engine,
                            address=args.ray_address, concurrency=args.concurrency, num_gpus=args.num_gpus)
    print(f"rationalized {s.rows} pair(s) in {s.shards_scored} shard(s) ({s.invalid} not ok); "
          f"{s.shards_skipped} shard(s) already done; records in {s.output}", file=sys.stderr)
    return EXIT_OK
