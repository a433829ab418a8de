#!/usr/bin/env bash
# The GPU figures as one command for a machine with a GPU, written to a folder of their own (nothing in the checkout
# is rewritten): `stylevar bench` on the published d20 shapes (random weights) at batch 1, 16 and 64, eager and then
# compiled, bf16 autocast, each run appended to OUTDIR/results.jsonl and tabled in OUTDIR/table.md (ms/image,
# images/s, peak GiB, % of the GPU's dense bf16 peak). Targets: batch 1 <= 60 ms, batch 64 >= 150 images/s.
# Then the training figure: one SFT optimizer step of the same preset (benchmarks/train_step.py: fused tokenizer
# encode, teacher forcing, cross-entropy, backward, fused AdamW) at batch TRAIN_BATCHES (16), bf16 autocast, random
# weights: ms/step, samples/s, FLOPs counted per step and MFU, the memory a step needs, in OUTDIR/train_step_PRESET.json.
# The peak is picked by the GPU's name (benchmarks/gpu_peaks.py: A100, H100, H200, L4, L40S, ...); an unknown GPU
# gets no MFU unless PEAK_TFLOPS is given. The project must be installed for PYTHON (INSTALL=1 installs it).
# For the whole prepared device run (golden tokens, the service under load, a time budget): benchmarks/device_run.py.
#
#   bash benchmarks/gpu_bench.sh OUTDIR
#   PRESET=tiny DEVICE=cpu BATCHES=1 MODES=eager TRAIN_BATCHES=2 TRAIN_PRECISION=fp32 TRAIN_VARIANT=eager \
#     bash benchmarks/gpu_bench.sh /tmp/gpu_bench           # a CPU check in seconds
#   INFERENCE=0 TRAIN_BATCHES=16 bash benchmarks/gpu_bench.sh OUTDIR        # the training step alone
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: bash benchmarks/gpu_bench.sh OUTDIR   (the folder the figures are written to)" >&2
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
PRESET=${PRESET:-d20}
DEVICE=${DEVICE:-cuda}
BATCHES=${BATCHES:-1,16,64}
MODES=${MODES:-eager compiled}
PYTHON=${PYTHON:-python}
INFERENCE=${INFERENCE:-1}             # 0: skip the inference runs
TRAIN_BATCHES=${TRAIN_BATCHES:-16}    # empty: skip the training step
TRAIN_PRECISION=${TRAIN_PRECISION:-bf16}
TRAIN_VARIANT=${TRAIN_VARIANT:-default}  # benchmarks/train_step.py's variant: default (blocks compiled) or eager

# installed: the package and what it needs (the clone's own folder and its egg-info would pass any lighter check)
if ! "$PYTHON" -c "import torch, stylevar" 2>/dev/null; then
  if [ "${INSTALL:-0}" = 1 ]; then
    "$PYTHON" -m pip install -e .
  else
    echo "gpu_bench.sh: the project is not installed for $PYTHON: run '$PYTHON -m pip install -e .' in $(pwd)," \
         "or INSTALL=1 bash benchmarks/gpu_bench.sh OUTDIR" >&2
    exit 2
  fi
fi
if [ -z "${PEAK_TFLOPS:-}" ] && [ "$DEVICE" != cpu ]; then
  PEAK_TFLOPS=$("$PYTHON" -m benchmarks.gpu_peaks)  # empty for a GPU not in the table: no MFU
fi
PEAK_TFLOPS=${PEAK_TFLOPS:-}
peak=()
[ -z "$PEAK_TFLOPS" ] || peak=(--peak-tflops "$PEAK_TFLOPS")
echo "gpu_bench.sh: $PRESET on $DEVICE; peak ${PEAK_TFLOPS:-unknown (no MFU)} TFLOP/s; figures in $OUT" >&2

for mode in $MODES; do
  [ "$INFERENCE" = 1 ] || break
  case $mode in
    eager) flags=() ;;
    compiled) flags=(--compile) ;;
    *) echo "gpu_bench.sh: unknown mode '$mode' (eager, compiled)" >&2; exit 2 ;;
  esac
  "$PYTHON" -m stylevar.cli bench --preset "$PRESET" --device "$DEVICE" --batch-sizes "$BATCHES" \
    --repeats 5 --warmup 2 --tf-batch 1 "${peak[@]}" "${flags[@]}" \
    --record "$OUT/results.jsonl" --table "$OUT/table.md"
done

if [ -n "$TRAIN_BATCHES" ]; then
  TRAIN_OUT="$OUT/train_step_$PRESET.json"
  "$PYTHON" -m benchmarks.train_step --no-reference --preset "$PRESET" --device "$DEVICE" \
    --batch-sizes "$TRAIN_BATCHES" --precisions "$TRAIN_PRECISION" --variants "$TRAIN_VARIANT" --repeats 5 --warmup 2 \
    "${peak[@]}" --json > "$TRAIN_OUT"
  "$PYTHON" - "$TRAIN_OUT" <<'PYEOF'
import json, sys
from benchmarks.measures.train_step import print_report
print_report(json.load(open(sys.argv[1])))
PYEOF
fi
