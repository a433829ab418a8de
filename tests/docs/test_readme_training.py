"""The README's training example, run as written (its shell block, shortened through the step variables it
documents), its closing check, and its agreement with docs/training.md."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

REPO = Path(__file__).resolve().parents[2]
STEPS = {"TOKENIZER_STEPS": "2", "SFT_STEPS": "2"}


def shell_block(markdown: str, heading: str) -> str:
    """The first ```bash block after ``heading`` (a whole line), before the next heading of its level."""
    level = heading.split(" ")[0]
    start = markdown.index(f"\n{heading}\n")
    end = markdown.find(f"\n{level} ", start + 1)
    section = markdown[start:end if end >= 0 else None]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, f"no bash block under {heading}"
    return match.group(1)


def test_the_readme_and_docs_training_give_the_same_commands():
    readme = shell_block((REPO / "README.md").read_text(), "## Training")
    docs = shell_block((REPO / "docs" / "training.md").read_text(), "## Quick start on CPU (the README's example)")
    assert readme == docs
    assert "OMP_NUM_THREADS" in readme, "the thread advice sits with the commands"
    assert readme.startswith("source .venv/bin/activate"), "the block says where python and stylevar come from"
    timed = [line for line in readme.splitlines() if line and not line.startswith((" ", "export", "source"))]
    for line in readme.splitlines():
        if line.startswith(("python", "stylevar", "    --")) and not line.endswith("\\"):
            assert re.search(r"# ~?[\d.]+ (s|min)", line), f"no measured time on: {line}"
    assert len(timed) == 4


def test_the_readme_training_example_runs_as_written(tmp_path):
    block = shell_block((REPO / "README.md").read_text(), "## Training")
    (tmp_path / "stylevar").symlink_to(REPO / "stylevar")  # the shipped examples the check reads
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the set-up command's environment, which the block activates
    env = {**os.environ, **STEPS, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(["bash", "-e", "-u", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]

    # the check says what it loaded and where it wrote the stylized example
    summary = re.search(r"^loaded stylevar-sft: 64 px, 6 scales, (\d+\.\d\d) M parameters "
                        r"\(transformer with its image encoders (\d+\.\d\d) M: what training.sft trains; "
                        r"tokenizer (\d+\.\d\d) M\)$", done.stdout, re.M)
    assert summary, done.stdout
    total, transformer, tokenizer = map(float, summary.groups())
    assert total > 0 and abs(total - transformer - tokenizer) <= 0.011
    trained = re.search(r"\[sft\] .* (\d+\.\d\d)M trainable parameters \(the transformer with its image encoders",
                        done.stderr)
    assert trained and float(trained.group(1)) == transformer, "the two counts agree"
    assert "wrote runs/sft/check.png (256x256)" in done.stdout
    with Image.open(tmp_path / "runs" / "sft" / "check.png") as check:
        assert check.size == (256, 256)
    assert "note: the model draws 64x64 pixels; the result is upscaled 4.0x" in done.stderr

    # every run says how long it took (the ETA lines: tests/training/test_loop.py) and writes its final model
    assert re.search(r"\[tok\] trained steps 1-2 in [\d.]+ (s|min)", done.stderr), done.stderr[-3000:]
    assert re.search(r"\[sft\] trained steps 1-2 in [\d.]+ (s|min)", done.stderr), done.stderr[-3000:]
    for run in ("tok", "sft"):
        assert (tmp_path / "runs" / run / "final" / "config.json").is_file()
        ckpts = sorted(p.name for p in (tmp_path / "runs" / run / "checkpoints").iterdir())
        assert ckpts == ["step-00000002.pt"]

    # git ignores every folder the commands created
    created = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("stylevar", ".venv"))
    assert created == ["data", "runs"]
    for name in created:
        inside = next(p for p in (tmp_path / name).rglob("*") if p.is_file()).relative_to(tmp_path)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(inside)], cwd=REPO)
        assert ignored.returncode == 0, f"{inside} is not ignored by git"
