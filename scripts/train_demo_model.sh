#!/usr/bin/env bash
# Train the embedded demo model from scratch with the project's own recipes, then evaluate and export it.
#
#   scripts/train_demo_model.sh [RUN_ROOT]        (default runs/demo; re-running resumes every stage)
#
# Stages, part 1 (procedural pre-training, demo v3): synthetic triplets -> tokenizer (training.vqvae) -> SFT
# (training.sft) -> GRPO with the SSIM reward (training.grpo) -> a second GRPO stage (a fresh LoRA on the
# first stage's merged weights).
# Part 2 (learning from a real stylizer, demo v4): real photographs and styles from Debian packages and
# scikit-image (data_tools.pictures) -> teacher triplets painted by Magenta's arbitrary stylizer
# (data_tools.teach, needs `pip install 'stylevar[teacher]'`) -> the tokenizer fine-tuned on them
# (training.vqvae --init; measured for the ceiling table, not used by the model) -> SFT on them from part 1's
# transformer with the colour-statistics variant and scale-balanced loss (training.sft --init --add-variants
# colour_stats --scale-gamma 1) -> evaluation against copy-content and Reinhard, the palette step chosen,
# export to stylevar/assets/demo, with the held-out real pairs beside the teacher (pictures never used for
# training or tuning).
# Part 3 (more styles, demo v6): a second set of teacher triplets with another seed, a share of them painted in
# the style of another content photograph (data_tools.teach --photo-styles) -> SFT continued on it from part 2's
# transformer, so that the transformer's own palette follows styles it has not seen.
# Each stage's wall-clock time and command go into RUN_ROOT/timings.json and from there into the model
# card. The model shape is scripts/demo_preset.json: a 64 px tokenizer with a 16 x 16 latent (scales 1, 2, 4,
# 8, 16) and the tiny transformer with the content-injection variant (docs/training.md, "The demo model",
# gives the experiments behind both choices). Settings are sized for two CPU cores; on a GPU pass DEVICE=cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/demo}
PY=${PYTHON:-python}
DEVICE=${DEVICE:-cpu}
SEED=${SEED:-0}
COUNT=${COUNT:-4000}
VQ_STEPS=${VQ_STEPS:-1200}
SFT_STEPS=${SFT_STEPS:-1200}
GRPO_STEPS=${GRPO_STEPS:-60}
GRPO2_STEPS=${GRPO2_STEPS:-150}     # the second GRPO stage
TEACH_COUNT=${TEACH_COUNT:-2400}    # teacher triplets attempted (about 80 % pass the edge filter)
TEACH_MIN_EDGE=${TEACH_MIN_EDGE:-0.35}  # OmniStyle-like filter: drop targets that lost the content
TEACH_BATCH=${TEACH_BATCH:-16}
TEACH_VQ_STEPS=${TEACH_VQ_STEPS:-400}
TEACH_SFT_STEPS=${TEACH_SFT_STEPS:-1000}
TEACH_SCALE_GAMMA=${TEACH_SCALE_GAMMA:-1.0}  # SFT on teacher triplets: PANW weights of the scales in the loss
MORE_COUNT=${MORE_COUNT:-3200}      # part 3: teacher triplets attempted with another seed
MORE_PHOTO_STYLES=${MORE_PHOTO_STYLES:-0.25}  # their share painted in another content photograph's style
MORE_SFT_STEPS=${MORE_SFT_STEPS:-600}
PALETTE=${PALETTE:-distribution:1}  # the export's palette step (training.demo --palette)
UPSAMPLE_STRENGTH=${UPSAMPLE_STRENGTH:-2}  # the guided upsampling's strength (chosen on training pictures: the demo model's card)
PICTURES=${PICTURES:-$ROOT/pictures}  # training pictures: contents/ and styles/, each with SOURCES.json
HELDOUT=${HELDOUT:-$ROOT/heldout}     # the judges: contents/ with SOURCES.json (photographs and styles)
HELDOUT_PHOTOS=${HELDOUT_PHOTOS:-BytheWater,ColdRipple,ColorfulCups,EveningGlow,FallenLeaf,--Grey,Kite,OneStandsOut,--Path,Volna}
HELDOUT_ART=${HELDOUT_ART:-Altai,Autumn,Cluster,Kokkini,SafeLanding,calla,rhythm,the-mouse}
STYLE_WEIGHT=${STYLE_WEIGHT:-0}     # its --reward-style-weight (2 was measured: no gain over 0, fidelity.md)
EVAL_N=${EVAL_N:-48}                # held-out pairs the export evaluates on
CALIBRATION_N=${CALIBRATION_N:-32}  # training triplets that choose the sampling settings and refinement
OUT=${OUT:-stylevar/assets/demo}
PRESET=${PRESET:-scripts/demo_preset.json}
mkdir -p "$ROOT"
TIMINGS="$ROOT/timings.json"
DATA="$ROOT/data/manifest.jsonl"

