#!/usr/bin/env bash
# Parity with the official packages: for each published reward model whose official code is on PyPI, build
# a separate virtual environment with that package, write a tiny random checkpoint through the package's own
# model classes, convert it with `rewardkit convert`, score the same images and prompts with the official call
# and with rewardkit, and compare. One line per model (max abs difference, rank agreement), a summary table,
# exit 1 when an RGB input differs by more than the tolerance.
#
#   bash scripts/parity.sh                 # every model
#   bash scripts/parity.sh hpsv2 aesthetic # some of them (hpsv2 imagereward aesthetic hpsv3 vqascore editreward
#                                          # geneval_summary)
#   bash scripts/parity.sh geneval         # GenEval's detector (mmdet 2.x) and colours (open_clip); not in the default list
#
# Tolerance: |official - rewardkit| <= 1e-5 * max(scale, |official|) on every input the official call scores, RGB or
# not (gray, palette, transparent palette, RGBA, LA, 16-bit gray, EXIF-rotated), under rewardkit's default
# input_policy="official"; scale = the model's largest |official score| on RGB inputs (a relative 1e-5 on the
# score's own scale: a tiny random VQAScore judge gives P(Yes) ~ 0.003). input_policy="corrected" is scored too: its
# largest difference per input kind is reported (WORK/<model>/deviation.json, docs/zoo.md "Input policy"), not failed.
# Rank agreement: over each prompt's images, the fraction of image pairs both sides order the same way.
#
# Environment:
#   PARITY_VENVS     where the official packages' environments are cached (default .venv-parity, git-ignored);
#                    each is keyed on its pins, so a rerun with the same pins installs nothing
#   PARITY_KEEP=DIR  keep the work files (inputs, tiny checkpoints, official scores) in DIR
#   RK_PYTHON        the interpreter with rewardkit's dependencies (default: the .venv of scripts/_env.sh);
#                    rewardkit itself is imported from this checkout (PYTHONPATH), or from REWARDKIT_SRC
#   REWARDKIT_TORCH  torch for the official environments (default torch==2.13.0, a local CPU wheel on our machines)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
T0=$SECONDS
step() { printf '[parity %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

MODELS=("$@")
if [ ${#MODELS[@]} -eq 0 ]; then MODELS=(hpsv2 imagereward aesthetic hpsv3 vqascore editreward geneval_summary); fi
VENVS="${PARITY_VENVS:-$ROOT/.venv-parity}"
case "$VENVS" in /*) ;; *) VENVS="$ROOT/$VENVS" ;; esac
PY="${PYTHON:-python3}"
TORCH_SPEC="${REWARDKIT_TORCH:-torch==2.13.0}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

if [ -z "${RK_PYTHON:-}" ]; then
  step "rewardkit environment (scripts/_env.sh hf)"
  # shellcheck disable=SC1091
  . "$ROOT/scripts/_env.sh" hf
  RK_PYTHON="$(command -v python)"
fi
RK_SRC="${REWARDKIT_SRC:-$ROOT}"
RK=(env PYTHONPATH="$RK_SRC${PYTHONPATH:+:$PYTHONPATH}" "$RK_PYTHON")

if [ -n "${PARITY_KEEP:-}" ]; then
  WORK="$PARITY_KEEP"; mkdir -p "$WORK"
else
  WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
fi
links=()
if [ -z "${PIP_FIND_LINKS:-}" ] && [ -d /opt/wheels ]; then links=(--find-links /opt/wheels); fi
CONSTRAINTS="$WORK/torch-constraints.txt"

# ---- environments -------------------------------------------------------------------------------------------
# One shared torch environment; each package environment sees it through a .pth file placed after its own
# site-packages, so torch is installed (and unpacked) once. The constraints file pins torch to the one
# installed, so no package's requirement can make pip resolve another torch (a multi-GB CUDA build).
TORCH_ENV=""
torch_env() {
  [ -n "$TORCH_ENV" ] && return 0
  local k; k=$(printf '%s %s' "$TORCH_SPEC" "$("$PY" -V 2>&1)" | sha1sum | cut -c1-10)
  TORCH_ENV="$VENVS/torch-$k"
  if [ ! -e "$TORCH_ENV/.done" ]; then
    step "creating the torch environment $TORCH_ENV ($TORCH_SPEC)"
    rm -rf "$TORCH_ENV"; "$PY" -m venv "$TORCH_ENV"
    # shellcheck disable=SC2086
    "$TORCH_ENV/bin/python" -m pip install -q "${links[@]}" $TORCH_SPEC numpy pillow > "$TORCH_ENV/pip.log" 2>&1 \
      || { cat "$TORCH_ENV/pip.log" >&2; exit 1; }
    touch "$TORCH_ENV/.done"
  fi
  echo "torch==$("$TORCH_ENV/bin/python" -c 'import torch; print(torch.__version__)')" > "$CONSTRAINTS"
}

# make_env NAME SPEC... : an environment with torch (shared) + the given pip arguments, one line per pip call
# separated by ';;'. Reused when the same NAME + arguments were installed before.
ENV=""
make_env() {
  local name="$1"; shift
  torch_env
  local spec="$*"
  local k; k=$(printf '%s|%s|%s' "$spec" "$TORCH_ENV" "$(cat "$ROOT/scripts/parity/shims.py")" | sha1sum | cut -c1-10)
  ENV="$VENVS/$name-$k"
  if [ -e "$ENV/.done" ]; then step "$name: reusing $ENV"; return 0; fi
  step "$name: creating $ENV"
  rm -rf "$ENV"; "$PY" -m venv "$ENV"
  local site; site=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$TORCH_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz_parity_torch.pth"
  local IFS=$'\n' call
  for call in $(printf '%s' "$spec" | sed 's/ *;; */\n/g'); do
    [ -z "$call" ] && continue
    step "$name: pip install $call"
    # shellcheck disable=SC2086
    # (pip's log goes to a file, shown on failure: with --no-deps it lists every requirement left out on purpose)
    if ! (IFS=' '; "$ENV/bin/python" -m pip install -q "${links[@]}" -c "$CONSTRAINTS" $call) > "$ENV/pip.log" 2>&1; then
      grep -v '^WARNING: Location' "$ENV/pip.log" >&2; echo "parity: pip install $call failed in $ENV" >&2; exit 1
    fi
  done
  "$ENV/bin/python" "$ROOT/scripts/parity/shims.py" install "$name"
  touch "$ENV/.done"
}

# ---- inputs ---------------------------------------------------------------------------------------------------
step "inputs"
"${RK[@]}" "$ROOT/scripts/parity/common.py" inputs "$WORK/inputs"
SUMMARY="$WORK/summary.tsv"
: > "$SUMMARY"
status=0

compare() {  # compare NAME CONVERTED_DIR [reward options...]
  local name="$1" dir="$2"; shift 2
  step "$name: rewardkit scores and comparison"
  "${RK[@]}" "$ROOT/scripts/parity/compare.py" "$name" "$WORK/inputs" "$WORK/$name/official.json" "$dir" \
    "$SUMMARY" "$@" || status=1
}

unavailable() {  # unavailable NAME WHY
  printf '%s\t-\t-\t-\t-\tNOT RUN: %s\n' "$1" "$2" >> "$SUMMARY"
  printf '!!!!!! %s: NOT RUN: %s\n' "$1" "$2" >&2
}

# image-reward 1.5 pins timm==0.6.13 and fairscale==0.4.13 (BLIP's ViT imports them) and imports OpenAI's `clip`
# without declaring it; diffusers / datasets / accelerate serve only its ReFL training script (not imported, see
# official_imagereward.py). BLIP's med.py imports helpers transformers 5 removed: the 4.x line it was written
# for (4.45.2) is used.
IMAGEREWARD_PINS="image-reward==1.5 timm==0.6.13 fairscale==0.4.13 openai-clip==1.0.1 torchvision==0.28.0 --no-deps ;; transformers==4.45.2 ftfy regex tqdm huggingface_hub"

for m in "${MODELS[@]}"; do
  rm -rf "${WORK:?}/$m"  # a kept work folder (PARITY_KEEP) from an earlier run
  case "$m" in
  hpsv2)
    # hpsv2 1.2.0 pins pytest==7.2.0, protobuf<4, webdataset, pyarrow... for training and benchmarking:
    # installed without dependencies, plus what `hpsv2.img_score.score` imports. open_clip_torch only
    # provides the BPE vocabulary the hpsv2 wheel lacks (see shims.py).
    make_env hpsv2 "hpsv2==1.2.0 open_clip_torch==2.24.0 torchvision==0.28.0 --no-deps ;; ftfy regex tqdm huggingface_hub requests clint"
    step "hpsv2: tiny checkpoint and official scores"
    "$ENV/bin/python" "$ROOT/scripts/parity/official_hpsv2.py" "$WORK/inputs" "$WORK/hpsv2"
    step "hpsv2: rewardkit convert"
    "${RK[@]}" -m rewardkit.cli convert hpsv2 "$WORK/hpsv2/HPS_v2.1_compressed.pt" "$WORK/hpsv2/converted" \
      --tokenizer "$WORK/hpsv2/tokenizer" --heads 2,2 >/dev/null
    compare hpsv2 "$WORK/hpsv2/converted"
    ;;
  imagereward)
    make_env imagereward "$IMAGEREWARD_PINS"
    step "imagereward: tiny checkpoint and official scores"
    mkdir -p "$WORK/imagereward"
    "${RK[@]}" "$ROOT/scripts/parity/official_imagereward.py" tokenizer "$WORK/imagereward"
    "$ENV/bin/python" "$ROOT/scripts/parity/official_imagereward.py" official "$WORK/inputs" "$WORK/imagereward"
    step "imagereward: rewardkit convert"
    "${RK[@]}" -m rewardkit.cli convert imagereward "$WORK/imagereward/ImageReward.pt" "$WORK/imagereward/converted" \
      --tokenizer "$WORK/imagereward/bert-base-uncased" --med-config "$WORK/imagereward/med_config.json" >/dev/null
    compare imagereward "$WORK/imagereward/converted"
    ;;
  aesthetic)
    # no PyPI package of its own: image-reward packages it (ImageReward.models.AestheticScore, OpenAI clip)
    make_env imagereward "$IMAGEREWARD_PINS"
    step "aesthetic: tiny checkpoints and official scores"
    "$ENV/bin/python" "$ROOT/scripts/parity/official_aesthetic.py" official "$WORK/inputs" "$WORK/aesthetic"
    step "aesthetic: rewardkit convert"
    "${RK[@]}" "$ROOT/scripts/parity/official_aesthetic.py" hfclip "$WORK/aesthetic"
    "${RK[@]}" -m rewardkit.cli convert aesthetic "$WORK/aesthetic/aesthetic.pth" "$WORK/aesthetic/converted" \
      --clip "$WORK/aesthetic/hf-clip" >/dev/null
    compare aesthetic "$WORK/aesthetic/converted"
    ;;
  hpsv3)
    # hpsv3 1.0.0 pins transformers==4.45.2 (kept: its checkpoint names and Qwen2-VL code are that version's) and
    # lists deepspeed, diffusers, opencv, qwen-vl-utils for training / generation: installed without them, plus
    # what `hpsv3.inference` imports (its trainer module: peft, trl, datasets, pandas, matplotlib, tensorboard).
    make_env hpsv3 "hpsv3==1.0.0 torchvision==0.28.0 --no-deps ;; transformers==4.45.2 trl<0.12 peft<0.14 accelerate<1.1 datasets<3.1 pandas matplotlib tensorboard omegaconf pyyaml fire requests safetensors rich"
    step "hpsv3: tiny checkpoint and official scores"
    "$ENV/bin/python" "$ROOT/scripts/parity/official_hpsv3.py" "$WORK/inputs" "$WORK/hpsv3"
    step "hpsv3: rewardkit convert"
    "${RK[@]}" -m rewardkit.cli convert hpsv3 "$WORK/hpsv3/HPSv3.safetensors" "$WORK/hpsv3/converted" \
      --base "$WORK/hpsv3/base" >/dev/null
    compare hpsv3 "$WORK/hpsv3/converted"
    ;;
  geneval)
    # mmdet 2.x wants mmcv-full 1.x, whose compiled ops need a CUDA build: mmcv 1.7.1 is its pure-Python build (an
    # sdist that needs setuptools < 70); geneval_mmdet.py loads mmcv.ops without the compiled ops, which GenEval's
    # CPU path never calls (scripts/parity/geneval_mmdet.py says why). numpy < 2 for mmcv 1.x.
    make_env geneval "setuptools<70 wheel ;; mmcv==1.7.1 mmdet==2.28.2 open_clip_torch==3.3.0 clip-benchmark==1.6.2 torchvision==0.28.0 --no-deps --no-build-isolation ;; addict yapf==0.40.1 packaging pyyaml opencv-python-headless numpy<2 ftfy regex huggingface_hub safetensors tqdm terminaltables six scipy pycocotools matplotlib scikit-learn"
    mkdir -p "$WORK/geneval"
    step "geneval: mmdet / open_clip vs rewardkit (tiny checkpoints)"
    if GENEVAL_PARITY_PY="$ENV/bin/python" "${RK[@]}" "$ROOT/scripts/parity/geneval_mmdet.py" run "$WORK/geneval"; then
      printf 'geneval\t-\t-\t-\t-\tdetections and colours as mmdet / open_clip (scripts/parity/geneval_mmdet.py)\n' >> "$SUMMARY"
    else
      printf 'geneval\t-\t-\t-\t-\tDIFFERS: see the figures above (docs/zoo.md, geneval)\n' >> "$SUMMARY"; status=1
    fi
    ;;
  vqascore)
    # t2v-metrics 3.0 (PyPI) pins torch 2.5.1, transformers 4.49.0, numpy 1.26.4, apex, deepspeed, xformers,
    # bitsandbytes and a video stack for its 20 scorers; only its Qwen-VL scorer's imports are installed (its
    # transformers and numpy pins kept; decord is imported at module level for video).
    make_env vqascore "t2v-metrics==3.0 decord==0.6.0 torchvision==0.28.0 --no-deps ;; transformers==4.49.0 numpy==1.26.4 accelerate qwen-vl-utils"
    step "vqascore: tiny judge and official scores (t2v-metrics 3.0)"
    "$ENV/bin/python" "$ROOT/scripts/parity/official_vqascore.py" "$WORK/inputs" "$WORK/vqascore"
    compare vqascore "$WORK/vqascore/judge" "judge=transformers:{dir}" template=t2v_metrics-3.0 dtype=float32
    ;;
  editreward)
    # TIGER-AI-Lab/EditReward has no PyPI release (a GitHub repository only): nothing to install here. Its
    # official forward is transcribed, with file and line, in tests/rewards/test_zoo_hpsv3.py.
    printf 'editreward\t-\t-\t-\t-\tnot on PyPI: no official package to run (reference transcribed in tests/rewards/test_zoo_hpsv3.py)\n' >> "$SUMMARY"
    printf '!!!!!! editreward: not on PyPI, no official package to compare against (see tests/rewards/test_zoo_hpsv3.py)\n' >&2
    ;;
  geneval_summary)
    # GenEval's evaluation/summary_scores.py runs on pandas (its only dependency besides numpy): an environment
    # with pandas runs its line-for-line transcription (tests/helpers/geneval_summary_official.py), or the official
    # script itself when GENEVAL_REPO names a djghosh13/geneval checkout, on the same results files as
    # `rewardkit bench geneval`'s summary (tests/bench/test_geneval.py, *equals_the_official*).
    make_env geneval_summary "pandas==3.1.1"
    step "geneval_summary: rewardkit's GenEval summary vs summary_scores.py under pandas"
    pv=$("$ENV/bin/python" -c 'import pandas; print(pandas.__version__)')
    want=2; [ -n "${GENEVAL_REPO:-}" ] && want=3   # a skipped comparison is not a pass
    if REWARDKIT_PANDAS_PYTHON="$ENV/bin/python" "${RK[@]}" -m pytest -q -p no:cacheprovider \
        "$ROOT/tests/bench/test_geneval.py" -k equals_the_official > "$WORK/geneval_summary.log" 2>&1 \
        && grep -q "^$want passed" "$WORK/geneval_summary.log"; then
      printf 'geneval_summary\tpandas %s\t0 (text)\t-\t%s\tOK\n' "$pv" \
        "$([ -n "${GENEVAL_REPO:-}" ] && echo "the official script too" || echo "transcription (GENEVAL_REPO unset)")" >> "$SUMMARY"
    else
      cat "$WORK/geneval_summary.log" >&2; status=1
      printf 'geneval_summary\tpandas %s\t-\t-\t-\tFAIL: the summary text differs\n' "$pv" >> "$SUMMARY"
    fi
    ;;
  *)
    echo "unknown model $m (hpsv2 imagereward aesthetic hpsv3 vqascore editreward geneval_summary)" >&2; exit 2 ;;
  esac
done

step "done"
"${RK[@]}" "$ROOT/scripts/parity/compare.py" --summary "$SUMMARY" "$((SECONDS - T0))"
if grep -q $'\tNOT RUN' "$SUMMARY"; then status=1; fi
exit "$status"
