"""The file names of a model's folder: its config.json and each model's weights file (no torch, so that a folder
can be checked before the models are imported: `stylevar.loaders.model_folder`)."""
from __future__ import annotations

CONFIG_FILE = "config.json"  # each model's section (`stylevar.models.pretrained`), and the pipeline's
TOKENIZER_FILE = "tokenizer.safetensors"  # MultiScaleVQVAE.weights_file
TRANSFORMER_FILE = "transformer.safetensors"  # StyleVAR.weights_file
