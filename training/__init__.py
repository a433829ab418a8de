"""Training: the recipes (``python -m training.<recipe>``: ``vqvae``, ``sft``, ``grpo``, ``demo``, ``sharding``,
``merge_lora``), each with its own code beside it, over the parts they share (``training.parts``)."""

