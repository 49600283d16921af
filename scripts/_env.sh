# Sourced by scripts/*.sh: create or reuse the local virtual environment and install rewardkit with the
# extras given in $1 (comma-separated). Re-runs are cheap: a stamp keyed on the extras and pyproject.toml
# skips pip when nothing changed.
set -euo pipefail
EXTRAS="${1:-hf}"
VENV="${REWARDKIT_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[rewardkit] creating virtual environment $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
hash=$(sha1sum pyproject.toml | cut -c1-12)
stamp="$VENV/.rewardkit-${EXTRAS//,/_}-$hash"
if [ ! -f "$stamp" ]; then
  echo "[rewardkit] installing rewardkit-vision[$EXTRAS] into $VENV" >&2
  python -m pip install -q --upgrade pip
  # Install torch first and explicitly: an unpinned resolve could pick a multi-GB CUDA build. On the CI
  # machines `torch==2.13.0` resolves to a local CPU wheel; elsewhere set REWARDKIT_TORCH to your choice.
  if ! python -c "import torch" 2>/dev/null; then
    # A local wheel directory (our CI machines keep a CPU build of torch in /opt/wheels) is searched
    # explicitly too, in case PIP_FIND_LINKS is not in the environment.
    links=()
    if [ -z "${PIP_FIND_LINKS:-}" ] && [ -d /opt/wheels ]; then links=(--find-links /opt/wheels); fi
    # shellcheck disable=SC2086
    python -m pip install -q "${links[@]}" ${REWARDKIT_TORCH:-torch==2.13.0}
  fi
  python -m pip install -q -e ".[$EXTRAS]"
  touch "$stamp"
fi
