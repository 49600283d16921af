#!/usr/bin/env bash
# The documentation site (MkDocs + Material + mkdocstrings; config in mkdocs.yml, generated pages in
# scripts/docs_hooks.py). Creates / reuses .venv and installs rewardkit with the `docs` extra.
#
#   bash scripts/docs.sh build     # strict build into site/ (a broken link or API reference fails), as CI runs it
#   bash scripts/docs.sh serve     # live preview on http://127.0.0.1:8000
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_env.sh docs
export NO_MKDOCS_2_WARNING=1 COLUMNS=100
case "${1:-build}" in
  build) exec python -m mkdocs build --strict ;;
  serve) exec python -m mkdocs serve --dev-addr 127.0.0.1:8000 ;;
  *) echo "usage: bash scripts/docs.sh [build|serve]" >&2; exit 2 ;;
esac
