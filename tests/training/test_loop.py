"""training.parts on a toy model: sharded data order, RNG capture, atomic checkpoints, exact resume,
run-config checks, logging, and DDP equivalence (gloo, 2 processes)."""
from __future__ import annotations

import json
import os
import random
import re
import socket
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from training.parts.checkpoints import CheckpointManager, CheckpointsUnreadableError
from stylevar.runtime.distributed import leave_process_group
from training.parts.distributed import DistEnv, setup_distributed, wrap_ddp
from training.parts.log import MetricWindow, read_log
from stylevar.utils.precision import make_grad_scaler
from training.parts.rng import capture_rng_state, derived_generator, restore_rng_state, seed_everything
from training.parts.run import TrainingRun
from training.parts.rundir import RunConfigMismatchError, RunDir
from training.parts.schedule import CheckpointSchedule, LoopConfig, Progress
from training.parts.state import TrainingState
from training.parts.step import log_objective_window, objective_step
from training.parts.streams import BatchStream, BatchStreamConfig, EpochShardSampler

CPU1 = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


pytestmark = pytest.mark.usefixtures("one_thread")


def _env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))


# ------------------------------------------------------------------------------------------ data order
def test_shards_of_a_global_batch_are_the_same_samples():
    n, b, world = 37, 3, 2
    single = list(EpochShardSampler(n, epoch=4, seed=9, world_size=1))
    shards = [list(EpochShardSampler(n, epoch=4, seed=9, rank=r, world_size=world)) for r in range(world)]
    assert len(shards[0]) == len(shards[1]) == n // world
    for i in range(len(shards[0]) // b):
        got = sorted(shards[0][i * b : (i + 1) * b] + shards[1][i * b : (i + 1) * b])
        assert got == sorted(single[i * b * world : (i + 1) * b * world])
    # another epoch is another order; the same epoch is the same order
    assert list(EpochShardSampler(n, epoch=5, seed=9)) != single
    assert list(EpochShardSampler(n, epoch=4, seed=9)) == single
    assert list(EpochShardSampler(n, epoch=4, seed=9, start=5)) == single[5:]


def test_batch_stream_resumes_at_the_next_batch_across_epochs():
    ds = TensorDataset(torch.arange(10).float())
    cfg = BatchStreamConfig(global_batch=4, seed=3)
    ref = BatchStream(ds, cfg, CPU1)
    assert ref.batches_per_epoch == 2
    seen = [ref.next()[0].tolist() for _ in range(7)]
    assert sorted(sum(seen[:2], [])) != sorted(sum(seen[2:4], [])) or seen[:2] != seen[2:4]
    half = BatchStream(ds, cfg, CPU1)
    for _ in range(3):
        half.next()
    state = half.state_dict()
    assert state == {"epoch": 1, "index": 1, "seed": 3}
    resumed = BatchStream(ds, cfg, CPU1)
    resumed.load_state_dict(state)
    assert [resumed.next()[0].tolist() for _ in range(4)] == seen[3:]
    with pytest.raises(RunConfigMismatchError):
        BatchStream(ds, BatchStreamConfig(global_batch=4, seed=4), CPU1).load_state_dict(state)


def test_batch_sizes_must_divide():
    ds = TensorDataset(torch.zeros(8))
    with pytest.raises(ValueError, match="multiple"):
        BatchStream(ds, BatchStreamConfig(global_batch=6, grad_accum=4), CPU1)
    with pytest.raises(ValueError, match="fewer than one"):
        BatchStream(ds, BatchStreamConfig(global_batch=16), CPU1)


def test_derived_generator_is_a_pure_function_of_its_keys():
    a = torch.rand(4, generator=derived_generator(1, 2, 3))
    b = torch.rand(4, generator=derived_generator(1, 2, 3))
    c = torch.rand(4, generator=derived_generator(1, 3, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ------------------------------------------------------------------------------------------ RNG state
def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    g = torch.Generator().manual_seed(5)
    seed_everything(123)
    torch.rand(3, generator=g)
    state = capture_rng_state({"aug": g})
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=g))
    seed_everything(999)
    torch.rand(5, generator=g)
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), {"aug": g})
    got = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=g))
    assert got[0] == expected[0] and got[1] == expected[1]
    assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])
    with pytest.raises(KeyError, match="other"):
        restore_rng_state(state, {"other": torch.Generator()})


