"""Parts that two or more training recipes share, one concern per module: the process group (``distributed``),
seeds (``rng``), precision, RUN/ (``rundir``), checkpoints and what they hold (``checkpoints``, ``state``,
``fsdp``), the data and its order (``data``, ``streams``, ``token_cache``), the loop's schedule, stops and log
(``schedule``, ``stop``, ``log``, ``run``, ``step``) and the options every recipe takes (``cli``).

``step`` counts finished optimizer steps; ``--batch-size`` is the global batch, so the same command trains the same
on one process or N.
"""
