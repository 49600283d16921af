"""``rewardkit compose``: prepare rubric caches offline and score images with a composite reward from YAML.

    rewardkit compose prepare --config recipes/arena_rubric/stage2.yaml --prompts prompts.txt
    rewardkit compose score --config recipes/arena_rubric/stage2.yaml --jsonl items.jsonl -o scores.jsonl
    rewardkit compose score --config stage2.yaml --jsonl items.jsonl --set gating=none detectors.mode=additive

``prepare`` runs the text-only judge calls once per prompt: faithfulness question trees, intent labels and
constraint questions (strict prompts), detector enablement; each lands in the cache file the YAML names.
``score`` reads JSONL lines ``{"prompt", "image", "metadata"?: {...}, "reference_image"?: path}``
(relative paths resolve against the JSONL's folder) and scores them in batches of ``--batch-size``: the
z-scores are statistics of each batch (use the batch your trainer would see).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub) -> None:
    p = sub.add_parser("compose", help="prepare rubric caches / score with a composite reward (YAML)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="compose_command", metavar="SUBCOMMAND", required=True)
    for name, helptext in (("prepare", "generate question trees, intent labels and detector enablement"),
                           ("score", "score images with the composite reward")):
        q = csub.add_parser(name, help=helptext)
        q.add_argument("--config", "-c", type=Path, required=True, help="YAML with a composite reward section")
        q.add_argument("--section", default="reward", help="key of the composite section ('' = whole file)")
        q.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                       help="override composite options, e.g. gating=none detectors.mode=additive")
        q.add_argument("--judge", help="judge spec overriding the YAML's (e.g. transformers:/path/to/ckpt)")
        q.add_argument("--no-progress", action="store_true")
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
            raise SystemExit(f"rewardkit compose: {args.config} has no mapping {args.section!r}")
        data = dict(data[args.section])
    data = _merge(data, parse_overrides(args.overrides))
    if args.judge:
        data["judge"] = args.judge
    return data


def _read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            rec = json.loads(line)
            line = rec.get("prompt", "")
        if line:
            prompts.append(line)
    return prompts


def _prepare(args: argparse.Namespace) -> int:
    from ..compose.composite import AxisSpec, CompositeConfig
    from ..config import build_config
    from ..judges import load_judge
    from ..registry import get_reward_class

    cfg = build_config(CompositeConfig, _section(args))
    if not cfg.judge:
        raise SystemExit("rewardkit compose prepare: the config names no judge (set `judge:` or pass --judge)")
    judge = load_judge(cfg.judge)
    prompts = _read_prompts(args.prompts)
    specs = [(a.name, a.reward, a.options) for a in map(AxisSpec.parse, cfg.axes)]
    if cfg.detectors and cfg.detectors.get("mode", "veto") != "off":
        specs.append(("detectors", cfg.detectors.get("reward", "detectors"), cfg.detectors.get("options") or {}))
    done = 0
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
        print(f"{name}: {len(prompts)} prompts prepared -> {where or '(in memory only: set a cache path)'}",
              file=sys.stderr)
        done += 1
    if not done:
        print("nothing to prepare: no judge-based axis in the config", file=sys.stderr)
    return 0


def _score(args: argparse.Namespace) -> int:
    from ..compose.composite import build_composite

    if args.batch_size < 1:
        raise SystemExit("rewardkit compose score: --batch-size must be >= 1")
    comp = build_composite(_section(args))
    if not args.jsonl.is_file():
        raise FileNotFoundError(f"JSONL file not found: {args.jsonl}")
    base = args.jsonl.parent
    items = []
    with args.jsonl.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec, dict) or "prompt" not in rec or "image" not in rec:
                raise SystemExit(f"rewardkit compose score: {args.jsonl}:{lineno}: needs 'prompt' and 'image'")
            meta = dict(rec.get("metadata") or {})
            if rec.get("reference_image"):
                meta["reference_image"] = str(base / rec["reference_image"])
            items.append({"image": str(base / rec["image"]), "prompt": rec["prompt"], "metadata": meta})
    out_fh = args.output.open("w", encoding="utf-8") if args.output else None
    from tqdm.auto import tqdm

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
                score = f"{rec['score']:.4f}" if rec["valid"] else f"NaN ({rec['error']})"
                print(f"{it['image']}\t{score}")
    finally:
        if out_fh:
            out_fh.close()
    return 0


def run(args: argparse.Namespace) -> int:
    return _prepare(args) if args.compose_command == "prepare" else _score(args)
