"""The GRPO recipe (``python -m training.grpo``): the command (``__main__``), the rewards (``rewards``), the loss's
terms (``objective``), one step (``trainer``), the LoRA merges (``merge_control``) and the run (``run``)."""
