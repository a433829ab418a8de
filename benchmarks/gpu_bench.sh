#!/usr/bin/env bash
# Issue 18's GPU figures, as one command for a machine with a GPU: `stylevar bench` on the published d20
# shapes (random weights) at batch 1, 16 and 64, eager and then compiled, bf16 autocast; each run is
# appended to benchmarks/results.jsonl and the table in benchmarks/README.md is regenerated (ms/image,
# images/s, peak GiB, % of the H200's dense bf16 peak). Targets: batch 1 <= 60 ms, batch 64 >= 150 images/s.
#
#   bash benchmarks/gpu_bench.sh
#   PRESET=tiny DEVICE=cpu BATCHES=1 MODES=eager RECORD=/tmp/r.jsonl TABLE=/tmp/t.md bash benchmarks/gpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-d20}
DEVICE=${DEVICE:-cuda}
BATCHES=${BATCHES:-1,16,64}
MODES=${MODES:-eager compiled}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}  # H200 SXM, dense bf16
RECORD=${RECORD:-benchmarks/results.jsonl}
TABLE=${TABLE:-benchmarks/README.md}
PYTHON=${PYTHON:-python}

for mode in $MODES; do
  case $mode in
    eager) flags=() ;;
    compiled) flags=(--compile) ;;
    *) echo "gpu_bench.sh: unknown mode '$mode' (eager, compiled)" >&2; exit 2 ;;
  esac
  "$PYTHON" -m stylevar.cli bench --preset "$PRESET" --device "$DEVICE" --batch-sizes "$BATCHES" \
    --repeats 5 --warmup 2 --tf-batch 1 --peak-tflops "$PEAK_TFLOPS" "${flags[@]}" \
    --record "$RECORD" --table "$TABLE"
done
