"""The `stylevar` command line: instant --help/--version, and every error a user can cause is one line on
stderr and a non-zero exit, found before any model loads (torch is never imported for them)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from stylevar import cli
from stylevar.utils import devices
from stylevar.processing import images
from stylevar.processing import postprocess
from stylevar.loaders import preflight
from stylevar.cli import stylize as stylize_cli

REPO = Path(__file__).resolve().parents[2]
# runs `stylevar ARGS` in a fresh interpreter and reports whether torch was imported on the way
PROBE = """
import sys
from stylevar.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
print("\\ntorch imported:", "torch" in sys.modules)
sys.exit(rc)
"""
# a hang guard, not a speed target: an early error or --help is quick because it imports no torch (asserted
# beside each bound); a loaded 2-core CI machine may take seconds to start any interpreter
BOUND_S = 30.0


def _probe(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float, bool]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    elapsed = time.perf_counter() - t0
    torch_imported = proc.stdout.rstrip().endswith("torch imported: True")
    return proc, elapsed, torch_imported


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    Image.new("RGB", (40, 30), (200, 30, 30)).save(d / "c.png")
    Image.new("RGB", (32, 32), (20, 30, 200)).save(d / "s.png")
    Image.new("RGB", (40, 30)).save(d / "c.gif")
    Image.new("RGB", (40, 30)).save(d / "c.tif")
    Image.new("RGB", (40, 30)).save(d / "c.bmp")
    (d / "garbage.png").write_bytes(b"this is no image")
    png = (d / "c.png").read_bytes()
    (d / "torn.png").write_bytes(png[: len(png) // 2])
    (d / "folder").mkdir()
    return d


@pytest.mark.slow
def test_help_and_version_are_instant_and_import_no_torch(files):
    for args in (["--help"], ["--version"], ["stylize", "--help"], ["convert", "--help"], []):
        proc, elapsed, torch_imported = _probe(args, files)
        assert not torch_imported, args
        assert elapsed < BOUND_S, (args, elapsed)
        assert proc.returncode == (2 if not args else 0), (args, proc.stderr)
    proc, _, _ = _probe(["--version"], files)
    assert proc.stdout.startswith("stylevar ")
    proc, _, _ = _probe(["--help"], files)
    for cmd in cli.commands():
        assert cmd.name in proc.stdout


S = ["stylize", "c.png", "s.png"]
EARLY_ERRORS = {
    "missing content": (["stylize", "nope.png", "s.png", "-o", "o.png"], "content image not found: nope.png"),
    "missing style": (["stylize", "c.png", "nope.png", "-o", "o.png"], "style image not found: nope.png"),
    "style is a folder": (["stylize", "c.png", "folder", "-o", "o.png"], "style image folder is a folder"),
    "checkpoint is a web address": (["convert", "--vae", "https://example.com/vae.pth", "--model", "m.pth", "--out",
                                     "o"], "--vae checkpoint https://example.com/vae.pth is a web address"),
    "content is a web address": (["stylize", "https://example.com/cat.jpg", "s.png", "-o", "o.png"],
                                 "content image https://example.com/cat.jpg is a web address: StyleVAR reads "
                                 "files only; download it first"),
    # the exact words are the service's (see test_the_command_line_and_the_service_refuse_...)
    "GIF": (["stylize", "c.gif", "s.png", "-o", "o.png"], "content image c.gif: GIF"),
    "TIFF": (["stylize", "c.png", "c.tif", "-o", "o.png"], "style image c.tif: TIFF"),
    "BMP": (["stylize", "c.bmp", "s.png", "-o", "o.png"], "content image c.bmp: BMP"),
    "not an image": (["stylize", "garbage.png", "s.png", "-o", "o.png"], "content image garbage.png: not a recognised"),
    "torn image": (["stylize", "torn.png", "s.png", "-o", "o.png"], "content image torn.png: "),
    "output folder a file": ([*S, "-o", "c.png/o.png"], "output folder c.png exists and is not a folder"),
    "output is a folder": ([*S, "-o", "folder"], "output folder is a folder; give a file name"),
    "folder into an image's name": (["stylize", "c*.png", "s.png", "-o", "o.png"],
                                    "output folder o.png is named like an image: content c*.png is 1 file(s)"),
    "output extension": ([*S, "-o", "o.gif"], "output o.gif: .gif is not an output image format"),
    "output without extension": ([*S, "-o", "o"], "output o has no extension"),
    "no output": (S, "the following arguments are required: -o/--output"),
    # a wrong local --model: said before torch is imported, without the Hub hint (stylevar.loaders.model_dir)
    "model folder missing": ([*S, "-o", "o.png", "--model", "models/nope"],
                             "no usable model at models/nope: no such folder. A model directory comes from"),
    "model folder incomplete": ([*S, "-o", "o.png", "--model", "folder"],
                                "no usable model at folder: missing config.json, tokenizer.safetensors"),
    "strength above 1": ([*S, "-o", "o.png", "--style-strength", "1.5"],
                         "argument --style-strength: must be in [-1, 1], got 1.5"),
    "strength below -1": ([*S, "-o", "o.png", "--style-strength", "-1.01"], "must be in [-1, 1], got -1.01"),
    "strength nan": ([*S, "-o", "o.png", "--style-strength", "nan"], "expected a finite number"),
    "negative top-k": ([*S, "-o", "o.png", "--top-k", "-3"], "argument --top-k: must be an integer >= 0"),
    "fractional top-k": ([*S, "-o", "o.png", "--top-k", "2.5"], "argument --top-k: expected an integer"),
    "top-p above 1": ([*S, "-o", "o.png", "--top-p", "1.5"], "argument --top-p: must be in [0, 1]"),
    "negative top-p": ([*S, "-o", "o.png", "--top-p", "-0.1"], "argument --top-p: must be in [0, 1]"),
    "negative seed": ([*S, "-o", "o.png", "--seed", "-1"], "argument --seed: must be an integer in [0, 4294967295]"),
    "resize mode": ([*S, "-o", "o.png", "--resize", "squash"], "argument --resize: invalid choice: 'squash'"),
    "convert: missing --vae": (["convert", "--vae", "nope.pth", "--model", "c.png", "--out", "m"],
                               "--vae checkpoint not found: nope.pth"),
    "convert: --out is a file": (["convert", "--vae", "c.png", "--model", "c.png", "--out", "c.png"],
                                 "--out folder c.png exists and is not a folder"),
    "convert: --config not JSON": (["convert", "--vae", "c.png", "--model", "c.png", "--config", "c.png", "--out", "m"],
                                   "--config c.png is not a JSON file"),
    "unknown command": (["stylise"], "invalid choice: 'stylise'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EARLY_ERRORS))
def test_each_bad_argument_is_one_line_before_any_model_loads(files, case):
    args, message = EARLY_ERRORS[case]
    proc, elapsed, torch_imported = _probe(args, files)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("stylevar") and ": error: " in lines[0] and message in lines[0], lines[0]
    assert not torch_imported, "the check ran after the model code was imported"
    assert elapsed < BOUND_S, elapsed
    assert not list(files.glob("o*")), "nothing is written"


@pytest.mark.slow
def test_a_missing_gpu_is_one_line(files):
    if devices._no_gpu_driver():  # the usual CI machine: refused from the device nodes alone
        proc, elapsed, torch_imported = _probe([*S, "-o", "o.png", "--device", "cuda"], files)
        assert not torch_imported and elapsed < BOUND_S
        assert proc.stderr.strip() == ("stylevar stylize: error: device 'cuda' is not available: this machine has "
                                       "no GPU driver (use --device cpu)")
    else:  # a GPU machine: ask for one it does not have
        proc, _, _ = _probe([*S, "-o", "o.png", "--device", "cuda:99"], files)
        assert proc.stderr.strip().startswith("stylevar stylize: error: device 'cuda:99' is not available")
    assert proc.returncode == 2


def test_device_names_are_checked():
    assert devices.check_device(None) is None and devices.check_device("cpu") == "cpu"
    with pytest.raises(devices.DeviceError, match="'gpu' is not a device name"):
        devices.check_device("gpu")
    with pytest.raises(devices.DeviceError, match="'cuda:99' is not available"):
        devices.resolve_device("cuda:99")
    assert devices.resolve_device("cpu").type == "cpu"
    import torch

    assert devices.resolve_devices(["cpu", "cpu"]) == [torch.device("cpu")] * 2  # the service's workers
    expected = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
    assert devices.resolve_devices(["auto"]) == expected
    with pytest.raises(devices.DeviceError, match="'cuda:99' is not available"):
        devices.resolve_devices(["cpu", "cuda:99"])


def test_the_python_api_refuses_a_missing_device_in_the_same_words():
    from stylevar import StylePipeline
    with pytest.raises(devices.DeviceError, match="^device 'cuda:99' is not available"):
        StylePipeline.from_pretrained(device="cuda:99")
    pipe = StylePipeline.from_pretrained(device="cpu")
    with pytest.raises(devices.DeviceError, match="^'gpu' is not a device name"):
        pipe.to("gpu")
    assert pipe.to("cpu").device.type == "cpu"


@pytest.mark.parametrize("name", ["c.gif", "c.tif", "c.bmp", "garbage.png"])
def test_the_command_line_and_the_service_refuse_the_same_files_with_the_same_words(files, name, capsys):
    from serve.http.imaging import decode_upload

    # the command line's message is the service's message for the same bytes, naming the file
    with pytest.raises(images.ImageError) as service:
        decode_upload((files / name).read_bytes(), max_pixels=images.DEFAULT_MAX_PIXELS)
    assert cli.main(["stylize", str(files / name), str(files / "s.png"), "-o", str(files / "x.png")]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"stylevar stylize: error: content image {files / name}: {service.value}"


def test_boundary_values_are_accepted():
    args = cli.build_parser(["stylize"]).parse_args(
        ["stylize", "c.png", "s.png", "-o", "o.png", "--top-k", "0", "--top-p", "1", "--style-strength", "-1",
         "--seed", str(postprocess.MAX_SEED)])
    assert (args.top_k, args.top_p, args.style_strength, args.seed) == (0, 1.0, -1.0, postprocess.MAX_SEED)
    assert cli.build_parser(["stylize"]).parse_args(["stylize", "c", "s", "-o", "o.png"]).top_k is None


@pytest.mark.slow
def test_a_tiny_input_is_stylized_with_a_warning(micro_model_dir, files, tmp_path, capsys):
    Image.new("RGB", (1, 1), (10, 200, 10)).save(tmp_path / "dot.png")
    rc = cli.main(["stylize", str(tmp_path / "dot.png"), str(files / "s.png"), "-o", str(tmp_path / "o.jpg"),
                   "--model", str(micro_model_dir), "--device", "cpu"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "warning: the content image is only 1x1 pixels" in err and "style image" not in err
    with Image.open(tmp_path / "o.jpg") as out:
        assert out.format == "JPEG" and out.size == (1, 1)


@pytest.mark.slow
def test_the_output_folders_are_made(micro_model_dir, files, tmp_path, capsys):
    out = tmp_path / "outputs" / "deeper" / "x.png"  # a newcomer's `-o outputs/x.png` on a fresh clone
    rc = cli.main(["stylize", str(files / "c.png"), str(files / "s.png"), "-o", str(out), "--model",
                   str(micro_model_dir), "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    assert f"wrote {out} (40x30)" in capsys.readouterr().out and out.is_file()


@pytest.mark.slow
def test_max_size_says_what_it_capped_as_the_service_does(micro_model_dir, files, tmp_path, capsys):
    rc = cli.main(["stylize", str(files / "c.png"), str(files / "s.png"), "-o", str(tmp_path / "o.png"), "--model",
                   str(micro_model_dir), "--device", "cpu", "--max-size", "20"])
    assert rc == 0
    # the service's X-Size-Capped carries the same 40x30->20x15 (tests/serve/test_uploads.py)
    assert "note: the result's long side is capped at 20 pixels (--max-size): 40x30->20x15" in capsys.readouterr().err


def test_every_command_has_help_and_other_commands_report_early(files, tmp_path, capsys):
    for cmd in cli.commands():
        with pytest.raises(SystemExit) as done:
            cli.main([cmd.name, "--help"])
        assert done.value.code == 0, cmd.name
    capsys.readouterr()
    assert cli.main(["bench", "--device", "cuda:99"]) == 2
    assert capsys.readouterr().err.startswith("stylevar bench: error: device 'cuda:99' is not available")
    assert cli.main(["evaluate", "--method", "reinhard", "--benchmark", f"p={tmp_path}",
                     "--out", str(files / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"stylevar evaluate: error: --out folder {files / 'c.png'} exists and is not a folder"


def test_output_checks(tmp_path):
    assert preflight.output_image_path(tmp_path / "a.JPEG") == tmp_path / "a.JPEG"
    assert preflight.output_image_path(tmp_path / "missing" / "a.png") == tmp_path / "missing" / "a.png"  # made
    (tmp_path / "a.JPEG").write_text("x")
    with pytest.raises(preflight.InputError, match="deeper cannot be made: .*a.JPEG is not a folder"):
        preflight.output_image_path(tmp_path / "a.JPEG" / "deeper" / "a.png")
    assert preflight.output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    (tmp_path / "file").write_text("x")
    with pytest.raises(preflight.InputError, match="cannot be made"):
        preflight.output_folder(tmp_path / "file" / "sub")


@pytest.mark.slow
def test_precision_is_the_service_setting_and_each_one_runs(micro_model_dir, files, tmp_path, capsys):
    import typing

    from serve.settings import ServeSettings
    from stylevar.runtime.inference import PRECISIONS

    assert stylize_cli.PRECISIONS == PRECISIONS == typing.get_args(ServeSettings.model_fields["precision"].annotation)
    for precision in PRECISIONS:
        out = tmp_path / f"{precision}.png"
        assert cli.main(["stylize", str(files / "c.png"), str(files / "s.png"), "-o", str(out), "--model",
                         str(micro_model_dir), "--device", "cpu", "--precision", precision]) == 0
        with Image.open(out) as im:
            assert im.size == Image.open(files / "c.png").size
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("precision: ")]
        if precision == "auto":  # what auto settled on, and why, in one line
            assert len(said) == 1 and said[0].split(" (")[0] in ("precision: fp32", "precision: bf16"), said
        else:
            assert said == []
    with pytest.raises(SystemExit) as bad:
        cli.build_parser(["stylize"]).parse_args(["stylize", "c", "s", "-o", "o.png", "--precision", "int4"])
    assert bad.value.code == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:  # removed: refused saying why, before any work
        cli.build_parser(["stylize"]).parse_args(["stylize", "c", "s", "-o", "o.png", "--precision", "int8"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert "int8 was removed" in err and "slower than fp32" in err and "fp32, bf16" in err


def test_precision_is_auto_unless_the_flag_or_the_service_setting_says_otherwise(files, tmp_path, monkeypatch,
                                                                                 capsys):
    from stylevar.utils.precision import precision_setting

    args = ["stylize", str(files / "c.png"), str(files / "s.png"), "-o", str(tmp_path / "o.png"), "--device", "cpu"]
    assert cli.build_parser(["stylize"]).parse_args(args).precision is None
    assert cli.build_parser(["stylize"]).parse_args([*args, "--precision", "auto"]).precision == "auto"
    monkeypatch.delenv("STYLEVAR_PRECISION", raising=False)
    assert precision_setting(None) == "auto" and precision_setting("fp32") == "fp32"
    monkeypatch.setenv("STYLEVAR_PRECISION", "bf16")
    assert precision_setting(None) == "bf16" and precision_setting("fp32") == "fp32"
    monkeypatch.setenv("STYLEVAR_PRECISION", "int8")  # refused as the flag is, before any model loads
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "STYLEVAR_PRECISION: precision 'int8': int8 was removed" in err, err
    assert not (tmp_path / "o.png").exists()
    assert cli.main([*args, "--precision", "fp32", "--model", str(tmp_path / "none")]) == 2  # the flag wins
    assert "STYLEVAR_PRECISION" not in capsys.readouterr().err


def test_a_folder_with_one_style_encodes_the_style_once_and_writes_what_no_cache_writes(micro_model_dir, files,
                                                                                         tmp_path, monkeypatch):
    from stylevar.models.tokenizer import MultiScaleVQVAE
    from stylevar.pipelines.pipeline import StylePipeline

    encoded: list[int] = []
    encode = MultiScaleVQVAE.encode
    monkeypatch.setattr(MultiScaleVQVAE, "encode", lambda self, x, *a, **k: encoded.append(len(x)) or encode(self, x))
    folder = tmp_path / "contents"
    folder.mkdir()
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (90, 90, 220)]):
        Image.new("RGB", (40, 30), colour).save(folder / f"{i}.png")

    def run(out: Path) -> list[bytes]:
        rc = cli.main(["stylize", str(folder), str(files / "s.png"), "-o", str(out), "--batch-size", "2",
                       "--seed", "3", "--model", str(micro_model_dir), "--device", "cpu"])
        assert rc == 0
        return [(out / f"{i}.png").read_bytes() for i in range(3)]

    cached = run(tmp_path / "cached")
    assert encoded == [1, 2, 1], "the style once, then the contents: two, then one (the style from the cache)"
    monkeypatch.setattr(StylePipeline, "condition",
                        lambda self, c, s, unstyled=False, scopes=None: self.model.condition(c, s, unstyled=unstyled))
    encoded.clear()
    assert run(tmp_path / "uncached") == cached
    assert encoded == [2, 2, 1, 1], "without the cache each call encodes its every row"
