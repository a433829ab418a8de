"""Every option of every recipe and subcommand says what it does (`--help` has no bare option)."""
from __future__ import annotations

import argparse
import importlib

import pytest

ENTRY_POINTS = ("stylevar.cli", "serve.__main__", "web.__main__", "data_tools.synth", "data_tools.index",
                "data_tools.shards", "training.vqvae", "training.sft", "training.grpo", "training.demo",
                "training.merge_lora", "training.sharding", "stylevar.evaluate.__main__",
                "benchmarks.fidelity", "benchmarks.upsample")


class Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def parser_of(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser `module.main` builds, caught when it first parses (nothing else runs)."""
    def capture(self, *args, **kwargs):
        raise Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(Captured) as caught:
        importlib.import_module(module).main(["--help"])
    return caught.value.parser


def bare_options(parser: argparse.ArgumentParser, where: str) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += bare_options(sub, f"{where} {name}")
            continue
        if not (action.help or "").strip() and action.help != argparse.SUPPRESS:
            out.append(f"{where}: {'/'.join(action.option_strings) or action.dest}")
    return out


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_option_has_help_text(module, monkeypatch):
    missing = bare_options(parser_of(module, monkeypatch), module)
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_the_check_sees_a_bare_option():
    p = argparse.ArgumentParser()
    p.add_argument("--told", help="says what")
    p.add_argument("--bare")
    sub = p.add_subparsers().add_parser("run")
    sub.add_argument("--inner")
    assert bare_options(p, "x") == ["x: --bare", "x run: --inner"]
