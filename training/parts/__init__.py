"""Parts that two or more training recipes share, one concern per module. ``step`` counts finished optimizer
steps; ``--batch-size`` is the global batch, so the same command trains the same on one process or N."""
