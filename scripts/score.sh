#!/usr/bin/env bash
# The main job: score images with a reward.
#   bash scripts/score.sh                      # demo: the fixture edit images, a tiny local CLIP checkpoint
#   bash scripts/score.sh --reward pickscore --model /path/to/PickScore_v1 img1.png img2.png --prompt "a cat"
# Any arguments are passed to `rewardkit score` (see `rewardkit score --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_env.sh hf
export HF_HUB_DISABLE_PROGRESS_BARS=1
if [ "$#" -gt 0 ]; then
  exec rewardkit score "$@"
fi
FIXTURES="${REWARDKIT_FIXTURES:-../shared/fixtures/edit_example}"
MODEL_DIR=".rewardkit_cache/tiny-pickscore"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "[rewardkit] writing a tiny, randomly initialised CLIP checkpoint to $MODEL_DIR (no download)" >&2
  python -c "from rewardkit.testing import save_tiny_checkpoint; save_tiny_checkpoint('clip', '$MODEL_DIR')"
fi
mkdir -p outputs
rewardkit score --reward pickscore --model "$MODEL_DIR" "$FIXTURES"/*.png \
  --prompt "Add a green bowl on the branch" --output outputs/scores.jsonl
echo "[rewardkit] per-image results: outputs/scores.jsonl (tiny random model: the numbers exercise the real code path, they mean nothing)" >&2