class _CudaRng:
    """The CUDA generators of a machine with ``count`` GPUs, for torch.cuda's RNG functions on the CPU: a
    device it lacks fails as torch's does ("invalid device ordinal")."""

    def __init__(self, count: int):
        self.states = [torch.full((8,), 10 + i, dtype=torch.uint8) for i in range(count)]

    def _index(self, device) -> int:
        index = device if isinstance(device, int) else torch.device(device or "cuda").index or 0
        if index >= len(self.states):
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return index

    def get(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.get(i) for i in range(len(self.states))])
        for module in (torch.cuda, torch.cuda.random):  # set_rng_state_all calls its module's set_rng_state
            monkeypatch.setattr(module, "get_rng_state", self.get)
            monkeypatch.setattr(module, "set_rng_state", self.set)


def test_a_resume_restores_the_cuda_rng_when_the_number_of_gpus_changed(monkeypatch, tmp_path):
    """A checkpoint written by a process on cuda:0 of a 2-GPU machine resumes on a machine with one GPU (and one
    written before, holding every visible GPU's state, too): the saved state of the process's device is restored."""
    saved_on = _CudaRng(2)
    saved_on.install(monkeypatch)
    cuda0 = torch.device("cuda", 0)
    torch.save(capture_rng_state(device=cuda0), tmp_path / "rng.pt")
    state = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert len(state["cuda"]) == 1  # this process's GPU only
    older = {**state, "cuda": [saved_on.get(0), saved_on.get(1)]}

    for saved in (state, older):
        resumed_on = _CudaRng(1)
        resumed_on.install(monkeypatch)
        resumed_on.states[0].zero_()
        restore_rng_state(saved, device=cuda0)
        assert torch.equal(resumed_on.states[0], saved_on.states[0])
    restore_rng_state(state, device=torch.device("cpu"))  # a CPU resume has no CUDA state to restore


# ------------------------------------------------------------------------------------------ checkpoints
def test_checkpoints_are_atomic_and_pruned(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", CPU1, keep=2)
    assert mgr.load().state is None
    for step in (1, 2, 3):
        mgr.save(step, {"step": step, "w": torch.full((2,), float(step))})
    assert [s for s, _ in mgr.paths()] == [2, 3]
    (tmp_path / "ck" / ".step-00000004.pt.77.tmp").write_bytes(b"torn write")
    state = mgr.load().state
    assert state["step"] == 3 and torch.equal(state["w"], torch.full((2,), 3.0))
    assert not list((tmp_path / "ck").glob("*.tmp")), "stale temp files are removed"
    os.replace(tmp_path / "ck" / "step-00000003.pt", tmp_path / "ck" / "step-00000009.pt")
    with pytest.raises(RuntimeError, match="holds step 3"):
        mgr.load().state


def test_run_dir_refuses_a_different_config(tmp_path):
    RunDir.prepare(tmp_path / "run", {"lr": 1e-3, "steps": 10, "save_every": 5}, CPU1, free_keys=["save_every"])
    RunDir.prepare(tmp_path / "run", {"lr": 1e-3, "steps": 10, "save_every": 2}, CPU1, free_keys=["save_every"])
    with pytest.raises(RunConfigMismatchError, match=r"lr: 0.001 -> 0.002"):
        RunDir.prepare(tmp_path / "run", {"lr": 2e-3, "steps": 10}, CPU1, free_keys=["save_every"])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["save_every"] == 2


# ------------------------------------------------------------------------------------------ a toy recipe's loop
class ToyObjective(nn.Module):
    """Regression with dropout (so the torch RNG matters) and a noise term from a named generator."""

    def __init__(self, dropout: float = 0.1, noise: float = 0.01):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 1))
        self.gen = torch.Generator().manual_seed(11)
        self.noise = noise

    def forward(self, batch):
        x, y = batch
        noise = self.noise * torch.randn(y.shape, generator=self.gen)
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y + noise)
        return loss, {"abs_err": (self.net(x).squeeze(-1) - y).abs().mean().detach()}


