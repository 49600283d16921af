#!/usr/bin/env bash
# The test suite: creates / reuses .venv, installs rewardkit with every extra but vllm and docs (ray included), installs the system
# tools the tests need (tesseract, chromium, nginx), runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .ci/install-system-deps.sh ]; then
  bash .ci/install-system-deps.sh
fi
. scripts/_env.sh all,dev,ray
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
set +e
python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[rewardkit] pytest collected no tests" >&2
fi
exit "$rc"
