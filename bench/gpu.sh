#!/usr/bin/env bash
# Everything worth measuring on a lent CUDA GPU (an H200), in one go, in about 10 minutes at most:
#
#   bash bench/gpu.sh [RESULTS_DIR]          # default bench/results/gpu
#   GPU_SH_DRY_RUN=1 bash bench/gpu.sh /tmp/gpu-dry   # the same steps at toy sizes on the CPU, to test this script
#
# Steps, each under `timeout` and each allowed to fail without stopping the rest:
#   1. environment: nvidia-smi, torch / CUDA / flash-attn versions
#   2. try `pip install flash-attn` (short timeout; the machine may have no network: then it just fails)
#   3. the test suite with the GPU visible: python -m pytest -q -x
#   4. bench/attention.py: bf16, T = 128 .. 16384, manual vs sdpa vs flash (+ fa2/fa3 if installed)
#   5. bench/train.py, GPT-2 124M shape (configs/gpt2_124m.toml), batch 16, bf16, flash: eager vs compiled
#   6. bench/train.py, same model, eager: manual vs sdpa vs flash attention
#   7. bench/sample.py: KV cache vs none (the CPU default model; informational on a GPU)
# Output: RESULTS_DIR/gpu.log (everything printed, with each step's exit status and seconds) and one JSON
# per benchmark (attention-cuda.json, train-compile-cuda.json, train-attention-cuda.json, sample-cuda.json):
# five files, so they all come back from a machine that returns at most eight.
set -u
cd "$(dirname "$0")/.." || exit 1
RES="${1:-bench/results/gpu}"
mkdir -p "$RES" || exit 1
LOG="$RES/gpu.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
DRY="${GPU_SH_DRY_RUN:-0}"
PY="${PYTHON:-python}"
SUMMARY=""
T0=$SECONDS

step() {  # step NAME LIMIT_SECONDS command...
  local name=$1 limit=$2 start rc
  shift 2
  echo
  echo "=== [$name] $(date -u +%H:%M:%S) limit ${limit}s: $*"
  start=$SECONDS
  timeout --kill-after=15 "$limit" "$@"
  rc=$?
  [ $rc -eq 124 ] && echo "=== [$name] TIMED OUT after ${limit}s"
  echo "=== [$name] exit $rc in $((SECONDS - start)) s"
  SUMMARY+="$(printf '%-18s exit %-4s %4d s' "$name" "$rc" $((SECONDS - start)))"$'\n'
}

if [ "$DRY" = 1 ]; then
  echo "DRY RUN: toy sizes on the CPU"
  DEV="--device=cpu"
  ATT_ARGS="--dtype=bfloat16 --seq_lens=64,128 --batch_size=1 --n_embd=64 --n_head=2 --repeats=2 --memory=false"
  TRAIN_ARGS="--n_layer=2 --n_head=2 --n_embd=64 --block_size=32 --batch_size=2 --vocab_size=256 --repeats=2 --warmup=1"
  SAMPLE_ARGS="--max_new_tokens=20 --repeats=2"
  PYTEST_ARGS="-q -x tests/test_attention.py"
else
  DEV="--device=cuda"
  ATT_ARGS="--dtype=bfloat16 --seq_lens=128,256,512,1024,2048,4096,8192,16384 --batch_size=4 --n_embd=768 --n_head=12 --repeats=10"
  TRAIN_ARGS="--batch_size=16 --repeats=10 --warmup=3"
  SAMPLE_ARGS="--repeats=5"
  PYTEST_ARGS="-q -x"
fi

step env 60 bash -c "nvidia-smi || true; $PY - <<'EOF'
import os, platform, torch
print('python', platform.python_version(), '| torch', torch.__version__, '| CUDA build', torch.version.cuda,
      '| cuda available', torch.cuda.is_available(), '| cpus', os.cpu_count())
if torch.cuda.is_available():
    print('gpu', torch.cuda.get_device_name(), '| capability', torch.cuda.get_device_capability(),
          '| bf16', torch.cuda.is_bf16_supported())
for mod in ('flash_attn', 'flash_attn_interface', 'triton'):
    try:
        m = __import__(mod)
        print(mod, getattr(m, '__version__', 'present'))
    except Exception as e:
        print(mod, 'not available:', type(e).__name__)
EOF"

HAS_CUDA=$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$DRY" != 1 ] && [ "$HAS_CUDA" != 1 ]; then
  echo "WARNING: CUDA is not available here; only the test suite runs"
fi

if [ "$DRY" != 1 ] && ! $PY -c "import flash_attn" 2>/dev/null && [ -z "${SKIP_FLASH_ATTN_INSTALL:-}" ]; then
  # a prebuilt wheel or nothing: a source build takes far longer than this limit and is killed
  step flash-attn-install 60 $PY -m pip install --no-build-isolation --timeout 5 --retries 0 flash-attn
fi

step pytest 180 $PY -m pytest $PYTEST_ARGS

if [ "$DRY" = 1 ] || [ "$HAS_CUDA" = 1 ]; then
  step attention 120 $PY bench/attention.py $DEV $ATT_ARGS --out="$RES/attention-cuda.json"
  if [ "$DRY" = 1 ]; then  # no compiler needed for the toy run; the compiled variant is tested separately
    step train-compile 200 $PY bench/train.py $DEV $TRAIN_ARGS --dtype=bfloat16 --attention=flash \
      --variants=none --out="$RES/train-compile-cuda.json"
  else
    step train-compile 180 $PY bench/train.py configs/gpt2_124m.toml $DEV $TRAIN_ARGS --dtype=bfloat16 \
      --attention=flash --variants=compile --out="$RES/train-compile-cuda.json"
  fi
  step train-attention 100 $PY bench/train.py $([ "$DRY" = 1 ] || echo configs/gpt2_124m.toml) $DEV $TRAIN_ARGS \
    --dtype=bfloat16 --compile=false --variants=attention --out="$RES/train-attention-cuda.json"
  step sample 60 $PY bench/sample.py $DEV $SAMPLE_ARGS --out="$RES/sample-cuda.json"
fi

echo
echo "=== summary ($((SECONDS - T0)) s in all; results in $RES)"
printf '%s' "$SUMMARY"
grep -h -E "^(peak memory flash|KV cache speed-up|requirement|greedy)" "$LOG" | sort -u
exit 0
