#!/usr/bin/env bash
# Mutation testing of the pure core with mutmut (a habit, not a CI step; see benchmarks/README.md).
#
#   bash scripts/mutation.sh                      # every module below
#   bash scripts/mutation.sh metrics functions    # some of them (names from the table below)
#
# Each module is mutated in a scratch copy of the repository that holds ONLY its own test files, so a mutant
# must be killed by the tests meant for that module. Runs under `nice -n 19` with a per-module time limit
# (MUTATION_TIMEOUT seconds, default 900) and MUTATION_JOBS workers (default 2). MUTATION_SAMPLE=N tests a
# seeded random sample of N mutants per module (default 0 = all; a module such as bench/metrics.py has ~1000
# mutants, about an hour on 2 busy cores). Prints the surviving mutants and one score line per module:
# killed / (killed + survived); timeouts count as killed, "no tests" as survived. MUTATION_SEED (default 0) seeds
# the sample; each module's commit, seed, sample and per-mutant status go to MUTATION_RECORDS/<module>-*.json.
# Needs `pip install mutmut` (in the `dev` extra).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"
TIMEOUT="${MUTATION_TIMEOUT:-900}"
JOBS="${MUTATION_JOBS:-2}"
WORK="${MUTATION_WORKDIR:-$(mktemp -d -t rewardkit-mutation-XXXX)}"

SAMPLE="${MUTATION_SAMPLE:-0}"
SEED="${MUTATION_SEED:-0}"
# Every run is recorded so a row of benchmarks/README.md can be reproduced: the commit (and whether the tree had
# uncommitted changes), the seed, the sample size and every tested mutant with its status, as one JSON file per
# module under MUTATION_RECORDS (default: benchmarks/mutation/, committed beside the table it backs).
RECORDS="${MUTATION_RECORDS:-$ROOT/benchmarks/mutation}"
mkdir -p "$RECORDS"
COMMIT="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git -C "$ROOT" status --porcelain -- rewardkit tests 2>/dev/null)" ]; then COMMIT="$COMMIT+dirty"; fi

# name | files to mutate (space separated) | mutant-name globs ("*" = every function) | its test files
# Keep slow tests out of these lists: mutmut's first (stats) run does not apply -m "not slow", and the scratch copy
# has no examples/ (compose/test_soup_preference.py is one; compose/test_soup_contracts.py covers soup_preference_models
# fast).
MODULES=(
  "metrics|rewardkit/bench/metrics.py|*|tests/bench/test_metrics.py tests/contract/test_properties.py tests/bench/test_metrics_contracts.py"
  "functions|rewardkit/compose/functions.py|*|tests/compose/test_composite.py tests/contract/test_properties.py tests/compose/test_functions_contracts.py"
  "losses|rewardkit/train/losses.py|*|tests/train/test_losses.py tests/train/test_losses_contracts.py"
  "parsers|rewardkit/rewards/evr.py rewardkit/compose/rubric.py rewardkit/judges/openai_backend.py rewardkit/judges/policy.py|*.x_parse_hypothesis__* *.x_parse_intent__* *.x_parse_question_list__* *.x_read_choice_logprobs__* *.x_usable_rows__*|tests/judges/test_parsers.py tests/judges/test_parser_contracts.py"
  "soup|rewardkit/compose/soup.py|*|tests/compose/test_soup.py tests/compose/test_soup_patterns.py tests/compose/test_soup_contracts.py"
  "media|rewardkit/media.py|*|tests/contract/test_bad_inputs.py tests/contract/test_properties.py tests/contract/test_exif_orientation.py tests/contract/test_media_contracts.py"
  "reward|rewardkit/reward.py|*|tests/contract/test_reward_base.py tests/contract/test_bad_inputs.py tests/contract/test_properties.py tests/contract/test_reward_contracts.py"
  "integrations|rewardkit/integrations/_common.py|*|tests/integrations/test_adapters.py"
  "nft|rewardkit/rl/nft.py|*|tests/rl/test_math.py tests/rl/test_nft_float64.py"
  "exploration|rewardkit/rl/exploration.py|*|tests/rl/test_exploration.py tests/rl/test_math.py"
  "server|rewardkit/serve/server.py rewardkit/serve/batch.py|*|tests/serve/test_server.py"
  "output|rewardkit/datasets/output.py|*|tests/datasets/test_output_contracts.py"
  "binary|rewardkit/serve/binary.py rewardkit/serve/wire.py|*|tests/serve/test_binary_contracts.py"
  "parrot_format|rewardkit/parrot/format.py|*|tests/rewards/test_rational.py tests/parrot/test_format_contracts.py"
  "expr|rewardkit/datasets/expr.py|*|tests/datasets/test_filter.py"
  "secrets|rewardkit/serve/secrets.py|*|tests/serve/test_secrets.py"
  "flow_grpo|rewardkit/integrations/flow_grpo.py|*|tests/integrations/test_flow_grpo.py tests/integrations/test_adapters.py tests/integrations/test_adapter_options.py tests/integrations/test_group_hosts.py tests/integrations/test_flow_grpo_contracts.py"
  "evaluation|rewardkit/rl/evaluation.py|*|tests/rl/test_evaluation.py tests/rl/test_evaluation_contracts.py"
)

