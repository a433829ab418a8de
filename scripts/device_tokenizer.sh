#!/usr/bin/env bash
# The 128 px tokenizer on a lent GPU (issue 62; docs/training.md, "Training the tokenizer on a lent GPU"), run from the
# repository's root on the device machine:
#
#   scripts/device_tokenizer.sh RUN BRING_BACK [training.device_tokenizer options, e.g. --minutes 7 --candidate b]
#
# 1. installs the wheels carried in .whl/ (scripts/device_wheels.sh made them here) into /tmp/stylevar-site;
# 2. trains on the pack carried in data/device_pack (data_tools.pack; DEVICE_PACK=FOLDER names another) into RUN
#    (python -m training.device_tokenizer);
# 3. copies into BRING_BACK what can come back from a lent machine (at most 8 files of 16 MiB): the summary, the log,
#    the run's config and the tokenizer (RUN/final, or RUN/latest when the budget ended the call) with its weights
#    in 15 MiB parts (`cat tokenizer.safetensors.part-* > tokenizer.safetensors` puts them together).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 RUN BRING_BACK [training.device_tokenizer options]" >&2; exit 2; }
run=$1 back=$2
shift 2
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/stylevar-site .whl/*.whl
  export PYTHONPATH=/tmp/stylevar-site${PYTHONPATH:+:$PYTHONPATH}
fi
status=0
PYTHONUNBUFFERED=1 python3 -m training.device_tokenizer --data "${DEVICE_PACK:-data/device_pack}" --out "$run" "$@" \
  || status=$?
mkdir -p "$back"
for f in device_summary.json log.jsonl config.json; do
  [ -f "$run/$f" ] && cp "$run/$f" "$back/$f"
done
model="$run/final"
[ -d "$model" ] || model="$run/latest"
if [ -f "$model/tokenizer.safetensors" ]; then
  cp "$model/config.json" "$back/tokenizer_config.json"
  split -b 15M -d "$model/tokenizer.safetensors" "$back/tokenizer.safetensors.part-"
fi
exit "$status"
