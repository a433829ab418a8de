"""A full disk while writing: one clear line (disk full, the folder, the bytes, the checkpoint kept), no
partial file left behind, the earlier checkpoints intact, and a resume from the last good one.

The writes are failed by a patched ``torch.save`` / writer raising ENOSPC, and for real on a small tmpfs
(skipped where ``mount`` is not allowed)."""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from stylevar.utils.atomic import WriteFailedError, atomic_folder, atomic_write, format_bytes
from tests.conftest import single_thread_env
from tests.training.test_loop import CPU1
from tests.training.test_sft import _args as sft_args, _weights, write_run_inputs
from training.sft import __main__ as sft
from training.parts import fsdp, rundir
from training.parts.checkpoints import read_checkpoint
from stylevar.runtime.distributed import leave_process_group
from training.parts.distributed import DistEnv, setup_distributed, wrap_ddp
from stylevar.utils.precision import make_grad_scaler
from training.parts.run import TrainingRun
from training.parts.rundir import RunDir
from training.parts.schedule import LoopConfig
from training.parts.state import TrainingState
from training.parts.step import objective_step
from training.parts.streams import BatchStream, BatchStreamConfig

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _raise(e: BaseException):
    raise e


def _temps(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------------ the helper
def test_a_failed_write_keeps_the_old_file_and_removes_the_partial_one(tmp_path):
    dest = tmp_path / "data.bin"
    dest.write_bytes(b"old")

    def half_then_full(f):
        f.write(b"x" * 1000)
        raise _enospc()

    with pytest.raises(WriteFailedError) as info:
        atomic_write(dest, half_then_full, size=3 << 20, what="blob")
    message = str(info.value)
    assert message.startswith(f"cannot write blob data.bin in {tmp_path}: disk full (No space left on device); "
                              "it needs about 3.0 MiB, ")
    assert message.endswith(" free") and "\n" not in message
    assert info.value.disk_full and info.value.errno == errno.ENOSPC
    assert dest.read_bytes() == b"old" and _temps(tmp_path) == []
    assert isinstance(info.value, OSError)  # callers that catch OSError still do


def test_torch_save_s_runtime_error_is_read_as_the_full_disk_behind_it(tmp_path):
    class FullAfter:
        """A file that takes 200 bytes, then is full (torch.save turns that into its own RuntimeError)."""

        def __init__(self, f):
            self.f, self.left = f, 200

        def write(self, data):
            if len(data) > self.left:
                raise _enospc()
            self.left -= len(data)
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    with pytest.raises(WriteFailedError, match=r"disk full \(No space left on device\)") as info:
        atomic_write(tmp_path / "c.pt", lambda f: torch.save({"w": torch.zeros(10_000)}, FullAfter(f)))
    assert isinstance(info.value.__cause__, RuntimeError)  # what torch raised; the OSError is behind it
    assert _temps(tmp_path) == [] and not (tmp_path / "c.pt").exists()
    assert [format_bytes(n) for n in (512, 4096, 5 << 20, 3 << 30)] == ["512 B", "4.0 KiB", "5.0 MiB", "3.0 GiB"]


def test_a_failed_folder_keeps_the_old_one(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    (final / "weights").write_text("good")
    with pytest.raises(WriteFailedError, match=rf"cannot write model folder final in {tmp_path}: disk full"):
        with atomic_folder(final, what="model folder") as tmp:
            (tmp / "weights").write_text("partial")
            raise _enospc()
    assert (final / "weights").read_text() == "good" and _temps(tmp_path) == []


def test_a_failed_sharded_checkpoint_removes_its_temp_folder(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException

    def full(state, checkpoint_id, **_):  # DCP reports a rank's failure wrapped, on every rank
        Path(checkpoint_id).mkdir()
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"partial shard")
        raise CheckpointException("write failed", {0: (_enospc(), None)})

    monkeypatch.setattr(dcp, "save", full)
    model = nn.Linear(4, 4)
    folder = tmp_path / "step-00000004.dcp"
    with pytest.raises(WriteFailedError, match=rf"sharded checkpoint step-00000004.dcp in {tmp_path}: disk full"):
        fsdp.save_sharded(folder, model, torch.optim.AdamW(model.parameters()), CPU1)
    assert list(tmp_path.iterdir()) == []


def test_an_unchanged_config_is_not_rewritten_and_a_full_disk_is_said(tmp_path, monkeypatch):
    RunDir.prepare(tmp_path / "run", {"lr": 1.0, "save_every": 5}, CPU1, free_keys=["save_every"])
    stale = tmp_path / "run" / "checkpoints" / ".step-00000005.pt.77.tmp"  # a kill -9 during a write
    stale.write_bytes(b"x" * 1000)
    monkeypatch.setattr(rundir, "atomic_write_text", lambda path, text: atomic_write(path, lambda f: _raise(_enospc())))
    RunDir.prepare(tmp_path / "run", {"lr": 1.0, "save_every": 5}, CPU1, free_keys=["save_every"])  # no write
    assert not stale.exists()
    with pytest.raises(SystemExit, match=rf"^error: cannot write config.json in {tmp_path / 'run'}: disk full"):
        RunDir.prepare(tmp_path / "run", {"lr": 1.0, "save_every": 2}, CPU1, free_keys=["save_every"])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["save_every"] == 5


# ------------------------------------------------------------------------------------------ training.sft
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_run_inputs(tmp_path_factory.mktemp("disk_full"), count=16, val_fraction=0.0)


def _args(data, out: Path) -> list[str]:
    return sft_args(data, out, 6, "--save-every", 2, "--batch-size", 4)


def _assert_resumes_to_the_uninterrupted_result(data, run: Path, tmp_path: Path, capsys) -> None:
    capsys.readouterr()
    assert sft.main(_args(data, run)) == 0
    assert "resumed from step 4" in capsys.readouterr().err
    sft.main(_args(data, tmp_path / "uninterrupted"))
    a, b = _weights(run), _weights(tmp_path / "uninterrupted")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_full_disk_at_a_checkpoint_exits_with_one_line_and_resumes(data, tmp_path, monkeypatch, capsys):
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):  # the third checkpoint (step 6) finds the disk full half-way
        calls.append(1)
        if len(calls) == 3:
            f.write(b"x" * 4096)
            raise _enospc()
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        sft.main(_args(data, run))
    ckpts = run / "checkpoints"
    message = str(info.value.code)
    assert message.startswith(f"error: cannot write checkpoint step-00000006.pt in {ckpts}: disk full "
                              "(No space left on device); it needs about 5.")
    assert message.endswith("The last good checkpoint, step-00000004.pt (step 4), is kept: free some space and "
                            "re-run the same command to resume from it") and "\n" not in message
    assert _temps(run) == [] and not (run / "final").exists()
    assert read_checkpoint(ckpts / "step-00000004.pt")["step"] == 4
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    _assert_resumes_to_the_uninterrupted_result(data, run, tmp_path, capsys)


@pytest.fixture
def small_disk(tmp_path):
    """A 13 MiB tmpfs (room for two checkpoints of the micro model, not three): (mount point, resize)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=13m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")

    def resize(mib: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={mib}m", str(disk)], check=True)

    try:
        yield disk, resize
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_safetensors_write_on_a_really_full_disk_is_said(small_disk):
    """safetensors' writer gives no errno: the space left tells the full disk; the old file stays."""
    from stylevar.models.pretrained import save_safetensors

    disk, _ = small_disk
    dest = disk / "transformer.safetensors"
    save_safetensors({"w": torch.zeros(4)}, dest)
    old = dest.read_bytes()
    with pytest.raises(WriteFailedError, match=rf"^cannot write weights transformer.safetensors in {disk}: "
                                               "disk full; it needs about 16.0 MiB") as info:
        save_safetensors({"w": torch.zeros(4 << 20)}, dest)
    assert info.value.disk_full and dest.read_bytes() == old and _temps(disk) == []


def test_a_really_full_disk_exits_with_one_line_frees_the_partial_file_and_resumes(data, small_disk, tmp_path,
                                                                                      capsys):
    disk, resize = small_disk
    run = disk / "run"
    done = subprocess.run([sys.executable, "-m", "training.sft", *_args(data, run)], cwd=REPO,
                          env=single_thread_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write checkpoint step-00000006.pt in {run / 'checkpoints'}: disk full "
                           "(No space left on device); it needs about 5."), last
    assert " MiB free. The last good checkpoint" in last
    assert last.endswith("The last good checkpoint, step-00000004.pt (step 4), is kept: free some space and "
                         "re-run the same command to resume from it")
    assert "Traceback" not in done.stderr
    assert _temps(run) == []
    stat = os.statvfs(disk)
    assert stat.f_bavail * stat.f_frsize > 1 << 20, "the partial checkpoint's space is free again"
    assert read_checkpoint(run / "checkpoints" / "step-00000004.pt")["step"] == 4
    resize(40)
    _assert_resumes_to_the_uninterrupted_result(data, run, tmp_path, capsys)


# ------------------------------------------------------------------------------------------ two processes
class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y), {}


