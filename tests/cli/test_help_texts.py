"""Every command's `--help`: every option says what it does (no bare option), each default is shown once and
none as "(default: None)", required options say so, and the help prints within 3 s (no torch before parsing).
The service's help points to its settings."""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stylevar.utils.helptext import HelpFormatter, plain
from tests.conftest import single_thread_env

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ("stylevar.cli", "serve.__main__", "web.__main__", "data_tools.synth", "data_tools.index",
                "data_tools.shards", "data_tools.teach", "data_tools.pictures", "training.vqvae.__main__",
                "training.sft.__main__", "training.grpo.__main__", "training.demo.__main__", "training.merge_lora",
                "training.sharding", "stylevar.evaluate.__main__", "benchmarks.cpu_pipeline", "benchmarks.device_run",
                "benchmarks.load_test", "benchmarks.memory_table", "benchmarks.overload", "benchmarks.real_pairs",
                "benchmarks.soak", "benchmarks.threads", "benchmarks.train_step", "benchmarks.versus_peer",
                "benchmarks.roofline", "benchmarks.bf16_tokenizer")
# a hang guard, not a speed target: --help stays quick by importing no torch (tests/cli/test_cli.py checks
# that structurally); a loaded 2-core CI machine may take a few seconds to start any interpreter
HELP_SECONDS = 30.0


def subcommands() -> list[str]:
    from stylevar.cli import commands

    return [cmd.name for cmd in commands()]


class Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def parser_of(module: str, monkeypatch, argv: tuple[str, ...] = ("--help",)) -> argparse.ArgumentParser:
    """The parser `module.main` builds, caught when it first parses (nothing else runs)."""
    def capture(self, *args, **kwargs):
        raise Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(Captured) as caught:
        importlib.import_module(module).main(list(argv))
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


@pytest.mark.parametrize("name", subcommands())
def test_every_option_of_each_stylevar_command_has_help_text(name, monkeypatch):
    missing = bare_options(parser_of("stylevar.cli", monkeypatch, (name, "--help")), f"stylevar {name}")
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_the_check_sees_a_bare_option():
    p = argparse.ArgumentParser()
    p.add_argument("--told", help="says what")
    p.add_argument("--bare")
    sub = p.add_subparsers().add_parser("run")
    sub.add_argument("--inner")
    assert bare_options(p, "x") == ["x: --bare", "x run: --inner"]


def test_every_module_with_a_command_is_an_entry_point():
    """A new `python -m` tool (a module with a main()) is listed here, so its --help is checked too."""
    found = set()
    for folder in ("training", "data_tools", "benchmarks"):
        for path in [*(REPO / folder).glob("*.py"), *(REPO / folder).glob("*/__main__.py")]:
            if re.search(r"^def main\(", path.read_text(encoding="utf-8"), re.M):
                found.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    assert found - {"data_tools.__main__"} <= set(ENTRY_POINTS), sorted(found - set(ENTRY_POINTS))


def help_commands() -> list[tuple[str, str, tuple[str, ...], list[str]]]:
    """Each --help checked: its name, the module whose main() builds the parser, the arguments that main() is
    given, and the command line that prints it."""
    python, stylevar = sys.executable, str(Path(sys.executable).with_name("stylevar"))
    out = [(module, module, ("--help",), [python, "-m", module.removesuffix(".__main__"), "--help"])
           for module in ENTRY_POINTS]
    return out + [(f"stylevar {name}", "stylevar.cli", (name, "--help"), [stylevar, name, "--help"])
                  for name in subcommands()]


