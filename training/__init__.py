"""Training: the recipe commands (`python -m training.<recipe>`: `vqvae`, `sft`, `grpo`, `demo`, `sharding`,
`merge_lora`) over the shared parts in `training.parts`."""

