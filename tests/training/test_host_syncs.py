"""The training step never waits for the device between log steps, and the loaders follow one policy: workers,
persistent workers and pinned memory when the device is CUDA (training.parts.streams.loader_policy).

On a GPU a host read of a device tensor (``float(loss)``, ``.item()``, ``bool(t)``, ``.cpu()``, a data-dependent
shape) makes the host wait until the GPU has finished everything queued, so it cannot run ahead and queue the next
micro-step. The CPU cannot show the wait itself, but it can count the reads: :class:`HostReads` counts every such
call (a TorchFunctionMode) while training.sft runs on a tiny model, per optimizer step, the data loading left out
(host data there)."""
from __future__ import annotations

import contextlib
import signal
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.training.test_loop import CPU1
from tests.training.test_sft import TRANS as SFT_TRANS, _args, write_run_inputs
from training.sft import __main__ as sft
from training.parts import schedule, step as objective_loop, stop
from training.parts.distributed import DistEnv
from training.parts.run import TrainingRun
from training.parts.streams import BatchStream, BatchStreamConfig, LoaderPolicy, default_num_workers, loader_policy

pytestmark = pytest.mark.usefixtures("one_thread")

TRANS = {**SFT_TRANS, "embed_dim": 32, "drop_path_rate": 0.1}

# what makes the host wait for a GPU: reading a value, a copy to the host, an output shape that depends on values
READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
         torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero,
         torch.masked_select, torch.Tensor.masked_select, torch.unique, torch.Tensor.unique}


class HostReads(TorchFunctionMode):
    """Counts READS by the step they happen in (``step``, set by the caller); ``paused`` while data loads."""

    def __init__(self):
        super().__init__()
        self.step, self.paused, self.by_step = 0, False, {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS and not self.paused:
            self.by_step.setdefault(self.step, []).append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def pause(self):
        was, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = was


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_run_inputs(tmp_path_factory.mktemp("syncs"), count=16, val_fraction=0.0, transformer=TRANS)


def test_the_sft_step_reads_the_device_on_log_steps_only(inputs, tmp_path, monkeypatch):
    reads = HostReads()
    step_of = objective_loop.objective_step

    def paused(fn):
        """``fn`` with the counting paused."""
        def call(*args):
            with reads.pause():
                return fn(*args)
        return call

    def counted_step(tr, params, cfg, step, to_device):
        reads.step = step
        stream = tr.state.stream
        if not hasattr(stream, "_counted"):  # the stream's next() (to_device's argument) is data loading too
            stream.next, stream._counted = paused(stream.next), True
        return step_of(tr, params, cfg, step, paused(to_device))

    monkeypatch.setattr(objective_loop, "objective_step", counted_step)
    with reads:
        sft.main(_args(inputs, tmp_path / "run", 8, "--log-every", 4, "--batch-size", 4, "--grad-accum", 2,
                       "--alpha-jitter", 0.1, "--save-every", 100, "--save-every-minutes", 0, "--no-token-cache",
                       "--no-compile"))
    between = {step: names for step, names in reads.by_step.items() if step not in (0, 4, 8)}  # 0: the set-up
    assert not between, f"host reads in steps that do not log: {between}"
    assert reads.by_step.get(4), "the log step reads the window (else nothing was counted)"


# ------------------------------------------------------------------------------------------ the loader policy
def test_loaders_on_cuda_use_persistent_workers_and_pinned_memory(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    cuda = loader_policy(None, torch.device("cuda"))
    assert cuda.num_workers >= 1 and cuda.pin_memory
    options = cuda.options(persistent=True)
    assert options.pop("multiprocessing_context").get_start_method() == "forkserver"  # never a fork of the trainer
    assert options == {"num_workers": cuda.num_workers, "pin_memory": True, "persistent_workers": True}
    cpu = loader_policy(None, torch.device("cpu"))
    assert cpu == LoaderPolicy(0, pin_memory=False)  # the CPU's cores are the step's
    assert loader_policy(3, torch.device("cpu")).num_workers == 3  # --num-workers wins
    # the CPUs of this process's share less its own, at least 1, at most 8
    assert [default_num_workers("cuda", 32, 8), default_num_workers("cuda", 4, 8), default_num_workers("cuda", 96, 1),
            default_num_workers("cpu", 32, 1)] == [3, 1, 8, 0]
    with pytest.raises(ValueError, match="--num-workers must be >= 0"):
        loader_policy(-1, torch.device("cuda"))


class Epochs(torch.utils.data.Dataset):
    """Items that say the epoch their dataset saw (module level: workers start from a server and unpickle it)."""

    epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([self.epoch, i])


def test_the_training_stream_keeps_its_workers_across_epochs_and_passes_the_epoch():
    """The stream's one loader has persistent workers on CUDA's policy; the workers see each epoch through the
    item keys (a dataset's set_epoch in the main process would not reach them)."""
    stream = BatchStream(Epochs(), BatchStreamConfig(global_batch=4, shuffle=False, loader=LoaderPolicy(2)), CPU1)
    assert stream._loader.persistent_workers and stream._loader.num_workers == 2
    epochs = [stream.next()[:, 0].tolist() for _ in range(6)]
    assert epochs == [[0] * 4, [0] * 4, [1] * 4, [1] * 4, [2] * 4, [2] * 4]
    workers = stream._loader._iterator._workers
    assert all(w.is_alive() for w in workers) and len(workers) == 2  # the same two for the three epochs
    stream.load_state_dict({"epoch": 5, "index": 1, "seed": 0})  # a resume mid-epoch
    assert stream.next().tolist() == [[5, 4], [5, 5], [5, 6], [5, 7]]


def test_ranks_agree_on_a_stop_or_a_timed_checkpoint_on_log_steps_only(tmp_path, monkeypatch):
    """Rank 0's signal and clock reach the other ranks by a broadcast (a host read on a GPU): every log step and
    the last, not every step; a signal then stops the run at the next log step, checkpointed there."""
    broadcasts: list[int] = []
    now = {"step": 0}

    def broadcast_(t, env):
        broadcasts.append(now["step"])
        return t

    monkeypatch.setattr(stop, "broadcast_", broadcast_)
    monkeypatch.setattr(schedule, "broadcast_", broadcast_)
    env = DistEnv(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    tr = TrainingRun(SimpleNamespace(checkpoints=tmp_path), SimpleNamespace(env=env), max_steps=12, save_every=100,
                     save_every_minutes=60, agree_every=4)
    tr.schedule = schedule.CheckpointSchedule(env, max_steps=12, every_steps=100, every_minutes=60, clock=lambda: 0.0)
    due = []
    for step in range(1, 13):
        now["step"] = step
        if step == 5:
            tr.stop.received = signal.SIGTERM
        if tr.checkpoint_due(step):
            due.append((step, tr.stopping))
            tr.stop.received = None
    assert sorted(set(broadcasts)) == [4, 8, 12]
    assert due == [(8, True), (12, False)]
