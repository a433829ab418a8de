"""The demo model's export (``python -m training.demo``): the command (``__main__``), the evaluation and the
settings chosen on it (``export``) and the model card (``card``)."""
