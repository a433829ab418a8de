"""The SFT recipe (``python -m training.sft``): the command (``__main__``), the models it trains (``model``,
``var_init``), its loss and validation (``objective``) and the run (``run``)."""
