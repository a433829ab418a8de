"""A misspelt option is named beside the nearest valid one on every surface that takes options by name: each
`stylevar` sub-command, `python -m serve`, and the Python call (a TypeError)."""
from __future__ import annotations

import pytest
from PIL import Image

from serve.__main__ import build_parser as serve_parser
from stylevar.cli import EXIT_USAGE, main
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.pipelines.request import StylizeRequest


@pytest.mark.parametrize("argv, said", [
    (["stylize", "--style-strenght", "0.9", "c.png", "s.png", "-o", "o.png"],
     "stylevar stylize: error: unknown option '--style-strenght'; did you mean '--style-strength'?"),
    (["stylize", "c.png", "s.png", "-o", "o.png", "--num-smaples=2"],
     "stylevar stylize: error: unknown option '--num-smaples'; did you mean '--num-samples'?"),
    (["evaluate", "--methd", "reinhard", "--zzzzzz"],
     "stylevar evaluate: error: unknown option '--methd'; did you mean '--method'?; unknown option '--zzzzzz'"),
    (["pull", "--revison", "main", "someone/model"],
     "stylevar pull: error: unknown option '--revison'; did you mean '--revision'?"),
    (["--verison"], "stylevar: error: unknown option '--verison'; did you mean '--version'?"),
    (["weights", "fetch", "clip", "--quiett"],  # a sub-command's sub-command: its own options are known too
     "stylevar weights fetch: error: unknown option '--quiett'; did you mean '--quiet'?"),
])
def test_an_unknown_option_is_named_with_the_nearest(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == EXIT_USAGE and capsys.readouterr().err.strip() == said


@pytest.mark.parametrize("argv, said", [
    (["styleize", "c.png"], "stylevar: error: argument COMMAND: invalid choice: 'styleize' (choose from "
     "'convert', 'stylize', 'pull', 'bench', 'weights', 'evaluate', 'merge-lora'); did you mean 'stylize'?"),
    (["weights", "fech", "clip"], "stylevar weights: error: argument ACTION: invalid choice: 'fech' "
     "(choose from 'status', 'path', 'fetch'); did you mean 'fetch'?"),
    (["stylize", "c.png", "s.png", "--resize", "zzz"], "stylevar stylize: error: argument --resize: invalid "
     "choice: 'zzz' (choose from 'crop', 'pad', 'stretch')"),  # nothing near: argparse's list alone
])
def test_a_wrong_choice_is_named_with_the_nearest(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == EXIT_USAGE and capsys.readouterr().err.strip() == said


@pytest.mark.parametrize("module", ["training.sft", "training.grpo", "training.vqvae", "training.demo",
                                    "training.merge_lora", "training.sharding", "data_tools.synth",
                                    "data_tools.teach", "data_tools.pictures", "data_tools.index", "data_tools.shards"])
def test_every_recipe_and_data_tool_names_the_nearest_option(module):
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-m", module, "--hepl"], capture_output=True, text=True, timeout=120)
    said = f"python -m {module}: error: unknown option '--hepl'; did you mean '--help'?"
    assert run.returncode == 2 and run.stderr.strip().startswith(said), run.stderr


def test_prefixes_and_what_follows_the_separator_stay_argparses(capsys):
    with pytest.raises(SystemExit):  # `--style-str` abbreviates --style-strength: argparse reads it, no hint
        main(["stylize", "c.png", "--style-str", "2", "-o", "o.png"])
    assert "unknown option" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["stylize", "c.png", "s.png", "-o", "o.png", "--", "--style-strenght"])
    assert "unknown option" not in capsys.readouterr().err


def test_python_m_serve_names_the_nearest_option(capsys):
    with pytest.raises(SystemExit) as stop:
        serve_parser().parse_args(["--modle", "models/demo"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == ("python -m serve: error: unknown option '--modle'; "
                                               "did you mean '--model'?")


def test_the_python_call_names_the_nearest_keyword():
    pipe = StylePipeline.random("tiny")
    image = Image.new("RGB", (32, 32))
    with pytest.raises(TypeError, match=r"unknown keyword argument 'style_strenght'; did you mean 'style_strength'\?"):
        pipe(image, image, style_strenght=0.9)
    with pytest.raises(TypeError, match=r"unknown stylize option 'seeed'; did you mean 'seed'\?"):
        StylizeRequest.of(seeed=1)