want=("$@")
summary=()
for entry in "${MODULES[@]}"; do
  IFS='|' read -r name module globs tests <<<"$entry"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " ${name} " ]]; then continue; fi
  missing=""
  for f in $module; do [ -f "$ROOT/$f" ] || missing="$missing $f"; done
  if [ -n "$missing" ]; then
    echo "[mutation] $name:$missing not found (moved?): skipped"; summary+=("$name  skipped (no$missing)"); continue
  fi
  dir="$WORK/$name"
  rm -rf "$dir" && mkdir -p "$dir/tests"
  cp -r "$ROOT/rewardkit" "$dir/rewardkit"
  # the scratch tests/ keeps the suite's layout: the root conftest, tests/helpers, and each listed file at its path
  # with its folder's __init__.py and conftest.py
  cp "$ROOT/tests/__init__.py" "$ROOT/tests/conftest.py" "$dir/tests/"
  if [ "$name" = expr ]; then
    # mutmut calls every function of the mutated file through a trampoline (extra frames per call): the recursive
    # descent parser then hit Python's recursion limit (1000) before its own 64-level nesting refusal. Doubled
    # in the scratch copy only; a 3000-operator chain still overflows it, as the test of that refusal needs
    printf '\nimport sys as _sys\n\n_sys.setrecursionlimit(2000)  # scripts/mutation.sh: trampolines\n' >>"$dir/tests/conftest.py"
  fi
  cp -r "$ROOT/tests/helpers" "$dir/tests/helpers"
  for t in $tests; do
    [ -f "$ROOT/$t" ] || continue
    sub="$(dirname "$t")"
    mkdir -p "$dir/$sub"
    cp "$ROOT/$t" "$dir/$t"
    for f in __init__.py conftest.py; do [ -f "$ROOT/$sub/$f" ] && cp "$ROOT/$sub/$f" "$dir/$sub/"; done
  done
  cp -r "$ROOT/recipes" "$dir/recipes" 2>/dev/null || true
  find "$dir" -name __pycache__ -prune -exec rm -rf {} +
  # mutmut reads [tool.mutmut] from pyproject.toml, else setup.cfg: give it a setup.cfg and a bare pyproject
  printf '[project]\nname = "rewardkit-mutation-scratch"\nversion = "0"\n[tool.pytest.ini_options]\nmarkers = ["slow", "gpu", "distributed"]\n' >"$dir/pyproject.toml"
  {
    echo "[mutmut]"
    echo "source_paths = rewardkit/"
    echo "only_mutate ="
    for f in $module; do echo "    $f"; done
    echo "process_isolation = forkserver"
    echo "also_copy = recipes"   # mutmut runs the tests in mutants/: test_parrot.py reads recipes/parrot/tiny.yaml
    # mutmut stops a mutant's tests after (their clean time + constant) x multiplier and counts it killed
    # ("timeout"). Its defaults (1 s, 15) stopped message-only mutants on the loaded shared machine (nice 19),
    # where rebuilding a session fixture such as tiny_clip_dir in each mutant's process alone took ~100 s
    echo "timeout_multiplier = ${MUTATION_TIMEOUT_MULTIPLIER:-60}"
    echo "timeout_constant = ${MUTATION_TIMEOUT_CONSTANT:-10}"
    echo "pytest_add_cli_args = -p no:cacheprovider -q -m \"not slow and not gpu\""
  } >"$dir/setup.cfg"
  echo "[mutation] $name: $module ($globs) against: $tests (limit ${TIMEOUT}s, sample ${SAMPLE:-all})"
  start=$(date +%s)
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  export REWARDKIT_PROPERTY_EXAMPLES="${REWARDKIT_PROPERTY_EXAMPLES:-10}"  # per mutant
  set -f  # the globs are mutmut's, not the shell's
  if [ "$SAMPLE" -gt 0 ] || [ "$globs" != "*" ]; then
    # generate every mutant and collect the test statistics (the name matches no mutant: mutmut stops before
    # testing any), then pick the names to test; only those are tested, in the run below
    (cd "$dir" && timeout "$TIMEOUT" nice -n 19 "$PY" -m mutmut run --max-children "$JOBS" "generate-only__mutmut_0" >"$dir/gen.log" 2>&1)
    names=$("$PY" - "$dir" "$SAMPLE" "$SEED" $globs <<'PYEOF'
import fnmatch, json, pathlib, random, sys
d, n, seed, globs = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
keys = sorted(k for meta in d.glob("mutants/**/*.py.meta") for k in json.loads(meta.read_text())["exit_code_by_key"])
keys = [k for k in keys if any(fnmatch.fnmatch(k, g) for g in globs)]
if n and len(keys) > n:
    keys = sorted(random.Random(seed).sample(keys, n))
(d / "selected.txt").write_text("\n".join(keys) + "\n")
print(" ".join(keys))
PYEOF
)
  else
    names=""
  fi
  (cd "$dir" && timeout "$TIMEOUT" nice -n 19 "$PY" -m mutmut run --max-children "$JOBS" $names >"$dir/run.log" 2>&1)
  rc=$?
  set +f
  line=$("$PY" - "$dir" "$rc" "$(( $(date +%s) - start ))" "$name" "$COMMIT" "$SEED" "$SAMPLE" "$module" "$tests" "$RECORDS" <<'PYEOF'
import json, pathlib, sys, time
d, rc, secs, name = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
commit, seed, sample, module, tests, records = sys.argv[5:11]
codes = {k: v for meta in d.glob("mutants/**/*.py.meta") for k, v in json.loads(meta.read_text())["exit_code_by_key"].items()}
sel = d / "selected.txt"
if sel.exists():
    codes = {k: codes.get(k) for k in sel.read_text().split()}
from mutmut.stats import status_by_exit_code as status
st = {k: status[v] for k, v in codes.items()}
killed = [k for k, s in st.items() if s in ("killed", "timeout", "caught by type check", "segfault")]
survived = [k for k, s in st.items() if s in ("survived", "no tests")]
left = [k for k, s in st.items() if k not in killed and k not in survived]
for k in survived:
    print(f"    {st[k]}: {k}")
total = len(killed) + len(survived)
score = 100.0 * len(killed) / total if total else float("nan")
note = " (time limit hit: partial)" if rc == "124" or left else ""
record = {"module": name, "files": module.split(), "tests": tests.split(), "commit": commit, "seed": int(seed),
          "sample": int(sample), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": int(secs),
          "killed": len(killed), "survived": len(survived), "unchecked": len(left), "score": round(score, 2),
          "mutants": dict(sorted(st.items()))}
out = pathlib.Path(records) / f"{name}-{commit[:12]}-seed{seed}-n{sample}.json"
out.write_text(json.dumps(record, indent=1) + "\n")
print(f"    record: {out}")
print(f"RESULT {name:10s} killed {len(killed):4d}  survived {len(survived):4d}  unchecked {len(left):4d}  "
      f"score {score:5.1f}%  {secs}s{note}")
PYEOF
)
  echo "[mutation] $name: surviving mutants (\`mutmut show <name>\` in $dir prints the diff):"
  echo "$line" | grep -v '^RESULT'
  line=$(echo "$line" | grep '^RESULT' | sed 's/^RESULT //')
  echo "[mutation] $line"
  summary+=("$line")
done
echo
echo "== mutation scores (scratch: $WORK) =="
printf '%s\n' "${summary[@]}"
