"""Every fenced code block of README.md, docs/ui.md and docs/video.md runs as written, or says why it is not run here.

A block that is not run here carries a marker on the line before its fence:
``<!-- readme-test: not run: REASON -->`` (downloads, a service that runs until stopped, files a reader
brings) or ``<!-- readme-test: run by tests/FILE.py ... -->``. Every other block is Python or bash and runs
here as printed, each alone in a fresh process (nothing is shared but the files a block writes, which a later
block may read, as a reader's would), in document order, from a stand-in for the repository root after the
set-up commands: a temporary folder with the repository's files (linked) and ``.venv``, the environment the
tests run in. Python blocks run with ``.venv/bin/python``, bash blocks with a PATH that does not hold that
environment (a fresh shell that never activated it).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/ui.md", "docs/video.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
MARK = re.compile(r"<!-- readme-test: (not run: .+|run by tests/\S+\.py.*) -->")


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    lang: str
    code: str
    mark: str | None  # why it is not run by this test, or None


def blocks(document: str) -> list[Block]:
    text = (REPO / document).read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.fullmatch(before.strip())
        out.append(Block(document, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                         mark.group(1) if mark else None))
    return out


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_runs_or_says_why_not(document):
    unmarked = [b for b in blocks(document) if b.mark is None and b.lang not in ("python", "bash")]
    assert not unmarked, "\n".join(f"{b.document}:{b.line}: a ```{b.lang} block with no readme-test marker"
                                   for b in unmarked)
    for b in blocks(document):
        if b.mark and b.mark.startswith("run by "):
            assert (REPO / b.mark.split()[2]).is_file(), f"{b.document}:{b.line}: {b.mark}"


def runnable(document: str, lang: str = "python") -> list[Block]:
    return [b for b in blocks(document) if b.mark is None and b.lang == lang]


def repository_root(folder: Path) -> Path:
    """``folder`` as the repository's root after the set-up commands: its files linked, ``.venv`` the tests' own
    environment; what the blocks write (outputs/) stays in ``folder``."""
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv", "outputs", "runs", "data"):
            (folder / entry.name).symlink_to(entry)
    (folder / ".venv").symlink_to(Path(sys.prefix))
    return folder


def fresh_shell_env() -> dict[str, str]:
    """The environment of a new shell that never activated the virtual environment."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PATH": path}


def run_block(block: Block, root: Path) -> subprocess.CompletedProcess:
    cmd = ([str(root / ".venv" / "bin" / "python"), "-c", block.code] if block.lang == "python" else
           ["bash", "-e", "-c", block.code])
    return subprocess.run(cmd, cwd=root, env=fresh_shell_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if runnable(d) + runnable(d, "bash")])
def test_every_block_runs_alone_as_printed(document, tmp_path):
    root = repository_root(tmp_path)
    todo = [b for b in blocks(document) if b.mark is None]
    assert {b.lang for b in todo} <= {"python", "bash"}, {b.lang for b in todo}
    for block in todo:
        done = run_block(block, root)
        assert done.returncode == 0, f"{document}:{block.line}: {done.stderr[-4000:]}"


def test_the_parser_reads_marks_and_blocks(tmp_path, monkeypatch):
    doc = tmp_path / "d.md"
    doc.write_text("text\n\n<!-- readme-test: not run: downloads -->\n```bash\nstylevar pull\n```\n\n"
                   "```python\nx = 1\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    got = blocks("d.md")
    assert [(b.lang, b.code, b.mark) for b in got] == [("bash", "stylevar pull\n", "not run: downloads"),
                                                       ("python", "x = 1\n", None)]


def test_the_tour_command_gives_the_tour_s_picture(tmp_path):
    """The shell command the tour says does the same as its first Python block writes the same picture."""
    import numpy as np
    from PIL import Image

    python, shell = runnable("README.md")[0], runnable("README.md", "bash")[0]
    assert 'out.save("outputs/out.png")' in python.code and "-o outputs/out_shell.png" in shell.code
    root = repository_root(tmp_path)
    for block in (python, shell):
        done = run_block(block, root)
        assert done.returncode == 0, done.stderr[-4000:]
    a, b = (np.asarray(Image.open(tmp_path / "outputs" / f), dtype=np.int16) for f in ("out.png", "out_shell.png"))
    assert a.shape == b.shape
    # the command runs the model prepared for inference (fused, the service's path): float rounding may move a
    # pixel by a level; the options must agree (a different style strength moved them by ~10 levels on average)
    assert np.abs(a - b).max() <= 2 and (a != b).mean() < 1e-3, (np.abs(a - b).mean(), (a != b).mean())


def test_the_package_wins_over_a_folder_named_stylevar(tmp_path):
    """From a folder that holds a directory named `stylevar` (the clone, seen from its parent), the installed
    package is imported, not that directory as an empty namespace (the editable install puts the repository
    on the path: backend/editable_backend.py)."""
    (tmp_path / "stylevar").mkdir()
    done = subprocess.run([sys.executable, "-c", "from stylevar import StylePipeline; import stylevar; print(stylevar.__file__)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == REPO / "stylevar" / "__init__.py"