def _toy_data(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    return TensorDataset(x, y)


def _toy_fit(run_dir, max_steps, total_steps, env=CPU1, global_batch=8, grad_accum=1, progress=False,
             random_parts=True, timing: dict | None = None):
    """A toy recipe: the loop training.sft and training.vqvae write, over the same parts. ``timing``: the
    clock, to_device and LoopConfig overrides for the checkpoint-schedule tests (save_every,
    save_every_minutes, keep_checkpoints)."""
    timing = dict(timing or {})
    seed_everything(0)
    obj = ToyObjective() if random_parts else ToyObjective(dropout=0.0, noise=0.0)
    model = wrap_ddp(obj, env)
    params = [p for p in obj.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.05, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.2 if s >= total_steps // 2 else 1.0)
    run = RunDir.prepare(run_dir, {"total": total_steps}, env)
    stream = BatchStream(_toy_data(), BatchStreamConfig(global_batch=global_batch, grad_accum=grad_accum, seed=1), env)
    to_device = timing.pop("to_device", lambda b: b)
    clock = timing.pop("clock", time.monotonic)

    def validate():
        obj.eval()
        with torch.no_grad():
            x, y = _toy_data(16).tensors
            err = (obj.net(x).squeeze(-1) - y).abs()
        return {"val_loss": float(err.square().mean()), "val_acc": float((err < 1).float().mean())}

    def write_final(path):
        torch.save(obj.state_dict(), path / "weights.pt")

    cfg = LoopConfig(**{"max_steps": max_steps, "save_every": 3, "val_every": 4, "log_every": 2, "keep_checkpoints": 2,
                        "max_grad_norm": 1.0, "grad_accum": grad_accum, "progress": progress, **timing})
    state = TrainingState(model, opt, sched, stream, env, scaler=make_grad_scaler("fp32", env.device),
                               generators={"noise": obj.gen})
    with TrainingRun.for_loop(run, state, cfg, clock=clock) as tr:
        model.train()
        step = tr.start
        window = MetricWindow(env)
        while step < cfg.max_steps:
            stats, lr = objective_step(tr, params, cfg, step + 1, to_device)
            step += 1
            window.add(stats)
            if cfg.log_due(step):
                log_objective_window(tr, cfg, step, window, lr)
            if cfg.val_due(step):
                tr.log.log(step, validate(), prefix="val")
                model.train()
            if tr.checkpoint_due(step):
                tr.save(step)
        if step > tr.start:
            tr.log.log(step, validate(), prefix="val")
        tr.finish(step, write_final)
    return obj


def test_fit_resume_is_bitwise_exact_and_logs(tmp_path):
    full = _toy_fit(tmp_path / "full", 12, 12, progress=True)
    _toy_fit(tmp_path / "part", 6, 12)
    # a process killed after step 6's checkpoint may have logged more steps: they are cut on resume
    with open(tmp_path / "part" / "log.jsonl", "a") as f:
        f.write(json.dumps({"step": 7, "loss": 0.0, "lr": 0.0}) + "\n" + '{"step": 8, "lo')
    resumed = _toy_fit(tmp_path / "part", 12, 12)
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(full.gen.get_state(), resumed.gen.get_state())
    final = torch.load(tmp_path / "part" / "final" / "weights.pt", weights_only=True)
    assert torch.equal(final["net.0.weight"], full.net[0].weight)

    full_log, part_log = read_log(tmp_path / "full"), read_log(tmp_path / "part")
    train = [r for r in full_log if "loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6, 8, 10, 12]
    assert all({"step", "loss", "lr", "grad_norm", "abs_err"} <= set(r) for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert train[0]["lr"] == pytest.approx(0.05) and train[-1]["lr"] == pytest.approx(0.01)
    val = [r for r in full_log if "val_loss" in r]
    assert [r["step"] for r in val] == [4, 8, 12] and all("val_acc" in r for r in val)
    strip = lambda log: [{k: v for k, v in r.items() if k not in ("time", "steps_per_s")} for r in log]  # noqa: E731
    # the resumed run's log equals the uninterrupted one, except the extra validation at step 6 (its end)
    assert [r for r in strip(part_log) if not ("val_loss" in r and r["step"] == 6)] == strip(full_log)
    assert [s for s, _ in CheckpointManager(tmp_path / "part" / "checkpoints", CPU1).paths()] == [9, 12]
    assert (tmp_path / "full" / "tb").is_dir() and any((tmp_path / "full" / "tb").iterdir())

    # running the finished command again does no work and keeps the result
    again = _toy_fit(tmp_path / "full", 12, 12)
    assert torch.equal(again.net[0].weight, full.net[0].weight)
    assert len(read_log(tmp_path / "full")) == len(full_log)


class StepClock:
    """A clock that moves only when the loop fetches a batch: ``seconds_per_batch`` each time."""

    def __init__(self, seconds_per_batch: float):
        self.now, self.seconds_per_batch, self.saved_at = 1000.0, seconds_per_batch, {}

    def __call__(self) -> float:
        return self.now

    def next_batch(self, batch):
        self.now += self.seconds_per_batch
        return batch


def test_time_based_checkpoints_are_written_within_the_interval(tmp_path, capsys):
    clock = StepClock(seconds_per_batch=40.0)  # each step "takes" 40 s; checkpoint every 1.5 min = 90 s
    timing = {"clock": clock, "to_device": clock.next_batch, "save_every": 1000, "save_every_minutes": 1.5,
              "keep_checkpoints": 100}
    original = CheckpointManager.save

    def save(self, step, state):  # note the fake time at which each checkpoint is written
        clock.saved_at[step] = clock.now
        return original(self, step, state)

    with pytest.MonkeyPatch.context() as mp_:
        mp_.setattr(CheckpointManager, "save", save)
        _toy_fit(tmp_path / "timed", 12, 12, timing=timing)
    # 40 s steps: 120 s >= 90 s after step 3, again after 6 and 9; the last step always
    assert [s for s, _ in CheckpointManager(tmp_path / "timed" / "checkpoints", CPU1).paths()] == [3, 6, 9, 12]
    times = [1000.0, *clock.saved_at.values()]
    assert all(b - a <= 90.0 + 40.0 for a, b in zip(times, times[1:])), "a gap longer than the interval + one step"
    err = capsys.readouterr().err
    assert "checkpoint step-00000003.pt; step 3/12 (25%), 0.025 steps/s, about 6 min left" in err
    assert "trained steps 1-12 in 8 min" in err

    # without the time rule only the step rule and the end write checkpoints
    clock = StepClock(seconds_per_batch=40.0)
    _toy_fit(tmp_path / "steps", 12, 12, timing={**timing, "clock": clock, "to_device": clock.next_batch,
                                                 "save_every": 5, "save_every_minutes": 0.0})
    assert [s for s, _ in CheckpointManager(tmp_path / "steps" / "checkpoints", CPU1).paths()] == [5, 10, 12]


def test_checkpoint_schedule_rules():
    now = [0.0]
    schedule = CheckpointSchedule(CPU1, max_steps=10, every_steps=4, every_minutes=1.0, clock=lambda: now[0])
    now[0] = 59.0
    assert not schedule.due(1)
    now[0] = 60.0
    assert schedule.due(2)
    schedule.saved()
    now[0] = 100.0
    assert schedule.due(4) and not schedule.due(5) and schedule.due(10)
    with pytest.raises(ValueError, match="save_every_minutes"):
        CheckpointSchedule(CPU1, max_steps=10, every_steps=4, every_minutes=-1.0)
    with pytest.raises(ValueError, match="save_every_minutes"):
        LoopConfig(max_steps=3, save_every_minutes=float("nan"))


def test_the_time_left_leaves_the_warm_up_out():
    """A 100 s first step (compilation) then 1 s steps: no estimate until a step after the warm-up, then the rate
    of the steps after it, not the first step's."""
    now = [0.0]
    progress = Progress(0, 1000, clock=lambda: now[0], warmup_steps=10)
    for step, seconds in enumerate([100.0] + [1.0] * 29, start=1):
        now[0] += seconds
        if step == 10:
            assert progress.line(step) == "step 10/1000 (1%), estimating the time left..."
        progress.passed(step)
    assert progress.line(30).startswith("step 30/1000 (3%), 1 steps/s, about 16 min left")  # 970 s
    assert [s for s in range(1, 40) if progress.first_lines_due(s)] == [10, 20]
    resumed = Progress(500, 1000, clock=lambda: now[0], warmup_steps=10)
    assert "estimating" in resumed.line(505) and resumed.first_lines_due(510)


def _damage(path, how: str) -> bytes:
    """A torn write: the first half of the file (``truncated``) or nothing at all (``empty``)."""
    data = path.read_bytes()
    data = data[: len(data) // 2] if how == "truncated" else b""
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("how", ["truncated", "empty"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys, how):
    full = _toy_fit(tmp_path / "full", 12, 12)
    _toy_fit(tmp_path / "part", 9, 12)  # checkpoints at steps 6 and 9 (keep 2)
    ckpts = tmp_path / "part" / "checkpoints"
    damaged = _damage(ckpts / "step-00000009.pt", how)
    capsys.readouterr()
    resumed = _toy_fit(tmp_path / "part", 12, 12)
    err = capsys.readouterr().err
    assert "resumed from step 6" in err
    # what torch raises on a torn zip depends on where it was cut ("PytorchStreamReader failed ...", OSError, ...)
    reason = r"\w+Error: .+" if how == "truncated" else r"empty file"
    assert re.search(rf"checkpoint {re.escape(str(ckpts / 'step-00000009.pt'))} is unreadable \({reason}\)", err)
    assert "renamed to step-00000009.pt.corrupt" in err
    # the run continued exactly as if the damaged file had never been written
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    steps = lambda run: [r["step"] for r in read_log(run)]  # noqa: E731
    assert steps(tmp_path / "part") == steps(tmp_path / "full")
    # the bad file is kept aside (not pruned as one of the newest, not tried again)
    assert (ckpts / "step-00000009.pt.corrupt").read_bytes() == damaged
    assert [s for s, _ in CheckpointManager(ckpts, CPU1).paths()] == [9, 12]


def test_no_readable_checkpoint_is_one_clear_error_naming_the_files(tmp_path):
    _toy_fit(tmp_path / "run", 6, 12)  # checkpoints at steps 3 and 6
    ckpts = tmp_path / "run" / "checkpoints"
    _damage(ckpts / "step-00000006.pt", "empty")
    _damage(ckpts / "step-00000003.pt", "truncated")
    with pytest.raises(CheckpointsUnreadableError) as info:
        _toy_fit(tmp_path / "run", 12, 12)
    msg = str(info.value)
    assert "\n" not in msg and str(ckpts) in msg
    assert "step-00000006.pt (empty file)" in msg
    assert re.search(r"step-00000003.pt \(\w+Error: .+\)", msg)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-00000003.pt", "step-00000006.pt"]  # nothing renamed


def test_any_unloadable_file_is_skipped(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", CPU1, keep=5)
    mgr.save(1, {"step": 1, "w": torch.ones(2)})
    (tmp_path / "ck" / "step-00000002.pt").write_bytes(b"not a pickle at all")
    torch.save({"no": "step"}, tmp_path / "ck" / "step-00000003.pt")
    torch.save([1, 2, 3], tmp_path / "ck" / "step-00000004.pt")
    loaded = mgr.load()
    assert loaded.state["step"] == 1 and loaded.path == tmp_path / "ck" / "step-00000001.pt"
    assert [b.path.name for b in loaded.skipped] == ["step-00000004.pt", "step-00000003.pt", "step-00000002.pt"]
    assert "not a training checkpoint" in loaded.skipped[0].reason
    assert [s for s, _ in mgr.paths()] == [1]
    assert mgr.load().state["step"] == 1


def _assert_close_states(a, b, atol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-4, msg=k)


def _assert_same_curves(dir_a, dir_b):
    la, lb = read_log(dir_a), read_log(dir_b)
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    for ra, rb in zip(la, lb):
        for k in ("loss", "lr", "val_loss"):
            if k in ra:
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), (ra["step"], k)


def test_grad_accumulation_matches_the_full_batch(tmp_path):
    a = _toy_fit(tmp_path / "a", 4, 4, global_batch=8, grad_accum=1, random_parts=False)
    b = _toy_fit(tmp_path / "b", 4, 4, global_batch=8, grad_accum=2, random_parts=False)
    _assert_close_states(a.state_dict(), b.state_dict())
    _assert_same_curves(tmp_path / "a", tmp_path / "b")
    c = _toy_fit(tmp_path / "c", 4, 4, global_batch=4, grad_accum=1, random_parts=False)
    assert not torch.allclose(a.net[0].weight, c.net[0].weight, atol=1e-5), "a different batch trains differently"


# ------------------------------------------------------------------------------------------ DDP (gloo)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    env = setup_distributed("cpu")
    try:
        obj = _toy_fit(run_dir, 6, 6, env=env, global_batch=8, random_parts=False)
        if env.is_main:
            torch.save(obj.state_dict(), out)
    finally:
        leave_process_group()


@pytest.mark.slow
def test_ddp_two_processes_match_one(tmp_path):
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path / "ddp"), str(tmp_path / "ddp.pt")), nprocs=2)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    single = _toy_fit(tmp_path / "single", 6, 6, random_parts=False).state_dict()
    _assert_close_states(ddp, single)
    _assert_same_curves(tmp_path / "ddp", tmp_path / "single")
    assert (tmp_path / "ddp" / "final" / "weights.pt").exists()
    assert [s for s, _ in CheckpointManager(tmp_path / "ddp" / "checkpoints", CPU1).paths()] == [3, 6]


@pytest.mark.parametrize("ends_at", ["log", "checkpoint"])
def test_a_non_finite_loss_stops_with_a_clear_error_before_any_log_line_or_checkpoint(tmp_path, ends_at):
    """The step notes a non-finite loss on the device (no host sync); the next log line or checkpoint reads it
    and stops the run, naming the first step that diverged, with nothing written."""
    class Diverging(ToyObjective):
        calls = 0

        def forward(self, batch):
            self.calls += 1
            loss, metrics = super().forward(batch)
            return loss * (float("nan") if self.training and self.calls == 2 else 1.0), metrics

    env = CPU1
    obj = Diverging()
    opt = torch.optim.SGD(obj.parameters(), lr=0.1)
    state = TrainingState(obj, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                               BatchStream(_toy_data(), BatchStreamConfig(global_batch=8), env), env,
                               scaler=make_grad_scaler("fp32", env.device))
    cfg = LoopConfig(max_steps=4, log_every=4, progress=False)
    run = RunDir.prepare(tmp_path / "nan", {}, env)
    with pytest.raises(FloatingPointError, match="loss is nan at step 2 on rank 0"):
        with TrainingRun.for_loop(run, state, cfg) as tr:
            window = MetricWindow(env)
            for step in (1, 2, 3):
                window.add(objective_step(tr, list(obj.parameters()), cfg, step)[0])
            if ends_at == "log":
                log_objective_window(tr, cfg, 3, window, 0.1)
            else:
                tr.save(3)
    assert not list(run.checkpoints.glob("step-*")) and not read_log(run.root)
