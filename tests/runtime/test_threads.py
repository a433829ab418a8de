"""Torch's CPU threads (stylevar.utils.threads): the CPUs a process may use from its affinity and its cgroup's quota
(real cgroup files written here), the policy over them, who decides in which order, and the one policy reaching
the service's setting, the command line's flag and the library's argument; the entry points set OpenMP's wait
setting before they import torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from stylevar.utils import threads
from stylevar.utils.threads import CpuBudget, cgroup_quota, choose_threads, parse_threads

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def undecided(monkeypatch):
    """A process that has not decided its threads yet; torch's count put back afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_decided", None)
    yield
    torch.set_num_threads(before)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2(tmp_path: Path, cpu_max: str, cgroup: str = "/") -> float | None:
    """cgroup v2: ``cpu.max`` of the process's own cgroup folder, read as this process would."""
    write(tmp_path / "fs" / cgroup.strip("/") / "cpu.max", cpu_max + "\n")
    write(tmp_path / "proc_cgroup", f"0::{cgroup}\n")
    return cgroup_quota(tmp_path / "fs", tmp_path / "proc_cgroup")


@pytest.mark.parametrize("cpu_max, quota, cpus", [
    ("max 100000", None, 4),  # no quota: the affinity's CPUs
    ("150000 100000", 1.5, 2),  # rounded up: both threads are throttled together, neither is waited for
    ("50000 100000", 0.5, 1),  # at least one
    ("200000 100000", 2.0, 2),
    ("800000 100000", 8.0, 4),  # the affinity bounds it too
    ("max", None, 4),
    ("garbage 100000", None, 4),  # unreadable: as if there were none
])
def test_cgroup_v2_cpu_max(tmp_path, cpu_max, quota, cpus):
    assert v2(tmp_path, cpu_max) == quota
    assert CpuBudget(affinity=4, quota=quota).cpus == cpus


def test_the_least_quota_of_the_cgroup_and_its_parents_counts(tmp_path):
    fs = tmp_path / "fs"
    write(fs / "kubepods" / "cpu.max", "300000 100000")
    assert v2(tmp_path, "max 100000", "/kubepods/pod1/ctr") == 3.0  # the parent's
    assert v2(tmp_path, "100000 100000", "/kubepods/pod1/ctr") == 1.0  # the child's, tighter
    # a container that sees its own cgroup at the root: the path named in /proc is not there, the root is read
    write(fs / "cpu.max", "250000 100000")
    write(tmp_path / "proc_cgroup", "0::/system.slice/elsewhere.scope\n")
    assert cgroup_quota(fs, tmp_path / "proc_cgroup") == 2.5


