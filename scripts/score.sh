#!/usr/bin/env bash
# The main job: score images with a reward.
#
#   bash scripts/score.sh                          # demo on the images shipped in examples/images/
#   bash scripts/score.sh my_images/ --prompt "a cat"            # a folder or files, tiny demo checkpoint
#   bash scripts/score.sh --reward pickscore --model /models/PickScore_v1 a.png b.png --prompt "a cat"
#
# With no arguments: a text-to-image example (PickScore's code path), an edit example (source + edited
# images through the `preference` reward) and a pairwise `rewardkit compare`, all on tiny, randomly
# initialised checkpoints written locally (no download; the numbers exercise the real code path and mean
# nothing). With arguments: `rewardkit score ARGS` (see `rewardkit score --help`); without --reward / -r
# the tiny demo PickScore checkpoint is used. Relative paths resolve from the directory you run it in.
# Exit status: rewardkit's (0 all scored, 1 internal error, 2 usage / input error, 3 some images invalid).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
. "$REPO/scripts/_env.sh" hf,train
export HF_HUB_DISABLE_PROGRESS_BARS=1
CACHE="${REWARDKIT_DEMO_CACHE:-$REPO/.rewardkit_cache}"  # where the tiny demo checkpoints go
CLIP_DIR="$CACHE/tiny-clip"
PREF_DIR="$CACHE/tiny-preference"

tiny_checkpoints() {  # write the tiny checkpoints once (seeded: the same weights every time)
  if [ ! -f "$CLIP_DIR/config.json" ] || [ ! -f "$PREF_DIR/preference_config.json" ]; then
    echo "[rewardkit] writing tiny, randomly initialised checkpoints to $CACHE (no download)" >&2
    python - "$CLIP_DIR" "$PREF_DIR" <<'PY'
import sys
from pathlib import Path

import torch

from rewardkit.testing import save_tiny_checkpoint

clip_dir, pref_dir = Path(sys.argv[1]), Path(sys.argv[2])
if not (clip_dir / "config.json").is_file():
    save_tiny_checkpoint("clip", clip_dir)
if not (pref_dir / "preference_config.json").is_file():
    from rewardkit.models.preference import PreferenceModel

    torch.manual_seed(0)
    PreferenceModel.from_backbone("tiny:qwen2_5_vl").save_pretrained(pref_dir)
PY
  fi
}

if [ "$#" -gt 0 ]; then
  for a in "$@"; do
    case "$a" in --reward|-r|--reward=*|-r=*|--help|-h) exec rewardkit score "$@" ;; esac
  done
  tiny_checkpoints
  echo "[rewardkit] no --reward given: using the tiny demo PickScore checkpoint ($CLIP_DIR)" >&2
  exec rewardkit score --reward pickscore --model "$CLIP_DIR" "$@"
fi

tiny_checkpoints
cd "$REPO"  # the demo's own paths are relative to the repository root (your arguments never are)
IMAGES="examples/images"
OUT="outputs"
mkdir -p "$OUT"
echo "== 1. text-to-image: PickScore's code path on the three prompts of examples/images/t2i.jsonl" >&2
rewardkit score --reward pickscore --model "$CLIP_DIR" --jsonl "$IMAGES/t2i.jsonl" \
  --output "$OUT/t2i_scores.jsonl" --no-progress
echo >&2
echo "== 2. image editing: a preference model scores two edits of one source (examples/images/edit.jsonl)" >&2
rewardkit score --reward preference --model "$PREF_DIR" --jsonl "$IMAGES/edit.jsonl" \
  --output "$OUT/edit_scores.jsonl" --no-progress
echo >&2
echo "== 3. pairwise: which of two images fits the prompt better, P(A preferred over B)" >&2
rewardkit compare --reward pickscore --model "$CLIP_DIR" "$IMAGES/t2i_red_apple.png" \
  "$IMAGES/t2i_house_sunset.png" --prompt "a red apple on a wooden table" --output "$OUT/compare.jsonl"
echo >&2
echo "== 4. one HTML page of all three results (rewardkit view: no server, no network)" >&2
rewardkit view "$OUT/t2i_scores.jsonl" "$OUT/edit_scores.jsonl" "$OUT/compare.jsonl" -o "$OUT/report.html"
echo "[rewardkit] report: $REPO/$OUT/report.html (open it in a browser)" >&2
echo >&2
echo "[rewardkit] results in $REPO/$OUT: t2i_scores.jsonl, edit_scores.jsonl, compare.jsonl" >&2
echo "[rewardkit] tiny random checkpoints: the numbers exercise the real code path, they mean nothing." >&2
echo "[rewardkit] real weights: bash scripts/score.sh --reward pickscore --model DIR IMAGES... --prompt TEXT" >&2
echo >&2
# the environment is active inside this script only: say how to get `rewardkit` on the PATH of your own shell
echo "[rewardkit] next: activate the environment in your shell to run rewardkit yourself:" >&2
echo "    source $VENV/bin/activate" >&2
echo "    rewardkit ls" >&2
