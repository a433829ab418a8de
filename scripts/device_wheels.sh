#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for a device run, downloaded here into .whl/ (for its Python 3.12):
#
#   scripts/device_wheels.sh            # what the tokenizer run carries (scripts/device/tokenizer.txt)
#   scripts/device_wheels.sh service    # what benchmarks.device_run carries (scripts/device/service.txt)
#
# The machine's image (scripts/device/image.txt) has torch, torchvision, numpy, safetensors, onnx, onnxruntime and
# much more, and reaches no network; each list names what a run imports beyond it, at the versions the suite runs
# with (tests/device_image checks that). Run here, from the repository's root; .whl/ is ignored by git and travels
# with `carry` (it counts towards the 64 MiB that a call takes). docs/training.md and docs/gpus.md give the calls.
set -euo pipefail
cd "$(dirname "$0")/.."
list="scripts/device/${1:-tokenizer}.txt"
[ -f "$list" ] || { echo "usage: $0 [tokenizer|service] (no $list)" >&2; exit 2; }
rm -rf .whl && mkdir .whl  # one run's wheels: two versions of one package stop the install there
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl -r "$list"
du -ch .whl/*.whl
