#!/usr/bin/env bash
# The GPU figures of benchmarks/README.md, as one command for a machine with a GPU: `stylevar bench` on the published d20
# shapes (random weights) at batch 1, 16 and 64, eager and then compiled, bf16 autocast; each run is
# appended to benchmarks/results/results.jsonl and the table in benchmarks/README.md is regenerated (ms/image,
# images/s, peak GiB, % of the H200's dense bf16 peak). Targets: batch 1 <= 60 ms, batch 64 >= 150 images/s.
# Then the training figure: one SFT optimizer step of the same preset (benchmarks/train_step.py:
# fused tokenizer encode, teacher forcing, cross-entropy, backward, fused AdamW) at batch TRAIN_BATCHES (16),
# bf16 autocast, random weights: ms/step, samples/s, FLOPs counted per step and MFU against PEAK_TFLOPS, and
# the memory a step needs, written to TRAIN_OUT (JSON) and printed.
#
#   bash benchmarks/gpu_bench.sh
#   PRESET=tiny DEVICE=cpu BATCHES=1 MODES=eager RECORD=/tmp/r.jsonl TABLE=/tmp/t.md TRAIN_OUT=/tmp/s.json \
#     TRAIN_BATCHES=2 TRAIN_PRECISION=fp32 TRAIN_VARIANT=eager bash benchmarks/gpu_bench.sh   # a CPU check in seconds
#   INFERENCE=0 TRAIN_BATCHES=16 bash benchmarks/gpu_bench.sh        # the training step alone
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-d20}
DEVICE=${DEVICE:-cuda}
BATCHES=${BATCHES:-1,16,64}
MODES=${MODES:-eager compiled}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}  # H200 SXM, dense bf16
RECORD=${RECORD:-benchmarks/results/results.jsonl}
TABLE=${TABLE:-benchmarks/README.md}
PYTHON=${PYTHON:-python}
INFERENCE=${INFERENCE:-1}             # 0: skip the inference runs
TRAIN_BATCHES=${TRAIN_BATCHES:-16}    # empty: skip the training step
TRAIN_PRECISION=${TRAIN_PRECISION:-bf16}
TRAIN_VARIANT=${TRAIN_VARIANT:-default}  # benchmarks/train_step.py's variant: default (blocks compiled) or eager
TRAIN_OUT=${TRAIN_OUT:-benchmarks/results/train_step_$PRESET.json}

for mode in $MODES; do
  [ "$INFERENCE" = 1 ] || break
  case $mode in
    eager) flags=() ;;
    compiled) flags=(--compile) ;;
    *) echo "gpu_bench.sh: unknown mode '$mode' (eager, compiled)" >&2; exit 2 ;;
  esac
  "$PYTHON" -m stylevar.cli bench --preset "$PRESET" --device "$DEVICE" --batch-sizes "$BATCHES" \
    --repeats 5 --warmup 2 --tf-batch 1 --peak-tflops "$PEAK_TFLOPS" "${flags[@]}" \
    --record "$RECORD" --table "$TABLE"
done

if [ -n "$TRAIN_BATCHES" ]; then
  "$PYTHON" -m benchmarks.train_step --no-reference --preset "$PRESET" --device "$DEVICE" \
    --batch-sizes "$TRAIN_BATCHES" --precisions "$TRAIN_PRECISION" --variants "$TRAIN_VARIANT" --repeats 5 --warmup 2 \
    --peak-tflops "$PEAK_TFLOPS" --json > "$TRAIN_OUT"
  "$PYTHON" - "$TRAIN_OUT" <<'PYEOF'
import json, sys
from benchmarks.measures.train_step import print_report
print_report(json.load(open(sys.argv[1])))
PYEOF
fi
