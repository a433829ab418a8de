"""The networks: the multi-scale VQ-VAE tokenizer, the StyleVAR transformer, the image encoders that condition
it, LoRA adapters, how tokens are sampled (`generation`, `sampling`), and how a model saves and loads its own
weights (`pretrained`, `state_dict`)."""
