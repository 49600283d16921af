#!/usr/bin/env bash
# A fresh-shell walk of the README (issue 40): a fresh clone of this repository's committed HEAD, an empty HOME
# (no pip cache, no user configuration), `env -i` (no inherited variables, no activated environment), then the
# README's commands verbatim:
#
#   1. "Get started": its bash block as one shell script (`source .venv/bin/activate` must put `rewardkit` on the
#      PATH of the next line), but `bash scripts/test.sh` (the whole suite, and apt: run with --with-tests);
#   2. "A first result": the score table `bash scripts/score.sh` printed must be the README's, and its bash
#      block runs (a line under a `# ... needs ...` comment is skipped, as the doc-command tests do);
#   3. "In Python": its block runs in the new environment, each bare expression echoed as in a REPL; a comment
#      that shows a value (`# tensor([...])`, `# [None, ...]`) must be what the expression gives.
#
#   bash scripts/readme_walk.sh                # the walk; exit 0 when every step passed
#   bash scripts/readme_walk.sh --with-tests   # also `bash scripts/test.sh` (tens of minutes; needs root for apt)
#   bash scripts/readme_walk.sh --print        # print the commands the walk would run, and the skipped ones
#   KEEP=1 bash scripts/readme_walk.sh         # keep the temporary clone (its path is printed)
#
# Kept from this machine: its pip configuration in /etc (and PIP_FIND_LINKS / PIP_CERT / PIP_EXTRA_INDEX_URL /
# PIP_INDEX_URL when set), so that `torch==2.13.0` resolves as it does here (a local CPU wheel on the CI
# machines, scripts/_env.sh); everything else (pip cache, HOME, PATH beyond /usr/local/bin:/usr/bin:/bin,
# HF caches) starts empty. Uncommitted changes are not in the clone (it says so). PIP_CACHE_DIR, when set, is
# kept too: pip's download cache only (CI passes its own, warm from installing the suite's environment, so the
# walk installs the same packages without downloading them again; the environment it installs into is new).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
MODE=walk
WITH_TESTS=0
for a in "$@"; do
  case "$a" in
    --print) MODE=print ;;
    --with-tests) WITH_TESTS=1 ;;
    *) echo "usage: bash scripts/readme_walk.sh [--print] [--with-tests]" >&2; exit 2 ;;
  esac
done

# the README's blocks -> the commands to run / skip (python3 of the system only reads the README here)
extract() {  # $1: section heading, $2: fence language -> the block's text
  python3 - "$REPO/README.md" "$1" "$2" <<'PY'
import sys
text, head, lang = open(sys.argv[1], encoding="utf-8").read(), sys.argv[2], sys.argv[3]
section = text[text.index("\n## " + head + "\n"):].split("\n## ", 2)[1]
print(section.split("```" + lang + "\n", 1)[1].split("```", 1)[0], end="")
PY
}
plan() {  # a bash block -> "run: <line>" / "skip (<why>): <line>", one per command line
  local needs=0 line
  while IFS= read -r line; do
    case "$line" in
      "") needs=0; continue ;;
      "#"*needs*) needs=1; echo "note: $line"; continue ;;
      "#"*) echo "note: $line"; continue ;;
    esac
    if [ "$needs" = 1 ] || [[ "$line" == *"# needs"* ]]; then
      echo "skip (the comment above it says what it needs): $line"
    elif [[ "$line" == "bash scripts/test.sh"* ]] && [ "$WITH_TESTS" = 0 ]; then
      echo "skip (the whole test suite and apt installs: --with-tests runs it): $line"
    else
      echo "run: $line"
    fi
  done
}
START="$(extract "Get started" bash | plan)"
FIRST="$(extract "A first result" bash | plan)"
PYBLOCK="$(extract "In Python" python)"
TABLE="$(extract "A first result" text)"
if [ "$MODE" = print ]; then
  printf '== Get started\n%s\n== A first result\n%s\n== In Python\n%s\n' "$START" "$FIRST" "$PYBLOCK"
  exit 0
fi

