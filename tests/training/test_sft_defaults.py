"""training.sft's speed levers by default: the token cache where the data is the same every epoch,
compiled blocks for long runs where a compiler is found; each with its opt-out, and the loss curve of the
default equal to the opt-out's."""
from __future__ import annotations

import pytest
import torch

from training.sft import __main__ as sft
from training.sft import model as sft_model
from training.parts.cli import SFT_COMPILE_MIN_STEPS
from training.parts.data import AugmentConfig, open_triplets
from training.parts.log import read_log
from training.sft.model import resolve_compile
from training.parts.token_cache import why_not_by_default
from tests.training.test_sft import _args as sft_args, write_run_inputs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return write_run_inputs(tmp_path_factory.mktemp("sft_defaults"), count=20)  # 16 training triplets


def _args(s, out, steps: int, *extra) -> list[str]:
    return sft_args(s, out, steps, "--batch-size", 4, "--log-every", 1, *extra)


def test_the_defaults_are_on_with_an_opt_out_each(setup, monkeypatch):
    parse = sft.build_parser().parse_args
    base = _args(setup, "RUN", 10)
    assert parse(base).token_cache is None and parse(base).compile is None  # None: the default's rule
    assert parse([*base, "--no-token-cache", "--no-compile"]).token_cache is False
    assert parse([*base, "--no-compile"]).compile is False
    cpu = torch.device("cpu")
    monkeypatch.setattr(sft_model, "compiler_missing", lambda device: None)
    assert resolve_compile(parse(_args(setup, "RUN", SFT_COMPILE_MIN_STEPS)), cpu)[0]
    assert not resolve_compile(parse(_args(setup, "RUN", SFT_COMPILE_MIN_STEPS - 1)), cpu)[0]  # short: not repaid
    assert resolve_compile(parse(_args(setup, "RUN", 3, "--compile")), cpu)[0]
    assert not resolve_compile(parse(_args(setup, "RUN", 10 ** 4, "--no-compile")), cpu)[0]
    assert not resolve_compile(parse(_args(setup, "RUN", 10 ** 4, "--strategy", "fsdp")), cpu)[0]
    monkeypatch.setattr(sft_model, "compiler_missing", lambda device: "no C++ compiler found")
    on, why = resolve_compile(parse(_args(setup, "RUN", 10 ** 4)), cpu)
    assert not on and "no C++ compiler" in why  # the default falls back to eager, saying why
    with pytest.raises(SystemExit, match="--compile: no C"):
        resolve_compile(parse(_args(setup, "RUN", 10 ** 4, "--compile")), cpu)


def test_the_token_cache_default_rule(setup):
    plain = open_triplets([str(setup["manifest"])], "train", 16, None, seed=0, shuffle=True)
    n = len(plain)
    assert why_not_by_default(plain, False, 2 * n) is None  # same data every epoch, read twice: on
    assert "each at most once" in why_not_by_default(plain, False, n)
    augmented = open_triplets([str(setup["manifest"])], "train", 16, AugmentConfig(), seed=0, shuffle=True)
    assert "differ every epoch" in why_not_by_default(augmented, True, 10 * n)


def test_the_default_trains_as_the_opt_out(setup, tmp_path):
    """--no-augment (the reference's data): the default reads the token maps back from the cache from the second
    epoch on; its loss curve equals that of --no-token-cache, which encodes every step."""
    runs = {}
    for name, extra in (("default", ()), ("opt_out", ("--no-token-cache",))):
        assert sft.main(_args(setup, tmp_path / name, 8, "--no-augment", *extra)) == 0  # 32 samples of 16
        runs[name] = [r["loss"] for r in read_log(tmp_path / name) if "loss" in r]
    assert len(runs["default"]) == 8
    assert (setup["manifest"].parent / ".token-cache").is_dir()  # the default used the cache
    torch.testing.assert_close(runs["default"], runs["opt_out"], atol=1e-5, rtol=1e-5)
