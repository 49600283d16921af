#!/usr/bin/env bash
# The test suite against the LOWEST versions our declared ranges allow: a separate virtual environment
# (.venv-min, or $REWARDKIT_MIN_VENV) where every direct dependency of `.[all,dev]` is resolved to its lowest
# compatible version (uv's --resolution lowest-direct), then pytest. Extra arguments go to pytest.
# torch is the exception: its old floors exist on PyPI only as multi-GB CUDA builds, so the environment's
# torch (REWARDKIT_TORCH, default torch==2.13.0, a local CPU wheel on our CI machines) is used.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .ci/install-system-deps.sh ]; then
  bash .ci/install-system-deps.sh
fi
VENV="${REWARDKIT_MIN_VENV:-.venv-min}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[rewardkit] creating virtual environment $VENV (lowest dependency versions)" >&2
  "$PY" -m venv "$VENV"
fi
links=()
if [ -z "${PIP_FIND_LINKS:-}" ] && [ -d /opt/wheels ]; then links=(--find-links /opt/wheels); fi
"$VENV/bin/python" -m pip install -q --upgrade pip uv
# torch first and explicitly, as scripts/_env.sh does (an unpinned resolve could pick a multi-GB CUDA build);
# the resolver below then keeps the installed build (the override pins its version).
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q "${links[@]}" ${REWARDKIT_TORCH:-torch==2.13.0}
fi
override="$(mktemp)"
trap 'rm -f "$override"' EXIT
echo "torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')" > "$override"
"$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --resolution lowest-direct "${links[@]}" \
  --override "$override" -e ".[all,dev]"
echo "[rewardkit] lowest versions installed:" >&2
"$VENV/bin/python" - <<'PY' >&2
from importlib import metadata
names = ["torch", "transformers", "accelerate", "safetensors", "tokenizers", "peft", "trl", "datasets",
         "diffusers", "httpx", "numpy", "pillow", "scipy", "matplotlib", "pyarrow", "xxhash", "pytesseract",
         "starlette", "uvicorn", "pyyaml", "tqdm", "hypothesis"]
found = []
for n in names:
    try:
        found.append(f"{n} {metadata.version(n)}")
    except metadata.PackageNotFoundError:
        pass
print("  " + ", ".join(found))
PY
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
set +e
"$VENV/bin/python" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[rewardkit] pytest collected no tests" >&2
fi
exit "$rc"
