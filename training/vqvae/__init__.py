"""The tokenizer recipe (``python -m training.vqvae``): the command (``__main__``), its loss and dead-code restarts
(``objective``), the batch that fills a GPU (``batch``) and the run (``run``)."""
