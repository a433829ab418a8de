"""A run on the CPU of a machine that has a CUDA toolkit but no usable GPU prints no "No CUDA runtime is found":
torch's C++ extension loader warns so when it is imported (torch.compile's Inductor imports it to compile on the
CPU); compiling the blocks (`stylevar.runtime.compile.compile_blocks`, for generation, the service and training)
imports it quietly first (`stylevar.utils.devices.import_compiler_quietly`)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # two interpreters importing torch

NOTICE = "No CUDA runtime is found"
COMPILE_THEN_IMPORT = """
from stylevar.config import presets
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR
from stylevar.runtime.compile import compile_blocks

vq_cfg, tr_cfg = presets("tiny")
model = StyleVAR(tr_cfg, MultiScaleVQVAE(vq_cfg))
compile_blocks(model)
import torch.utils.cpp_extension  # what Inductor imports at the first compiled step on the CPU
print("compiled")
"""


def run(code: str, cuda_home: str) -> subprocess.CompletedProcess:
    # a CUDA toolkit where torch looks for one, and no GPU it may use: the setting of the warning on any machine
    env = {**os.environ, "CUDA_HOME": cuda_home, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_compiling_on_the_cpu_prints_no_cuda_notice(tmp_path):
    plain = run("import torch.utils.cpp_extension", str(tmp_path))
    assert NOTICE in plain.stderr, "the setting no longer provokes the warning: the test below proves nothing"
    done = run(COMPILE_THEN_IMPORT, str(tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]
    assert NOTICE not in done.stderr, done.stderr[-3000:]