stage() {  # stage NAME DONE_FILE COMMAND...: run unless DONE_FILE exists, record its time
  local name=$1 done_file=$2; shift 2
  if [ -e "$done_file" ]; then echo "[demo] $name: done ($done_file)"; return; fi
  echo "[demo] $name: $*"
  local t0; t0=$(date +%s)
  "$@"
  local t1; t1=$(date +%s)
  "$PY" - "$TIMINGS" "$name" "$((t1 - t0))" "$*" "$SEED" <<'PYEOF'
import json, platform, sys, os
path, name, seconds, command, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
t = json.load(open(path)) if os.path.exists(path) else {"stages": {}}
t["stages"][name] = {"seconds": seconds, "command": command}
t["total_seconds"] = sum(s["seconds"] for s in t["stages"].values())
t["seed"] = seed
t["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores"
json.dump(t, open(path, "w"), indent=1)
PYEOF
}

stage synth "$DATA" \
  "$PY" -m data_tools.synth --out "$ROOT/data" --count "$COUNT" --size 64 --seed "$SEED" --val-fraction 0.05
stage tokenizer "$ROOT/tokenizer/final/tokenizer.safetensors" \
  "$PY" -m training.vqvae --data "$DATA" --preset "$PRESET" --out "$ROOT/tokenizer" --max-steps "$VQ_STEPS" \
  --batch-size 16 --lr 5e-4 --warmup-steps 100 --save-every 250 --seed "$SEED" --device "$DEVICE" --no-progress
stage sft "$ROOT/sft/final/transformer.safetensors" \
  "$PY" -m training.sft --data "$DATA" --preset "$PRESET" --tokenizer "$ROOT/tokenizer/final" --out "$ROOT/sft" \
  --max-steps "$SFT_STEPS" --batch-size 16 --lr 5e-4 --warmup-steps 50 --save-every 100 --val-every 500 \
  --val-max-batches 4 --seed "$SEED" --device "$DEVICE" --no-progress
stage grpo "$ROOT/grpo/final/transformer.safetensors" \
  "$PY" -m training.grpo --data "$DATA" --init "$ROOT/sft/final" --out "$ROOT/grpo" --reward ssim \
  --group-size 8 --batch-size 2 --max-steps "$GRPO_STEPS" --lr 1e-4 --lora-rank 16 --lora-alpha 32 \
  --save-every 20 --seed "$SEED" --device "$DEVICE" --no-progress
stage grpo2 "$ROOT/grpo2/final/transformer.safetensors" \
  "$PY" -m training.grpo --data "$DATA" --init "$ROOT/grpo/final" --out "$ROOT/grpo2" --reward ssim \
  --reward-style-weight "$STYLE_WEIGHT" --group-size 8 --batch-size 2 --max-steps "$GRPO2_STEPS" --lr 1e-4 \
  --lora-rank 16 --lora-alpha 32 --save-every 50 --seed "$SEED" --device "$DEVICE" --no-progress
stage pictures "$PICTURES/styles/SOURCES.json" \
  "$PY" -m data_tools.pictures --out "$PICTURES"
stage teach "$ROOT/teach/manifest.jsonl" \
  "$PY" -m data_tools.teach --contents "$PICTURES/contents" --styles "$PICTURES/styles" --out "$ROOT/teach" \
  --size 128 --count "$TEACH_COUNT" --min-edge-corr "$TEACH_MIN_EDGE" --seed "$SEED" --no-progress
stage tokenizer_teach "$ROOT/tokenizer_teach/final/tokenizer.safetensors" \
  "$PY" -m training.vqvae --data "$ROOT/teach/manifest.jsonl" --preset "$PRESET" --init "$ROOT/tokenizer/final" \
  --out "$ROOT/tokenizer_teach" --max-steps "$TEACH_VQ_STEPS" --batch-size 16 --lr 2e-4 --warmup-steps 20 \
  --save-every 50 --seed "$SEED" --device "$DEVICE" --no-progress
# part 1's transformer and tokenizer, the colour-statistics variant added (zero-initialised), every scale the
# same share of the loss (--scale-gamma 1: the first scales set the palette), no augmentation (so training.sft's
# default token cache reads the token maps back from the second epoch on)
stage sft_teach "$ROOT/sft_teach/final/transformer.safetensors" \
  "$PY" -m training.sft --data "$ROOT/teach/manifest.jsonl" --preset "$PRESET" --tokenizer "$ROOT/grpo2/final" \
  --init "$ROOT/grpo2/final" --add-variants colour_stats --scale-gamma "$TEACH_SCALE_GAMMA" --out "$ROOT/sft_teach" \
  --max-steps "$TEACH_SFT_STEPS" --batch-size "$TEACH_BATCH" --lr 4e-4 --warmup-steps 30 --save-every 100 \
  --val-every 250 --val-max-batches 2 --no-augment --seed "$SEED" --device "$DEVICE" --no-progress
stage teach_more "$ROOT/teach_more/manifest.jsonl" \
  "$PY" -m data_tools.teach --contents "$PICTURES/contents" --styles "$PICTURES/styles" --out "$ROOT/teach_more" \
  --size 128 --count "$MORE_COUNT" --min-edge-corr "$TEACH_MIN_EDGE" --photo-styles "$MORE_PHOTO_STYLES" \
  --seed "$((SEED + 1))" --no-progress
stage sft_more "$ROOT/sft_more/final/transformer.safetensors" \
  "$PY" -m training.sft --data "$ROOT/teach_more/manifest.jsonl" --preset "$PRESET" --tokenizer "$ROOT/grpo2/final" \
  --init "$ROOT/sft_teach/final" --scale-gamma "$TEACH_SCALE_GAMMA" --out "$ROOT/sft_more" \
  --max-steps "$MORE_SFT_STEPS" --batch-size "$TEACH_BATCH" --lr 3e-4 --warmup-steps 30 --save-every 50 \
  --val-every 300 --val-max-batches 2 --no-augment --seed "$SEED" --device "$DEVICE" --no-progress
# the held-out judges: pictures from two packages no stage above reads
stage heldout "$HELDOUT/contents/SOURCES.json" "$PY" -m data_tools.pictures --out "$HELDOUT" --held-out
# the palette step: the whole colour distribution (chosen on tuning pairs of training pictures at the returned
# size, docs/training.md; the 64 px rule's choice and every candidate stay in the card)
"$PY" -m training.demo --model "$ROOT/sft_more/final" --data "$ROOT/teach_more/manifest.jsonl" --out "$OUT" \
  --palette "$PALETTE" --upsample-strength "$UPSAMPLE_STRENGTH" \
  --timings "$TIMINGS" --n "$EVAL_N" --calibration "$CALIBRATION_N" --experiments benchmarks/results/fidelity.md \
  --real-contents "$HELDOUT/contents" --real-photos "$HELDOUT_PHOTOS" \
  --real-art "$HELDOUT_ART"
