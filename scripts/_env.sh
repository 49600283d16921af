# Sourced by scripts/*.sh: create or reuse the virtual environment and install rewardkit with the extras
# given in $1 (comma-separated). Works from any working directory: paths are resolved against the repository
# root, and the caller's directory is left unchanged. Re-runs are cheap: a stamp keyed on the extras and
# pyproject.toml skips pip when nothing changed (an environment installed with `all` serves `hf` too).
#
# Environment variables:
#   REWARDKIT_VENV   the virtual environment to create / reuse (default: <repo>/.venv; relative paths are
#                    relative to the repository root)
#   REWARDKIT_TORCH  what to pip-install for PyTorch before anything else (default: torch==2.13.0), with
#                    any pip options, e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
#   REWARDKIT_SKIP_INSTALL=1  use the environment as it is (you installed rewardkit yourself)
#   PYTHON           the interpreter that creates the environment (default: python3)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1:-hf}"
VENV="${REWARDKIT_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO/$VENV" ;; esac
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[rewardkit] creating virtual environment $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
hash=$(sha1sum "$REPO/pyproject.toml" | cut -c1-12)

_rk_expand() {  # extras list (comma or underscore separated) -> one per line, `all` expanded
  tr ',_' '\n\n' <<<"$1" | sed 's/^all$/hf\njudge\ntrain\nrl\nbench\nocr/' | sort -u
}
_rk_installed() {  # does an existing stamp (same pyproject) cover every requested extra?
  local want have s
  want=$(_rk_expand "$EXTRAS")
  for s in "$VENV"/.rewardkit-*-"$hash"; do
    [ -e "$s" ] || continue
    have=$(_rk_expand "$(basename "$s" | sed "s/^\.rewardkit-//; s/-$hash\$//")")
    if [ -z "$(comm -23 <(echo "$want") <(echo "$have"))" ]; then return 0; fi
  done
  return 1
}

_rk_step() {  # one line per install stage, so a first run (minutes of pip) is never silent
  echo "[rewardkit] step $1/3 ($(( SECONDS - _rk_t0 )) s): $2" >&2
}

stamp="$VENV/.rewardkit-${EXTRAS//,/_}-$hash"
if [ "${REWARDKIT_SKIP_INSTALL:-0}" != 1 ] && ! _rk_installed; then
  _rk_t0=$SECONDS
  echo "[rewardkit] installing rewardkit-vision[$EXTRAS] into $VENV: a first run downloads and installs" \
    "PyTorch and the extras' packages (several minutes; later runs skip this)" >&2
  _rk_step 1 "upgrading pip"
  python -m pip install -q --upgrade pip
  # Install torch first and explicitly: an unpinned resolve could pick a multi-GB CUDA build. On the CI
  # machines `torch==2.13.0` resolves to a local CPU wheel; elsewhere set REWARDKIT_TORCH to your choice.
  if ! python -c "import torch" 2>/dev/null; then
    # A local wheel directory (our CI machines keep a CPU build of torch in /opt/wheels) is searched
    # explicitly too, in case PIP_FIND_LINKS is not in the environment.
    links=()
    if [ -z "${PIP_FIND_LINKS:-}" ] && [ -d /opt/wheels ]; then links=(--find-links /opt/wheels); fi
    _rk_step 2 "installing PyTorch (${REWARDKIT_TORCH:-torch==2.13.0}): a download of about 200 MB for a CPU" \
      "build, several GB for a CUDA one; usually the longest step"
    # shellcheck disable=SC2086
    python -m pip install -q "${links[@]}" ${REWARDKIT_TORCH:-torch==2.13.0}
  else
    _rk_step 2 "PyTorch is already installed: kept"
  fi
  _rk_step 3 "installing rewardkit-vision[$EXTRAS] and its dependencies (transformers and the extras' packages)"
  python -m pip install -q -e "$REPO[$EXTRAS]"
  touch "$stamp"
  echo "[rewardkit] installed in $(( SECONDS - _rk_t0 )) s" >&2
fi
