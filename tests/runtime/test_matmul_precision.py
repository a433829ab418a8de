"""The matmul precision (stylevar.utils.precision): set once per process by every entry point, TF32 on
CUDA only, and the quantizer's distances never in TF32."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from stylevar.cli import BUILTIN
from stylevar.utils.precision import set_matmul_precision, strict_addmm_

ROOT = Path(__file__).resolve().parents[2]
# every entry point that runs a model, by its module: each calls set_matmul_precision before the work
ENTRY_POINTS = {
    "serve/engine/runner.py": "the service, however started (ModelRunner.load)",
    "stylevar/cli/stylize.py": "stylevar stylize",
    "stylevar/cli/bench.py": "stylevar bench",
    "stylevar/cli/evaluate.py": "stylevar evaluate (and python -m / torchrun -m stylevar.evaluate)",
    "training/parts/cli.py": "the recipes' shared main (run_recipe): python -m training.sft|grpo|vqvae|demo",
    "benchmarks/train_step.py": "python -m benchmarks.train_step --device",
    "benchmarks/device_run.py": "python -m benchmarks.device_run (each stage's process; the golden one strict fp32)",
}
# entry points whose setting is made by another module on their way to a model (listed in ENTRY_POINTS)
SET_BY = {"serve/__main__.py": "serve/engine/runner.py",
          **{f"training/{recipe}/__main__.py": "training/parts/cli.py" for recipe in ("sft", "grpo", "vqvae", "demo")}}
# the entry points that run no model's products, each with why
NO_MODEL = {
    "serve/healthcheck.py": "an HTTP probe of a running service",
    "web/__main__.py": "the UI, a client of a service's API",
    "stylevar/evaluate/__main__.py": "hands its arguments to `stylevar evaluate`",
    "training/merge_lora.py": "folds LoRA factors into weights, which stay strict float32 products",
    "training/sharding.py": "writes data shards",
    "stylevar/cli/convert.py": "rewrites checkpoint layouts",
    "stylevar/cli/pull.py": "downloads model files",
    "stylevar/cli/weights.py": "lists and removes cached weights",
}


def _entry_modules() -> set[str]:
    """Every `python -m` main of the service, the library and the recipes, every built-in `stylevar` command,
    and the GPU run of benchmarks/ (benchmarks/device_run.py)."""
    is_main = re.compile(r"^if __name__ == ['\"]__main__['\"]:", re.M)
    mains = {str(p.relative_to(ROOT)) for pkg in ("serve", "stylevar", "training", "web")
             for p in (ROOT / pkg).rglob("*.py") if is_main.search(p.read_text())}
    commands = {cmd.arguments.__module__.replace(".", "/") + ".py" for cmd in BUILTIN}
    devices = {str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").glob("device_run.py")}
    return mains | commands | devices


def _calls_it(path: str) -> bool:
    tree = ast.parse((ROOT / path).read_text())
    return any(isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
               == "set_matmul_precision" for node in ast.walk(tree))


def test_every_entry_point_sets_the_matmul_precision():
    found = _entry_modules()
    unlisted = sorted(found - set(ENTRY_POINTS) - set(SET_BY) - set(NO_MODEL))
    assert not unlisted, f"entry points neither setting the matmul precision nor listed as running no model: {unlisted}"
    missing = sorted(f"{path} ({what})" for path, what in ENTRY_POINTS.items() if not _calls_it(path))
    assert not missing, f"entry points that do not call set_matmul_precision: {missing}"
    assert set(SET_BY.values()) <= set(ENTRY_POINTS)
    assert all("run_recipe(" in (ROOT / path).read_text() for path, by in SET_BY.items() if by == "training/parts/cli.py")
    devices = [p for p in found if p.startswith("benchmarks/device_run")]
    assert all(_calls_it(p) for p in devices), devices


@pytest.fixture
def restore_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_tf32_on_cuda_only_and_off_on_request(restore_flags):
    set_matmul_precision()
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"  # readable: torch.compile reads it
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"  # the CPU's products untouched
    set_matmul_precision(tf32=False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"


def test_strict_addmm_is_the_float32_addmm_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    a, b, out = torch.randn(50, 8, generator=g), torch.randn(8, 30, generator=g), torch.randn(50, 30, generator=g)
    assert torch.equal(strict_addmm_(out.clone(), a, b, alpha=-2), out.clone().addmm_(a, b, alpha=-2, beta=1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_quantizer_picks_the_cpu_codes_on_cuda_under_tf32(restore_flags):
    from stylevar.models.tokenizer.quantizer import MultiScaleQuantizer

    torch.manual_seed(0)
    quant = MultiScaleQuantizer(4096, 32, (1, 2, 4, 8, 16), 0.5, 4, 0.25)
    z_NC = torch.randn(8 * 256, 32)
    set_matmul_precision()
    cpu, cuda = quant.nearest(z_NC), quant.cuda().nearest(z_NC.cuda()).cpu()
    assert (cpu != cuda).float().mean() < 1e-3  # ties apart, the same codes
