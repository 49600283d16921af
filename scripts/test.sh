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
# pytest rewrites the asserts of ~290 test modules on every run unless it may cache them in __pycache__ (8 s of
# CPU per run on 2 cores): an environment that forbids bytecode files (PYTHONDONTWRITEBYTECODE, set in many
# container images) would pay that in every inner loop. The caches are git-ignored.
unset PYTHONDONTWRITEBYTECODE
set +e
python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[rewardkit] pytest collected no tests" >&2
fi
exit "$rc"