TMP="$(mktemp -d)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$TMP"' EXIT
if [ -n "$(git -C "$REPO" status --porcelain)" ]; then
  echo "[walk] note: uncommitted changes are not part of the walk (it clones HEAD)" >&2
fi
git clone -q "$REPO" "$TMP/rewardkit"
mkdir -p "$TMP/home"
ENV=(env -i "HOME=$TMP/home" "PATH=/usr/local/bin:/usr/bin:/bin" "LANG=C.UTF-8" "TERM=dumb")
for v in PIP_FIND_LINKS PIP_CERT PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CACHE_DIR; do
  if [ -n "${!v:-}" ]; then ENV+=("$v=${!v}"); fi
done
echo "[walk] clone: $TMP/rewardkit (HEAD $(git -C "$REPO" rev-parse --short HEAD)); HOME=$TMP/home" >&2

fail=0
step() {  # $1: name, $2: the commands (one shell script), run in the clone
  local t0=$SECONDS rc=0
  echo "[walk] == $1" >&2
  "${ENV[@]}" bash -euo pipefail -c "$2" > "$TMP/$1.out" 2> "$TMP/$1.err" || rc=$?
  echo "[walk] $1: exit $rc in $(( SECONDS - t0 )) s" >&2
  if [ "$rc" != 0 ]; then
    fail=1
    tail -n 30 "$TMP/$1.err" >&2
  fi
}
commands() { sed -n 's/^run: //p' <<<"$1"; }

step get-started "cd $TMP/rewardkit
$(commands "$START")"
# the score table score.sh printed (stdout of its first step) is the README's
if ! python3 - "$TMP/get-started.out" <<PY
import re, sys
out = open(sys.argv[1], encoding="utf-8").read()
want = """$TABLE"""
rows = [line.split() for line in want.strip().splitlines()]
got = [line.split() for line in out.splitlines()]
missing = [r for r in rows if r not in got]
if missing:
    print("[walk] the README's first-result rows not in score.sh's output:", missing, file=sys.stderr)
    sys.exit(1)
print("[walk] score.sh printed the README's score table", file=sys.stderr)
PY
then fail=1; fi

step first-result "cd $TMP/rewardkit
source .venv/bin/activate
$(commands "$FIRST")"

mkdir -p "$TMP/driver"  # not next to the clone: python puts the script's folder first on sys.path
cat > "$TMP/driver/in_python.py" <<'PY'
# the README's "In Python" block, each statement run in order from the clone's root; a bare expression is
# echoed as a REPL would, and a comment after it that shows a value must be its repr (spaces aside)
import ast, re, sys
src = open(sys.argv[1], encoding="utf-8").read()
lines = src.splitlines()
ns, bad = {}, 0
for node in ast.parse(src).body:
    code = compile(ast.Module([node], []) if not isinstance(node, ast.Expr) else ast.Expression(node.value),
                   "README.md", "exec" if not isinstance(node, ast.Expr) else "eval")
    if not isinstance(node, ast.Expr):
        exec(code, ns)
        continue
    value = eval(code, ns)
    line = lines[node.lineno - 1]
    comment = line.split("#", 1)[1].strip() if "#" in line else ""
    print(f">>> {ast.get_source_segment(src, node)}\n{value!r}")
    if comment[:1] in "[(" or re.match(r"tensor\(", comment):
        got, shown = re.sub(r"\s", "", repr(value)), re.sub(r"\s", "", comment)
        if not shown.startswith(got):
            print(f"[walk] README shows {comment!r} after {ast.get_source_segment(src, node)}, got {value!r}",
                  file=sys.stderr)
            bad += 1
sys.exit(1 if bad else 0)
PY
printf '%s' "$PYBLOCK" > "$TMP/driver/readme_block.py"
step in-python "cd $TMP/rewardkit
.venv/bin/python $TMP/driver/in_python.py $TMP/driver/readme_block.py"

for f in get-started first-result in-python; do
  echo "---- $f (stdout, last lines)"
  tail -n 12 "$TMP/$f.out"
done
if [ "$fail" = 0 ]; then echo "[walk] every step passed" >&2; else echo "[walk] FAILED (see above)" >&2; fi
exit "$fail"
