"""``rewardkit bench``: measure a reward's agreement with human preferences on MMRB2, GenAI-Bench and
EditReward-Bench, or build reports from earlier result records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import EXIT_CODES_HELP, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="accuracy of a reward on preference benchmarks (MMRB2, GenAI-Bench, EditReward-Bench)",
        description="Accuracy of a reward on human-preference benchmarks. Examples:\n"
                    "  rewardkit bench --list\n"
                    "  rewardkit bench --reward pickscore --benchmark mmrb2/t2i,genaibench/t2i\n"
                    "  rewardkit bench --reward clipscore --model ./clip --benchmark mmrb2/t2i --data-dir ./data\n"
                    "  rewardkit bench --report bench-results/*.json --plot rewards.png\n"
                    "  rewardkit bench geneval --images outputs/ --outfile results.jsonl   (GenEval of a generator)\n"
                    "Local data: hf download --repo-type dataset DATASET --local-dir DIR, then --data-dir DIR\n"
                    "(files count only when their path names the benchmark's split and config exactly).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", nargs="?", choices=("geneval",),
                   help="geneval: score a generator's images in GenEval's layout (--images) with the geneval "
                        "reward, write the official per-image results and print the official summary")
    p.add_argument("--images", type=Path, metavar="DIR",
                   help="geneval: the folder of prompt folders (00000/metadata.jsonl + samples/NNNNN.png)")
    p.add_argument("--metadata", type=Path, metavar="FILE",
                   help="geneval: the prompt metadata file (e.g. GenEval's prompts/evaluation_metadata.jsonl); "
                        "each folder's metadata.jsonl must equal its row")
    p.add_argument("--outfile", type=Path, metavar="FILE",
                   help="geneval: the per-image results JSONL (default <--output-dir>/geneval_results.jsonl)")
    p.add_argument("--reward", "-r", help="registry name (see `rewardkit ls`)")
    p.add_argument("--model", "-m", help="hub id or local checkpoint directory for model-backed rewards")
    p.add_argument("--benchmark", "-b", default="",
                   help="comma-separated benchmark names (see --list), e.g. mmrb2/t2i,genaibench/edit")
    p.add_argument("--list", action="store_true", help="list the shipped benchmark specs and exit")
    p.add_argument("--write-synthetic", type=Path, metavar="DIR",
                   help="write tiny synthetic benchmark files with the real schemas and layout to DIR and exit "
                        "(for trying the harness without downloads; the scores mean nothing)")
    p.add_argument("--data-dir", nargs="+", metavar="[NAME=]DIR",
                   help="local data instead of the hub: one directory (dataset files, or one sub-folder per "
                        "family: mmrb2/, genaibench/, editreward/), or NAME=DIR per benchmark or family")
    p.add_argument("--revision", help="hub dataset revision to pin")
    p.add_argument("--output-dir", "-o", type=Path, default=Path("bench-results"),
                   help="where the JSON record, markdown table and plot go (default ./bench-results)")
    p.add_argument("--cache-dir", type=Path, help="score cache root (default ~/.cache/rewardkit/bench)")
    p.add_argument("--no-cache", action="store_true", help="keep scores in memory only")
    p.add_argument("--retry-invalid", action="store_true", help="re-score cached samples that were invalid")
    p.add_argument("--mode", choices=("auto", "scalar", "pairwise"), default="auto",
                   help="scalar: score each image once; pairwise: compare() in both orders (auto: pairwise "
                        "for rewards that override compare, i.e. judges)")
    p.add_argument("--limit", type=int, help="first N comparisons per benchmark (smoke runs)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for 95%% CIs (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--by", nargs="+", default=[], metavar="COLUMN",
                   help="extra per-category breakdowns, e.g. --by model_a")
    p.add_argument("--per-sample", action="store_true", help="store every comparison's scores in the record")
    p.add_argument("--wrong-examples", type=int, default=8, metavar="N",
                   help="keep the N most confident wrong pairs, with thumbnails, in the record for "
                        "`rewardkit view` (default 8; 0: none)")
    p.add_argument("--ignore-sources", action="store_true",
                   help="run editing benchmarks with a text-image reward (instruction as prompt, no source)")
    p.add_argument("--device", help="torch device, e.g. cpu, cuda, cuda:1")
    p.add_argument("--dtype", help="float32, float16 or bfloat16")
    p.add_argument("--batch-size", type=int, help="items per reward call (default: the reward's own)")
    p.add_argument("--config", type=Path, help="YAML file with the reward's options")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override reward options")
    p.add_argument("--report", nargs="+", type=Path, metavar="RESULT.json",
                   help="no scoring: build the markdown table (and --plot) from saved records")
    p.add_argument("--plot", type=Path, help="PNG path for the comparison plot (default: in --output-dir)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _data_dir(items: list[str] | None):
    if not items:
        return None
    if len(items) == 1 and "=" not in items[0]:
        return items[0]
    out = {}
    for it in items:
        if "=" not in it:
            raise UsageError(f"--data-dir: give one DIR or NAME=DIR entries, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = v
    return out


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def run(args: argparse.Namespace) -> int:
    from ..bench.spec import get_spec, list_benchmarks

    if args.suite == "geneval":
        return _run_geneval(args)
    if args.images is not None or args.metadata is not None or args.outfile is not None:
        raise UsageError("--images, --metadata and --outfile go with `rewardkit bench geneval`")
    if args.list:
        for name in list_benchmarks():
            s = get_spec(name)
            where = f"{s.dataset}" + (f" [{s.config}]" if s.config else "") + f" split {s.split}" + \
                    (f" files {s.data_files}" if s.data_files else "")
            gated = " (gated)" if s.gated else ""
            print(f"{name:18s} v{s.version:5s} {where}{gated}; primary: {'/'.join(s.primary)}")
        return 0
    if args.write_synthetic is not None:
        from ..bench.synthetic import write_synthetic_benchmarks

        written = write_synthetic_benchmarks(args.write_synthetic)
        for name, path in written.items():
            print(f"{name:18s} {path}")
        print(f"use: --data-dir {args.write_synthetic}", file=sys.stderr)
        return 0
    from ..bench.report import load_records, markdown_report, plot_records

    if args.report:
        records = load_records(args.report)
        print(markdown_report(records))
        if args.plot:
            print(f"wrote {plot_records(records, args.plot)}", file=sys.stderr)
        return 0
    if not args.reward:
        raise UsageError("--reward is required (or --list / --report)")
    benches = [b.strip() for b in args.benchmark.split(",") if b.strip()]
    if not benches:
        raise UsageError("--benchmark is required, e.g. --benchmark mmrb2/t2i (see --list)")
    for b in benches:
        get_spec(b)  # fail on a typo before loading any model
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be >= 1")
    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0 (0: no confidence intervals), got {args.bootstrap}")
    if args.wrong_examples < 0:
        raise UsageError(f"--wrong-examples must be >= 0 (0: none), got {args.wrong_examples}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")

    from ..bench.data import BenchDataError
    from ..bench.harness import evaluate
    from ..config import parse_overrides
    from ._common import load_reward_cli

    kwargs = parse_overrides(args.overrides)
    for key in ("model", "device", "dtype"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    data_dir = _data_dir(args.data_dir)
    try:
        from ..bench.harness import check_data_dir_keys

        check_data_dir_keys(data_dir, [get_spec(b) for b in benches])
        _check_local_data(benches, data_dir)  # wrong or shared files: say so before any model loads
    except BenchDataError as exc:
        raise UsageError(str(exc)) from None
    if args.revision and data_dir is not None:
        from ..bench.harness import _data_path

        if all(_data_path(data_dir, get_spec(b)) is not None for b in benches):
            raise UsageError("--revision pins the hub dataset, but every benchmark reads local files (--data-dir), "
                             "so it would be ignored; drop one of the two")
    from .. import distributed

    if distributed.init_from_env():  # torchrun / accelerate launch: score shards, rank 0 writes the report
        device = distributed.local_device(kwargs.get("device"))
        if device is not None:
            kwargs["device"] = device
        args.no_progress = args.no_progress or distributed.rank() != 0
    reward = load_reward_cli(args.reward, args.config, kwargs)
    cache_dir = None if args.no_cache else (args.cache_dir if args.cache_dir else "default")
    try:
        result = evaluate(reward, benches, data_dir=data_dir, cache_dir=cache_dir,
                          batch_size=args.batch_size, limit=args.limit, mode=args.mode, n_boot=args.bootstrap,
                          seed=args.seed, per_sample=args.per_sample, ignore_sources=args.ignore_sources,
                          wrong_examples=args.wrong_examples,
                          retry_invalid=args.retry_invalid, by=args.by, revision=args.revision,
                          progress=not args.no_progress)
    except BenchDataError as exc:
        raise UsageError(str(exc)) from None
    result.reward["name"] = args.reward
    if distributed.rank() != 0:  # the same record on every rank: the same exit code (rank 0 prints)
        return distributed.exit_together(_summary(result.to_dict(), quiet=True))
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = record_stem(args.reward, args.model, result.reward["fingerprint"])
    if (out / f"{stem}.json").exists():
        print(f"note: replacing {out / f'{stem}.json'} (an earlier run of the same reward configuration)",
              file=sys.stderr)
    json_path = result.save(out / f"{stem}.json")
    md = result.markdown()
    (out / f"{stem}.md").write_text(md, encoding="utf-8")
    print(md)
    rec = result.to_dict()
    plot_path = args.plot or out / f"{stem}.png"
    if any(not br.get("skipped") for br in rec["benchmarks"].values()):
        plot_records([rec], plot_path)
        print(f"wrote {json_path}, {out / f'{stem}.md'} and {plot_path}", file=sys.stderr)
    else:
        print(f"wrote {json_path} and {out / f'{stem}.md'} (every benchmark was skipped: no plot)", file=sys.stderr)
    t = result.timing
    print(f"time: {t['total_s']:.1f}s total, {t['reward_s']:.1f}s in the reward, {t['harness_s']:.1f}s harness",
          file=sys.stderr)
    return distributed.exit_together(_summary(rec))


def record_stem(reward: str, model: str | None, fingerprint: str) -> str:
    """``<reward>[-<model dir>]-<config fingerprint[:8]>``: one name per reward configuration (``--set``
    options, the judge, ``--config`` all enter the fingerprint), so runs of one reward with different
    options never overwrite each other."""
    return _safe(reward + ("-" + Path(model).name if model else "") + "-" + str(fingerprint)[:8])


def _check_local_data(benches: list[str], data_dir) -> None:
    """With --data-dir: every benchmark finds files naming its split / config, and no two share files."""
    if data_dir is None:
        return
    from ..bench.data import check_distinct_files, resolve_local_files
    from ..bench.harness import _data_path
    from ..bench.spec import get_spec

    resolved = {}
    for b in benches:
        spec = get_spec(b)
        root = _data_path(data_dir, spec)
        if root is None or not root.exists():
            continue  # the loader reports it (or, for a mapping without this benchmark, loads from the hub)
        if root.is_dir() and (root / "state.json").is_file():
            files = [root / "state.json"]  # a save_to_disk folder: one dataset
        else:
            files = resolve_local_files(spec, root)
        resolved[spec.name] = (spec, files)
    check_distinct_files(resolved)


def _summary(rec: dict, quiet: bool = False) -> int:
    """Warnings and the exit code: 3 when some scores / judgements were invalid, with a loud line when all were.
    ``quiet``: the exit code only (ranks other than 0 under torchrun)."""
    import contextlib
    import io

    from . import EXIT_INVALID, EXIT_OK

    if quiet:
        with contextlib.redirect_stderr(io.StringIO()):
            return _summary(rec)
    bad = total = 0
    for name, br in rec["benchmarks"].items():
        if br.get("skipped"):
            print(f"warning: {name} skipped: {br['skipped']}", file=sys.stderr)
            continue
        for w in (br.get("data") or {}).get("warnings", []):
            print(f"warning: {w}", file=sys.stderr)
        c = br.get("counts") or {}
        n = c.get("n_unique_samples", c.get("n_unique_pairs", 0))
        k = c.get("n_invalid_samples", c.get("n_invalid_judgements", 0))
        total += n
        bad += k
        if n and k == n:
            print(f"warning: {name}: every score is invalid ({k} of {n}); the metrics mean nothing. Reasons: "
                  f"{c.get('invalid_reasons')}", file=sys.stderr)
        elif k:
            print(f"warning: {name}: {k} of {n} invalid; reasons: {c.get('invalid_reasons')}", file=sys.stderr)
    if total and bad == total:
        print(f"error: every score of this run is invalid ({bad} of {total})", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_INVALID if bad else EXIT_OK


def _run_geneval(args: argparse.Namespace) -> int:
    """``rewardkit bench geneval --images DIR``: the official per-image results and summary (rewardkit.bench.geneval)."""
    from ..bench import geneval as ge
    from ..config import parse_overrides
    from ._common import load_reward_cli

    if args.images is None:
        raise UsageError("rewardkit bench geneval needs --images DIR (one folder per prompt: metadata.jsonl + samples/)")
    if args.benchmark or args.report or args.list or args.write_synthetic is not None:
        raise UsageError("rewardkit bench geneval takes --images, not --benchmark / --report / --list")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    try:
        rows = ge.read_metadata_file(args.metadata) if args.metadata is not None else None
        folders = ge.read_layout(args.images, rows)
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    kwargs = parse_overrides(args.overrides)
    for key in ("model", "device", "dtype"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    reward = load_reward_cli(args.reward or "geneval", args.config, kwargs)
    n = sum(len(f.images) for f in folders)
    print(f"scoring {n} images of {len(folders)} prompts with {reward.name}", file=sys.stderr)
    records = ge.score_layout(folders, reward, batch_size=args.batch_size or 16)
    out = ge.write_results(records, args.outfile or args.output_dir / "geneval_results.jsonl")
    print(ge.format_summary(ge.summarize(records)), end="")
    print(f"wrote {out}", file=sys.stderr)
    return 0