def _tiny_run(run_dir: str, env: DistEnv, steps: int) -> None:
    """The shortest recipe over the training parts: a checkpoint every 2 steps."""
    torch.manual_seed(0)
    obj = Regression()
    model = wrap_ddp(obj, env)
    opt = torch.optim.SGD(obj.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32))
    stream = BatchStream(data, BatchStreamConfig(global_batch=8, seed=1), env)
    state = TrainingState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), stream, env,
                               scaler=make_grad_scaler("fp32", env.device))
    cfg = LoopConfig(max_steps=steps, save_every=2, progress=False)
    with TrainingRun.for_loop(RunDir.prepare(run_dir, {}, env), state, cfg) as tr:
        step = tr.start
        while step < steps:
            objective_step(tr, list(obj.parameters()), cfg, step + 1)
            step += 1
            if tr.checkpoint_due(step):
                tr.save(step)
        tr.finish(step, None)


def _full_on_rank0_worker(rank: int, world: int, port: int, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    env = setup_distributed("cpu", timeout_s=60)  # a rank left waiting fails the test, not hangs it
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("step") == 4:
            raise _enospc()
        return real_save(obj, f, *args, **kwargs)

    torch.save = save
    try:
        _tiny_run(run_dir, env, 6)
        message = "finished"
    except SystemExit as e:
        message = str(e.code)
    finally:
        torch.save = real_save
        leave_process_group()
    Path(out, f"rank{rank}.txt").write_text(message)
    # the rank's line is written: end here, before the interpreter's finalization, where gloo may still abort a
    # rank on a busy machine ("terminate called without an active exception") after its group was left
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_full_disk_on_rank_0_stops_every_rank_with_the_same_line(tmp_path):
    run = tmp_path / "run"
    mp.spawn(_full_on_rank0_worker, args=(2, _free_port(), str(run), str(tmp_path)), nprocs=2)
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert lines[0] == lines[1]
    assert lines[0].startswith(f"error: cannot write checkpoint step-00000004.pt in {run / 'checkpoints'}: disk full")
    assert lines[0].endswith("The last good checkpoint, step-00000002.pt (step 2), is kept: free some space and "
                             "re-run the same command to resume from it")
    assert _temps(run) == []
