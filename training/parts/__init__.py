"""Shared parts of every training recipe, one concern per module.

A recipe (``training.vqvae``, ``training.sft``, ``training.grpo``) is a short script with its own step
loop over these parts (no trainer class, no callbacks):

    env = setup_distributed()                                        # distributed
    run = RunDir.prepare(out, config_dict, env, free_keys=...)       # rundir: RUN/config.json, resume check
    stream = make_stream(dataset, BatchStreamConfig(...), env)       # streams: seeded, sharded, resumable
    cfg = loop_config(args, precision)                               # cli (schedule.LoopConfig)
    state = TrainingState(model, optimizer, scheduler, stream, env, scaler=...)  # state: what a checkpoint holds
    with TrainingRun.for_loop(run, state, cfg) as tr:   # run: resumes from the newest readable checkpoint
        window, step = MetricWindow(env), tr.start                   # log
        while step < cfg.max_steps:
            stats, lr = objective_step(tr, params, cfg, step + 1)    # step (or the recipe's own step: GRPO)
            step += 1
            window.add(stats)
            if cfg.log_due(step):
                log_objective_window(tr, cfg, step, window, lr)      # or tr.log.log(step, window.record())
            if tr.checkpoint_due(step):
                tr.save(step, extra={...})                    # the recipe's own state: tr.resumed.extra
        tr.finish(step, write_final)                          # summary line, RUN/final (rank 0, atomic)

Modules, bottom to top:
- ``distributed``: DistEnv, torchrun setup and teardown, collectives, rank-0 writes, DDP wrapping
- ``rng``: seeding, derived generators, RNG state capture and restore
- ``precision``: ``--precision`` resolved, autocast, loss scaling
- ``checkpoints``: the step-*.pt files: atomic writes, pruning, reading with fallback to the last good one
- ``rundir``: RUN/ and its config check; ``streams``: resumable, sharded data order
- ``state``: TrainingState (the checkpoint dict and its exact restore) and ``resume``
- ``log``: RunLogger (log.jsonl, TensorBoard, tqdm), read_log, MetricWindow; ``skips``: skipped files
- ``schedule``: LoopConfig, CheckpointSchedule, Progress; ``run``: TrainingRun
- ``step``: objective_step and its log line; ``cli``: the options every recipe shares

Conventions
- ``step`` counts completed optimizer steps; a checkpoint taken at step s resumes at step s + 1.
- The global batch (``--batch-size``) is the number of samples per optimizer step across all ranks
  and accumulation micro-steps, so the same command gives the same training on 1 or N processes.
- Randomness that must agree across ranks or survive a resume without stored state (augmentation,
  alpha jitter) is derived from ``(seed, ...)`` with :func:`training.parts.rng.derived_generator`.
"""