def reached_parser(parser: argparse.ArgumentParser, argv: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser ``argv`` reaches: the sub-command's when ``argv`` names one, else ``parser`` itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv and argv[0] in action.choices:
            return reached_parser(action.choices[argv[0]], argv[1:])
    return parser


def required_helps(parser: argparse.ArgumentParser, argv: tuple[str, ...]) -> list[str]:
    """The help text, as --help prints it, of each required option of the parser ``argv`` reaches."""
    parser = reached_parser(parser, argv)
    formatter = parser._get_formatter()
    return [formatter._expand_help(a) for a in parser._actions if a.required and a.option_strings]


@pytest.mark.slow
@pytest.mark.parametrize("module, argv, command", [row[1:] for row in help_commands()],
                         ids=[row[0] for row in help_commands()])
def test_help_is_quick_and_shows_no_empty_default(module, argv, command, monkeypatch):
    required = required_helps(parser_of(module, monkeypatch, argv), argv)
    monkeypatch.undo()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=single_thread_env(), capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    assert seconds < HELP_SECONDS, f"{' '.join(command[1:])} took {seconds:.1f} s"
    assert "options:" in done.stdout
    assert "(default: None)" not in done.stdout
    printed = "".join(done.stdout.split())  # argparse wraps lines, also at hyphens
    for text in required:
        assert "(required)" in text and "".join(text.split()) in printed, f"not marked as required: {text!r}"


def test_the_formatter_shows_each_default_once_and_says_required():
    p = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter,
                                description="Train ``it``: see :class:`~training.parts.schedule.LoopConfig`.")
    p.add_argument("--steps", type=int, default=3, help="how many")
    p.add_argument("--size", type=int, default=None, help="side (default: the tokenizer's)")
    p.add_argument("--rate", type=float, default=0.5, help="0 or 1 switches it off; default: the model's")
    p.add_argument("--out", required=True, help="where")
    p.add_argument("--tag", default=None, help="a name")
    p.add_argument("--quiet", action="store_true", help="say less")
    p.add_argument("--crop", type=str, default=(0.4, 1.0), help="LO,HI")
    p.add_argument("--names", nargs="+", default=["a", "b"], help="some names")
    text = " ".join(p.format_help().split())
    assert "how many (default: 3)" in text
    assert "side (default: the tokenizer's) --rate" in text and "default: the model's --out" in text
    assert "where (required)" in text and "a name --quiet" in text and "say less --crop" in text
    assert "LO,HI (default: 0.4,1.0)" in text and "some names (default: a b)" in text
    assert "Train `it`: see `LoopConfig`." in text and "None" not in text and "``" not in text
    assert plain(":func:`training.parts.cli.loop_config`") == "`training.parts.cli.loop_config`"


def test_the_service_help_names_every_setting_and_where_each_is_described():
    from serve.__main__ import SETTINGS_DOC, build_parser, env_name
    from serve.settings import ServeSettings

    parser = build_parser()
    text = " ".join(parser.format_help().split())
    doc, anchor = SETTINGS_DOC.split("#")
    markdown = (REPO / doc).read_text(encoding="utf-8")
    heading = next(line for line in markdown.splitlines() if line.startswith("#") and
                   re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-") == anchor)
    section = markdown.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    assert SETTINGS_DOC in text
    for field in ServeSettings.model_fields:
        assert env_name(field) in text, field
        assert f"`{env_name(field)}`" in section, f"{env_name(field)} is not in {SETTINGS_DOC}"
    for action in parser._actions:
        if action.dest != "help":
            assert "STYLEVAR_" in action.help, action.option_strings


@pytest.mark.parametrize("module, argv, option", [
    ("stylevar.cli", ("stylize", "--help"), "--model"), ("serve.__main__", ("--help",), "--model"),
    ("training.sft.__main__", ("--help",), "--init"), ("training.grpo.__main__", ("--help",), "--init"),
    ("stylevar.cli", ("evaluate", "--help"), "--method")])
def test_each_option_taking_a_hub_id_writes_it_the_one_way(module, argv, option, monkeypatch):
    from stylevar.loaders.hub import ID_FORM

    parser = reached_parser(parser_of(module, monkeypatch, argv), argv)
    helps = [a.help for a in parser._actions if option in a.option_strings]
    assert len(helps) == 1 and ID_FORM in helps[0], helps


def test_the_bench_says_what_its_naive_run_costs_in_its_help_and_the_readme():
    """`stylevar bench --preset d16 --naive` peaked at 10.5 GB and took 16 minutes (issue 61): said before it runs."""
    from stylevar import cli
    from stylevar.cli.bench import NAIVE_COST

    text = plain(reached_parser(cli.build_parser(["bench"]), ("bench",)).format_help())
    assert "10.5 GB" in NAIVE_COST and "16 min" in NAIVE_COST and NAIVE_COST in " ".join(text.split())
    block = (REPO / "README.md").read_text().split("stylevar bench --preset d16 --naive", 1)[1][:400]
    assert "10.5 GB" in block and "16 min" in block
