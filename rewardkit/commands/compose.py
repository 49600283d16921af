"""``rewardkit compose``: prepare rubric caches offline and score images with a composite reward from YAML."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import EXIT_CODES_HELP, EXIT_INVALID, EXIT_OK, UsageError, count, invalid_summary

DESCRIPTION = """Prepare rubric caches offline, and score images with a composite reward described in YAML.
Examples (the recipes need a real judge model: set judge: in the YAML or pass --judge):
  rewardkit compose prepare --config recipes/arena_rubric/stage2.yaml --prompts prompts.txt
  rewardkit compose score --config recipes/arena_rubric/stage2.yaml --jsonl items.jsonl -o scores.jsonl
  rewardkit compose score --config stage2.yaml --jsonl items.jsonl --set gating=none detectors.mode=additive

prepare runs the text-only judge calls once per prompt (faithfulness question trees, intent labels and
constraint questions for strict prompts, detector enablement); each lands in the cache file the YAML names.
The prompts file holds one prompt per line, or JSON lines with a "prompt" key.
score reads JSONL lines {"prompt", "image", "metadata"?: {...}, "reference_image"?: path} (relative paths
resolve against the JSONL's folder) and scores them in batches of --batch-size: the z-scores are statistics
of each batch (use the batch your trainer would see)."""


def add_parser(sub) -> None:
    p = sub.add_parser("compose", help="prepare rubric caches / score with a composite reward (YAML)",
                       description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="compose_command", metavar="SUBCOMMAND", required=True)
    for name, helptext in (("prepare", "generate question trees, intent labels and detector enablement"),
                           ("score", "score images with the composite reward")):
        q = csub.add_parser(name, help=helptext, description=DESCRIPTION, epilog=EXIT_CODES_HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        q.add_argument("--config", "-c", type=Path, required=True, help="YAML with a composite reward section")
        q.add_argument("--section", default="reward", help="key of the composite section ('' = whole file)")
        q.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                       help="override composite options, e.g. gating=none detectors.mode=additive")
        q.add_argument("--judge", help="judge spec overriding the YAML's (e.g. transformers:/path/to/ckpt)")
        q.add_argument("--no-progress", action="store_true", help="hide progress bars")
        if name == "prepare":
            q.add_argument("--prompts", type=Path, required=True, help="text file, one prompt per line (or JSONL)")
        else:
            q.add_argument("--jsonl", type=Path, required=True, help="items to score")
            q.add_argument("--output", "-o", type=Path, help="JSONL results")
            q.add_argument("--batch-size", type=int, default=64, help="samples per composite call (z-score batch)")


def _section(args: argparse.Namespace) -> dict[str, Any]:
    from ..config import _read_yaml, _merge, parse_overrides

    data = _read_yaml(args.config)
    if args.section:
        if not isinstance(data.get(args.section), dict):
            raise UsageError(f"{args.config} has no mapping {args.section!r} (pick the section with --section)")
        data = dict(data[args.section])
    data = _merge(data, parse_overrides(args.overrides))
    if args.judge:
        data["judge"] = args.judge
    return data


def _read_prompts(path: Path) -> list[str]:
    """Unique prompts of a text file (one per line) or JSON lines with a "prompt" key, in order."""
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not JSON ({exc})") from None
            line = rec.get("prompt") if isinstance(rec, dict) else None
            if not isinstance(line, str) or not line.strip():
                raise UsageError(f"{path}:{lineno}: a JSON line needs a non-empty string 'prompt'")
        prompts.append(line)
    if not prompts:
        raise UsageError(f"{path}: no prompts (the file is empty)")
    return list(dict.fromkeys(prompts))


def _prepared_counts(reward: Any, prompts: list[str]) -> tuple[str, int]:
    """What the cache now holds for ``prompts``: a summary line and the number of prompts that failed."""
    cache = getattr(reward, "cache", None)
    recs = [(cache.get(p) if cache is not None else None) or {} for p in prompts]
    parts, failed = [], 0
    if any("intent" in r or "intent_error" in r for r in recs):
        labelled = [r.get("intent") for r in recs if r.get("intent") is not None]
        n_fail = sum(1 for r in recs if r.get("intent") is None)
        strict = sum(1 for x in labelled if x == "strict")
        parts.append(f"intent labelled for {len(labelled)} of {len(prompts)} ({strict} strict, {n_fail} unparsed)")
        failed += n_fail
    with_q = [r for r in recs if "questions" in r]
    if with_q or getattr(reward, "prepare", None) is not None and not parts:
        ok = sum(1 for r in with_q if r.get("questions"))
        bad = len(with_q) - ok
        parts.append(f"question trees parsed for {ok} of {len(with_q)} prompts asked ({bad} unparsed)")
        failed += bad
    if any("applies" in r for r in recs) or (not parts and hasattr(reward, "enabled_for")):
        n = sum(1 for r in recs if "applies" in r)
        parts.append(f"detector enablement recorded for {n} of {len(prompts)} prompts")
    return "; ".join(parts) or f"{len(prompts)} prompts", failed


def _prepare(args: argparse.Namespace) -> int:
    from ..compose.composite import AxisSpec, CompositeConfig
    from ..config import build_config
    from ..judges import load_judge
    from ..registry import get_reward_class

    cfg = build_config(CompositeConfig, _section(args))
    if not cfg.judge:
        raise UsageError("the config names no judge (set judge: in the YAML or pass --judge)")
    judge = load_judge(cfg.judge)
    prompts = _read_prompts(args.prompts)
    specs = [(a.name, a.reward, a.options) for a in map(AxisSpec.parse, cfg.axes)]
    if cfg.detectors and cfg.detectors.get("mode", "veto") != "off":
        specs.append(("detectors", cfg.detectors.get("reward", "detectors"), cfg.detectors.get("options") or {}))
    print(f"{len(prompts)} unique prompts read from {args.prompts}", file=sys.stderr)
    done, failed = 0, 0
    for name, reward_name, options in specs:
        cls = get_reward_class(reward_name) if reward_name else None
        if cls is None or not getattr(cls, "uses_judge", False):
            continue
        reward = cls(dict(options), judge=judge)
        if hasattr(reward, "prepare"):
            reward.prepare(prompts, progress=not args.no_progress)
        elif hasattr(reward, "enabled_for"):
            reward.enabled_for(prompts)
        where = getattr(reward.config, "questions", "") or getattr(reward.config, "applicability_cache", "")
        summary, n_failed = _prepared_counts(reward, prompts)
        print(f"{name}: {summary} -> {where or '(in memory only: set a cache path)'}", file=sys.stderr)
        done += 1
        failed += n_failed
    if not done:
        print("nothing to prepare: no judge-based axis in the config", file=sys.stderr)
        return EXIT_OK
    if failed:
        print(f"{failed} judge answer(s) did not parse: those prompts have no cached entry to score with "
              "(their scores will be NaN with the reason); see the caches' 'error' fields", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _score(args: argparse.Namespace) -> int:
    from ..compose.composite import build_composite

    if args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    if not args.jsonl.is_file():
        raise FileNotFoundError(f"JSONL file not found: {args.jsonl}")
    base = args.jsonl.parent
    items = []
    with args.jsonl.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{args.jsonl}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{where}: not JSON ({exc})") from None
            if not isinstance(rec, dict) or "prompt" not in rec or "image" not in rec:
                raise UsageError(f"{where}: needs 'prompt' and 'image'")
            if not isinstance(rec["image"], str) or not rec["image"].strip():
                raise UsageError(f"{where}: 'image' must be one path (a string), got {rec['image']!r}")
            if not isinstance(rec["prompt"], str):
                raise UsageError(f"{where}: 'prompt' must be a string, got {rec['prompt']!r}")
            if rec.get("metadata") is not None and not isinstance(rec["metadata"], dict):
                raise UsageError(f"{where}: 'metadata' must be an object, got {rec['metadata']!r}")
            meta = dict(rec.get("metadata") or {})
            if rec.get("reference_image"):
                if not isinstance(rec["reference_image"], str):
                    raise UsageError(f"{where}: 'reference_image' must be a path, got {rec['reference_image']!r}")
                meta["reference_image"] = str(base / rec["reference_image"])
            items.append({"image": str(base / rec["image"]), "prompt": rec["prompt"], "metadata": meta})
    if not items:
        raise UsageError(f"{args.jsonl}: no items (the file is empty)")
    print(f"loading the composite reward from {args.config} ...", file=sys.stderr, flush=True)
    comp = build_composite(_section(args))
    from tqdm.auto import tqdm

    n_batches = -(-len(items) // args.batch_size)
    print(f"scoring {len(items)} image(s) with the composite ({len(comp.axes) if hasattr(comp, 'axes') else '?'}"
          f" axes) in {n_batches} batch(es) of up to {args.batch_size}", file=sys.stderr)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
    out_fh = args.output.open("w", encoding="utf-8") if args.output else None
    n_bad = 0
    width = max(len(it["image"]) for it in items)
    print(f"{'image'.ljust(width)}  score")
    try:
        for s in tqdm(range(0, len(items), args.batch_size), desc="composite", unit="batch",
                      disable=args.no_progress, file=sys.stderr):
            chunk = items[s:s + args.batch_size]
            out = comp([it["image"] for it in chunk], [it["prompt"] for it in chunk],
                       metadata=[it["metadata"] for it in chunk], on_error="nan")
            for it, rec in zip(chunk, out.records()):
                row = {"image": it["image"], "prompt": it["prompt"], **rec}
                if out_fh:
                    out_fh.write(json.dumps(row) + "\n")
                n_bad += not rec["valid"]
                score = f"{rec['score']:.4f}" if rec["valid"] else f"NaN  ({rec['error']})"
                print(f"{it['image'].ljust(width)}  {score}")
            if out_fh:
                out_fh.flush()
    finally:
        if out_fh:
            out_fh.close()
    if args.output:
        print(f"wrote {count(len(items), 'result')} to {args.output}", file=sys.stderr)
    return invalid_summary(n_bad, len(items), "images")


def run(args: argparse.Namespace) -> int:
    return _prepare(args) if args.compose_command == "prepare" else _score(args)
