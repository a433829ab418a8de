"""Shared fixtures: the reference golden data (tests/data/reference) and small models; the suite's parallel
workers (pytest-xdist, one test file per worker at a time) and their thread share."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Each pytest-xdist worker gets its share of the CPUs as intra-op threads, set before torch starts its pool;
# the subprocesses a test starts inherit it. Two workers on two cores each run one thread: most tests are small
# and single-threaded (or start single-threaded subprocesses), so the pair finishes in about half the time.
from stylevar.utils.threads import cpu_budget  # no torch

WORKER_SHARE = (max(1, cpu_budget().cpus // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
                if os.environ.get("PYTEST_XDIST_WORKER") else None)  # None: not a worker
if WORKER_SHARE is not None:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(WORKER_SHARE)

import pytest  # noqa: E402 - after the thread share above
import torch  # noqa: E402

if WORKER_SHARE is not None:
    torch.set_num_threads(WORKER_SHARE)

from stylevar.config import StyleVARConfig, VQVAEConfig
from tests import reference

# the service's gc.freeze after warm-up (serve.http.app.freeze_startup_heap) would keep every test's garbage from the
# apps built before it; tests that want it (and servers they start) say so
os.environ.setdefault("STYLEVAR_GC_FREEZE", "false")
# precision "auto" (the service's and the command line's default) runs bf16 where this CPU's bf16 products measure
# faster: the pictures the suite compares across surfaces and with its data are fp32's, on every CPU; tests of auto
# ask for it
os.environ.setdefault("STYLEVAR_PRECISION", "fp32")


WORKER_MEMORY_GB = 8  # the most one worker has been seen to hold (its models and the subprocesses it starts)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: no error where xdist is not installed
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per CPU this process may use, as many as the memory holds (2 on 2 cores, 24 GB)."""
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cpu_budget().cpus, int(memory_gb // WORKER_MEMORY_GB)))


# The longest files, measured (each a minute or more on 2 cores): handed to the workers first, so that no worker
# starts one of them while the others have nothing left to do. Only the order changes.
LONGEST_FILES = ("tests/training/test_demo_recipe.py", "tests/training/test_sft.py", "tests/training/test_grpo.py",
                 "tests/benchmarks/test_benchmarks.py", "tests/training/test_scale_out.py",
                 "tests/docs/test_readme_training.py", "tests/evaluate/test_evaluate.py")


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: the order within each file and among the other files is kept


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The conformance data (tests/data/reference, or $STYLEVAR_REFERENCE_DIR): missing data fails, never skips."""
    try:
        return reference.reference_dir()
    except FileNotFoundError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def golden(reference_dir):
    """Reference config, seeded state dicts (VQ-VAE, StyleVAR, class-conditional VAR) and golden outputs."""
    d = reference_dir / "golden_small"
    cfg = reference.read_config(reference_dir)

    def state(table: str, offset: int) -> dict[str, torch.Tensor]:
        return reference.seeded_state(reference.read_key_table(d / table), cfg["patch_nums"], cfg["seed"] + offset)

    return {
        "cfg": cfg,
        "vae_sd": state("vae_keys.tsv", 0),
        "stylevar_sd": state("stylevar_keys.tsv", 1000),
        "var_sd": state("var_keys.tsv", 2000),
        "data": torch.load(d / "golden.pt", weights_only=True),
        "vq_cfg": VQVAEConfig.from_reference(cfg),
        "tr_cfg": StyleVARConfig.from_reference(cfg),
    }


def micro_configs() -> tuple[VQVAEConfig, StyleVARConfig]:
    """The smallest sensible model (32 px, 3 scales) for fast tests of the plumbing."""
    vq = VQVAEConfig(vocab_size=64, z_channels=8, ch=16, ch_mult=(1, 2, 2), num_res_blocks=1, patch_nums=(1, 2, 4, 8))
    tr = StyleVARConfig(depth=2, embed_dim=64, num_heads=2, patch_nums=vq.patch_nums, vocab_size=64, z_channels=8,
                        alpha_nums=(0.3, 0.4, 0.5, 0.6), image_encoder="cnn", encoder_dim=64)
    return vq, tr


@pytest.fixture(scope="session")
def micro_pipeline():
    from stylevar.pipelines.pipeline import StylePipeline

    return StylePipeline.random(micro_configs(), seed=0)


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory, micro_pipeline):
    return micro_pipeline.save_pretrained(tmp_path_factory.mktemp("micro_model"))


def set_hf_env(mp: pytest.MonkeyPatch, *, cache: Path | None = None, offline: bool | None = None) -> None:
    """HF_HUB_CACHE / HF_HUB_OFFLINE for subprocesses (the environment) and for this process, where
    huggingface_hub read them at import (its `constants`, which stylevar.loaders.hub asks)."""
    from huggingface_hub import constants

    if cache is not None:
        mp.setenv("HF_HUB_CACHE", str(cache))
        mp.setattr(constants, "HF_HUB_CACHE", str(cache))
    if offline is not None:
        mp.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
        mp.setattr(constants, "HF_HUB_OFFLINE", offline)


def use_weight_cache(mp: pytest.MonkeyPatch, root: Path) -> tuple[Path, Path]:
    """Point the weight cache at ``root``: STYLEVAR_HOME = root/sv, TORCH_HOME = root/th, and the Hugging Face
    cache (where Hub-hosted weights are looked for first) at root/hf (none created)."""
    sv, th = root / "sv", root / "th"
    mp.setenv("STYLEVAR_HOME", str(sv))
    mp.setenv("TORCH_HOME", str(th))
    set_hf_env(mp, cache=root / "hf")
    return sv, th


@pytest.fixture
def weight_homes(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """An empty weight cache for one test: (STYLEVAR_HOME, TORCH_HOME)."""
    return use_weight_cache(monkeypatch, tmp_path)


@pytest.fixture
def one_thread():
    """The machine is shared: one intra-op thread keeps small training runs fast and repeatable."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def single_thread_env() -> dict[str, str]:
    """Environment for training subprocesses: one thread each, warnings off."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def run_recipe(module: str, args: list, run_dir: Path, *, kill_at_step: int | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m module args` to the end. With `kill_at_step`, first start it, SIGKILL it as soon as
    that step's checkpoint appears (checking that it really was interrupted), then run the same command
    again, which must resume; returns the completed (resumed) run."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    repo = Path(__file__).resolve().parents[1]
    if kill_at_step is not None:
        proc = subprocess.Popen(cmd, cwd=repo, env=single_thread_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        ckpt = run_dir / "checkpoints" / f"step-{kill_at_step:08d}.pt"
        deadline = time.time() + timeout
        while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert ckpt.exists(), "the checkpoint to kill at never appeared"
        assert proc.returncode == -signal.SIGKILL
        assert not (run_dir / "final").exists(), "the run finished before the kill: nothing was tested"
    done = subprocess.run(cmd, cwd=repo, env=single_thread_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    if kill_at_step is not None:
        assert f"resumed from step {kill_at_step}" in done.stderr
    return done


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random `tiny` model directory named "tiny-test" (the service tests' model)."""
    from stylevar.pipelines.pipeline import StylePipeline

    d = tmp_path_factory.mktemp("tiny-model")
    StylePipeline.random("tiny", name="tiny-test").save_pretrained(d)
    return d