def test_cgroup_v1_cfs_quota_and_period(tmp_path):
    fs = tmp_path / "fs"
    ctr = fs / "cpu,cpuacct" / "docker" / "abc"
    write(ctr / "cpu.cfs_quota_us", "250000\n")
    write(ctr / "cpu.cfs_period_us", "100000\n")
    write(fs / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")  # the root: no quota
    write(fs / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    write(tmp_path / "proc_cgroup", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_quota(fs, tmp_path / "proc_cgroup") == 2.5
    assert CpuBudget(affinity=8, quota=2.5).cpus == 3
    write(ctr / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(fs, tmp_path / "proc_cgroup") is None


def test_no_cgroup_files_is_no_quota(tmp_path):
    assert cgroup_quota(tmp_path / "none", tmp_path / "no_proc_file") is None
    write(tmp_path / "proc_cgroup", "0::/\n")
    assert cgroup_quota(tmp_path / "empty", tmp_path / "proc_cgroup") is None


def test_this_process_budget_is_its_affinity_at_most():
    budget = threads.cpu_budget()
    assert budget.affinity == len(os.sched_getaffinity(0))
    assert 1 <= budget.cpus <= budget.affinity


@pytest.mark.parametrize("affinity, quota, count", [(1, None, 1), (2, None, 1), (8, None, 7), (4, 1.5, 1),
                                                    (16, 4.0, 3)])
def test_the_policy_spares_one_cpu(affinity, quota, count):
    choice = choose_threads(None, environ={}, budget=CpuBudget(affinity, quota))
    assert (choice.threads, choice.policy) == (count, True)
    assert threads.DEFAULT_RULE in choice.source and f"affinity {affinity}" in choice.source


def test_who_decides_in_order():
    budget = CpuBudget(8)
    env = {"STYLEVAR_THREADS": "5", "OMP_NUM_THREADS": "2"}
    assert choose_threads(3, env, budget).threads == 3  # the argument
    assert choose_threads("torch", env, budget).threads is None  # torch's own count, asked for
    assert choose_threads(None, env, budget).threads == 5  # STYLEVAR_THREADS
    left = choose_threads(None, {"STYLEVAR_THREADS": "auto", "OMP_NUM_THREADS": "2"}, budget)
    assert left.threads is None and not left.policy and "OMP_NUM_THREADS=2" in left.source
    assert choose_threads(None, {"MKL_NUM_THREADS": "4"}, budget).threads is None
    assert choose_threads(None, {"STYLEVAR_THREADS": "torch"}, budget).threads is None
    assert choose_threads(None, {"OMP_NUM_THREADS": ""}, budget).threads == 7  # empty: not set
    with pytest.raises(ValueError, match="STYLEVAR_THREADS: threads must be a positive integer"):
        choose_threads(None, {"STYLEVAR_THREADS": "-2"}, budget)


@pytest.mark.parametrize("value, parsed", [(None, None), ("", None), ("auto", None), (" AUTO ", None), (0, None),
                                           ("0", None), ("torch", "torch"), (3, 3), (" 12 ", 12)])
def test_thread_values_as_every_surface_takes_them(value, parsed):
    assert parse_threads(value) == parsed


@pytest.mark.parametrize("value", [-1, "-1", 1.5, "1.5", "x", True, "²"])
def test_other_thread_values_are_refused(value):
    with pytest.raises(ValueError, match="positive integer, 'auto' or 'torch'"):
        parse_threads(value)


def test_an_explicit_count_is_set_and_the_process_decides_once(undecided):
    choice = threads.apply_threads(1, environ={})
    assert torch.get_num_threads() == 1 and choice.threads == 1 and threads.decision() == choice
    torch.set_num_threads(3)  # the caller, after loading: wins
    assert threads.apply_threads(None, environ={}) == choice and torch.get_num_threads() == 3
    assert threads.apply_threads(2, environ={}).threads == 2 and torch.get_num_threads() == 2  # explicit: always


def test_a_count_the_caller_set_before_loading_stays(undecided, monkeypatch):
    mine = max(threads.torch_own_counts()) + 1  # no count torch picks by itself
    torch.set_num_threads(mine)
    monkeypatch.setattr(threads, "cpu_budget", lambda: CpuBudget(1))
    choice = threads.apply_threads(None, environ={})
    assert torch.get_num_threads() == mine and choice.threads is None
    assert f"torch.set_num_threads({mine})" in choice.source


def test_torch_own_count_gives_way_to_the_policy_but_never_to_more(undecided, monkeypatch):
    own = max(threads.torch_own_counts())
    torch.set_num_threads(own)
    monkeypatch.setattr(threads, "cpu_budget", lambda: CpuBudget(1))
    assert threads.apply_threads(None, environ={}).threads == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "_decided", None)
    torch.set_num_threads(own)
    monkeypatch.setattr(threads, "cpu_budget", lambda: CpuBudget(own + 8))
    choice = threads.apply_threads(None, environ={})
    assert choice.threads == own and torch.get_num_threads() == own and "at most torch's own" in choice.source


def test_omp_num_threads_leaves_torch_its_count(undecided, monkeypatch):
    own = max(threads.torch_own_counts())
    torch.set_num_threads(own)
    monkeypatch.setattr(threads, "cpu_budget", lambda: CpuBudget(1))
    choice = threads.apply_threads(None, environ={"OMP_NUM_THREADS": str(own)})
    assert choice.threads is None and torch.get_num_threads() == own


def test_the_pipeline_applies_its_threads_argument(undecided, micro_model_dir):
    from stylevar.pipelines.pipeline import StylePipeline

    with pytest.raises(ValueError, match="positive integer"):
        StylePipeline.from_pretrained(micro_model_dir, device="cpu", threads=-3)
    StylePipeline.from_pretrained(micro_model_dir, device="cpu", threads=1)
    assert torch.get_num_threads() == 1 and threads.decision().source == "threads=1"


def test_the_wait_setting_for_entry_points(monkeypatch):
    env: dict[str, str] = {}
    assert threads.prepare_environment(env) == {"OMP_WAIT_POLICY": "PASSIVE"} and env["OMP_WAIT_POLICY"] == "PASSIVE"
    for theirs in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"}):
        env = dict(theirs)
        assert threads.prepare_environment(env) == {} and env == theirs  # the user's setting stays
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert threads.prepare_environment() == {} and "OMP_WAIT_POLICY" not in os.environ  # torch is imported here


def test_the_service_setting(monkeypatch):
    from serve.engine.runner import RunnerOptions
    from serve.settings import ServeSettings

    monkeypatch.delenv("STYLEVAR_THREADS", raising=False)
    assert ServeSettings().threads is None  # auto: the policy
    for env, value in (("auto", None), ("0", None), ("3", 3), ("torch", "torch")):
        monkeypatch.setenv("STYLEVAR_THREADS", env)
        assert ServeSettings().threads == value
        assert RunnerOptions.from_settings(ServeSettings()).threads == value
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv("STYLEVAR_THREADS", bad)
        with pytest.raises(ValidationError, match="positive integer, 'auto' or 'torch'"):
            ServeSettings()
    monkeypatch.delenv("STYLEVAR_THREADS")
    monkeypatch.setenv("STYLEVAR_TORCH_THREADS", "2")  # the old name: refused, naming the new one
    with pytest.raises(ValidationError, match="STYLEVAR_TORCH_THREADS was renamed STYLEVAR_THREADS"):
        ServeSettings()


def test_the_command_line_flag(capsys):
    from stylevar import cli

    def parsed(*flag: str):
        return cli.build_parser(["stylize"]).parse_args(["stylize", "c.png", "s.png", "-o", "o.png", *flag]).threads

    assert parsed() is None and parsed("--threads", "auto") is None
    assert parsed("--threads", "2") == 2 and parsed("--threads", "torch") == "torch"
    with pytest.raises(SystemExit) as bad:
        parsed("--threads", "-1")
    assert bad.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threads" in err[0] and "positive integer, 'auto' or 'torch'" in err[0]
    bench = cli.build_parser(["bench"]).parse_args(["bench", "--threads", "3"])
    assert bench.threads == 3


def test_stylize_runs_with_its_threads(undecided, micro_model_dir, tmp_path):
    from PIL import Image

    from stylevar import cli

    Image.new("RGB", (24, 16), (200, 30, 30)).save(tmp_path / "c.png")
    Image.new("RGB", (16, 16), (20, 30, 200)).save(tmp_path / "s.png")
    assert cli.main(["stylize", str(tmp_path / "c.png"), str(tmp_path / "s.png"), "-o", str(tmp_path / "o.png"),
                     "--model", str(micro_model_dir), "--device", "cpu", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1 and threads.decision().source == "threads=1"


# what an entry point has done when it first asks for the wait setting: torch imported or not, and what it set
SPY = """
import json, os, sys
from stylevar.utils import threads
def spy(environ=None):
    done = threads.__dict__["_prepare"](environ)
    print(json.dumps({"torch_imported": "torch" in sys.modules, "set": done,
                      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}))
    sys.exit(0)
threads._prepare, threads.prepare_environment = threads.prepare_environment, spy
import runpy
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["serve", "--no-ui"], ["stylevar.cli", "bench", "--preset", "tiny"]],
                         ids=["python -m serve", "stylevar"])
def test_entry_points_set_the_wait_setting_before_torch(argv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in threads.WAIT_ENV and not k.startswith("STYLEVAR_")}
    done = subprocess.run([sys.executable, "-c", SPY, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"torch_imported": False, "set": {"OMP_WAIT_POLICY": "PASSIVE"}, "omp_wait_policy": "PASSIVE"}
