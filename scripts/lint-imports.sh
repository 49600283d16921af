#!/usr/bin/env bash
# The import contracts of docs/architecture.md (`.importlinter`): fails when a module imports across its layer.
# Creates / reuses .venv with the `dev` extra (import-linter), like scripts/test.sh. Extra arguments go to
# lint-imports (e.g. --verbose).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_env.sh all,dev,ray
exec lint-imports --no-cache "$@"
