"""The `stylevar` command.

Each sub-command's arguments live with the code it runs; the table below names where, and only the
chosen command's module is imported (so `stylevar --help` and `--version` never import torch). Every
argument and file check runs before a model loads, and every error a user can cause is one line on
stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

EXIT_USAGE = 2


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    # adds the command's arguments and `func` to its parser: a function, or "module:function" imported
    # only when this command runs
    arguments: Callable[[argparse.ArgumentParser], None] | str


class Parser(argparse.ArgumentParser):
    """argparse, with each usage error as one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# ------------------------------------------------------------------------------------------------ value types
def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def float_in(lo: float, hi: float, note: str = "") -> Callable[[str], float]:
    """An argparse type: a float in [lo, hi]."""

    def parse(text: str) -> float:
        value = float(_number(text, float))
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo:g}, {hi:g}]{note}, got {text}")
        return value

    return parse


def int_in(lo: int, hi: int | None = None, note: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= lo (and <= hi when given)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}{note}, got {text}")
        return value

    return parse


# ------------------------------------------------------------------------------------------------ convert
def convert_arguments(p: argparse.ArgumentParser) -> None:
    from stylevar.config import PRESETS

    p.add_argument("--vae", required=True, help="VQ-VAE checkpoint (vae_ch160v4096z32.pth layout)")
    p.add_argument("--model", required=True, help="StyleVAR checkpoint (any published layout)")
    p.add_argument("--preset", default="d20", choices=PRESETS, help="model shape (ignored with --config)")
    p.add_argument("--config", help="reference config.json (patch_nums, V, Cvae, ch, depth, ...) instead of a preset")
    p.add_argument("--lora-scaling", type=float, help="alpha/rank for LoRA-wrapped files without args")
    p.add_argument("--name", default=None, help="model name recorded in config.json")
    p.add_argument("--fp16", action="store_true", help="store weights in float16")
    p.add_argument("--out", required=True, help="output model directory")
    p.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from stylevar import preflight

    preflight.input_file(args.vae, "--vae checkpoint")
    preflight.input_file(args.model, "--model checkpoint")
    ref = None
    if args.config:
        try:
            ref = json.loads(preflight.input_file(args.config, "--config").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise preflight.InputError(f"--config {args.config} is not a JSON file ({e})") from None
    preflight.output_folder(args.out, "--out folder")

    import torch  # the checks are done: from here on the work

    from stylevar.checkpoints import load_stylevar, load_vqvae
    from stylevar.config import StyleVARConfig, VQVAEConfig, presets
    from stylevar.pipeline import StylePipeline

    if ref is not None:
        vq_cfg, tr_cfg = VQVAEConfig.from_reference(ref), StyleVARConfig.from_reference(ref)
    else:
        vq_cfg, tr_cfg = presets(args.preset)
    vq = load_vqvae(args.vae, vq_cfg)
    model = load_stylevar(args.model, tr_cfg, vq, lora_scaling=args.lora_scaling)
    pipe = StylePipeline.from_models(model, name=args.name or Path(args.model).stem)
    out = pipe.save_pretrained(args.out, dtype=torch.float16 if args.fp16 else None)
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------------------------ stylize
def stylize_arguments(p: argparse.ArgumentParser) -> None:
    from stylevar.generation import DEFAULT_GENERATION  # no torch
    from stylevar.images import RESIZE_MODES  # PIL, not torch
    from stylevar.postprocess import MAX_SEED, UPSAMPLE_MODES  # PIL, not torch

    p.add_argument("content",
                   help="content image (JPEG, PNG or WebP); or a folder, or a quoted glob such as 'photos/*.jpg', "
                        "of content images: each is stylized into the -o folder, unreadable files are skipped "
                        "and listed")
    p.add_argument("style", nargs="?", default=None,
                   help="style image (JPEG, PNG or WebP); more with --style (one of the two is needed)")
    p.add_argument("-o", "--output", required=True,
                   help="output image (.png, .jpg, .jpeg or .webp); a folder when CONTENT is a folder or a glob")
    p.add_argument("--style", dest="more_styles", action="append", default=[], metavar="IMAGE",
                   help="a style image to blend in; repeat it for several (up to 4 styles in all, with the "
                        "positional STYLE)")
    p.add_argument("--style-weights", type=weight_list, default=None, metavar="W,W,...",
                   help="one weight >= 0 per style, in order (not all 0; normalised to sum to 1), e.g. 0.7,0.3; "
                        "default: equal")
    p.add_argument("--mask", action="append", default=None, metavar="IMAGE",
                   help="grayscale mask of one style (white = the style applies, black = the content stays); "
                        "repeat it once per style, in order; any size (resized to each content's)")
    p.add_argument("--guidance", type=float_in(0.0, 10.0), default=DEFAULT_GENERATION.guidance,
                   help="push the result away from what the model draws without the style (the content as its own "
                        "style): 0 = off (default); larger = more style, less content")
    p.add_argument("--model", default=None,
                   help="model directory, or a hub id hf:OWNER/NAME[:grpo|sft] (pulled on first use; "
                        "default: the embedded demo model)")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                   help="random seed; sample i uses seed + i (default 0)")
    p.add_argument("--num-samples", type=int_in(1, 16), default=1, metavar="N",
                   help="samples per content image (default 1); with several, OUTPUT-seed-S.EXT per sample")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format: png, jpeg or webp (default: the output file's extension; png for a folder)")
    p.add_argument("--batch-size", type=int_in(1, 256), default=8, metavar="N",
                   help="model rows per call when stylizing several images (default 8)")
    p.add_argument("--style-strength", type=float_in(-1.0, 1.0), default=DEFAULT_GENERATION.style_strength,
                   help="-1 keeps more of the content .. 1 takes more of the style "
                        f"(default {DEFAULT_GENERATION.style_strength:g})")
    p.add_argument("--top-k", type=int_in(0, note=" (0 switches top-k off)"), default=None,
                   help="0 switches top-k off; default: the model's recommended value, else "
                        f"{DEFAULT_GENERATION.top_k}")
    p.add_argument("--top-p", type=float_in(0.0, 1.0, note=" (0 or 1 switches top-p off)"), default=None,
                   help="0 or 1 switches top-p off; default: the model's recommended value, else "
                        f"{DEFAULT_GENERATION.top_p}")
    p.add_argument("--resize", choices=RESIZE_MODES, default="stretch",
                   help="how the content is fitted into the model's square: stretch and pad keep its aspect "
                        "ratio, crop returns the centre square")
    p.add_argument("--max-size", type=int_in(1), default=None, metavar="PIXELS",
                   help="long side of the result, at most the content's (default: the content's size, as the "
                        "Python API and the service)")
    p.add_argument("--upsample", choices=UPSAMPLE_MODES, default=None,
                   help="how the model's drawing reaches the result's size: guided adds the content's fine detail "
                        "where the drawing follows the content, bicubic only resizes (default: the model's "
                        "setting, guided unless its config.json says otherwise)")
    p.add_argument("--preserve-color", action="store_true", help="keep the content's colours (as the service)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps ... (default: cuda if available)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="on the CPU, as the service's STYLEVAR_PRECISION: fp32 (the model's weights), bf16 (fastest "
                        "on CPUs with bf16 units), int8 (dynamic int8 linear layers, CPU only); bf16 and int8 "
                        "sample other tokens at some positions (benchmarks/README.md)")
    p.set_defaults(func=_stylize)


PRECISIONS = ("fp32", "bf16", "int8")  # stylevar.inference.PRECISIONS, without importing torch for --help


FORMATS = ("png", "jpeg", "webp")
FORMAT_EXTENSIONS = {"png": ".png", "jpeg": ".jpg", "webp": ".webp"}


def weight_list(text: str) -> tuple[float, ...]:
    """An argparse type: comma-separated weights (`stylevar.postprocess.check_style_weights`)."""
    from stylevar.postprocess import check_style_weights  # PIL and numpy, not torch

    values = tuple(float(_number(part.strip(), float)) for part in text.split(","))
    try:
        return check_style_weights(values)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}, got {text}") from None


@dataclass(frozen=True)
class StylizeJob:
    """What `stylevar stylize` was asked to do, checked before any model loads."""

    contents: list[Path]  # one file, or the files of a folder or glob
    many: bool  # CONTENT named a folder or a glob: OUTPUT is a folder
    output: Path  # the output image, or the output folder
    fmt: str  # png, jpeg or webp
    styles: list  # PIL images (with the weights and masks: a stylevar.pipeline.StyleMix once torch is in)
    weights: tuple[float, ...] | None
    masks: list | None
    seeds: list[int]
    first: object | None  # the content image (PIL), read during the checks when CONTENT is one file


def content_files(spec: str) -> tuple[list[Path], bool]:
    """CONTENT -> (files, many): an existing file, a folder's files (sorted, hidden ones left out) or a glob's."""
    import glob

    from stylevar import preflight

    p = Path(spec)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise preflight.InputError(f"content folder {p} holds no files")
        return files, True
    if not p.exists() and any(c in spec for c in "*?["):
        files = sorted(Path(f) for f in glob.glob(spec) if Path(f).is_file())
        if not files:
            raise preflight.InputError(f"content pattern {spec} matches no files")
        return files, True
    return [p], False


def check_stylize(args: argparse.Namespace) -> StylizeJob:
    """Every check of `stylevar stylize`'s arguments and files (InputError, one line), before any model loads."""
    from stylevar import preflight
    from stylevar.postprocess import MAX_SEED, MAX_STYLES

    contents, many = content_files(args.content)
    first = None if many else preflight.read_image(contents[0], "content")
    style_paths = ([args.style] if args.style else []) + list(args.more_styles)
    if not style_paths:
        raise preflight.InputError("give a style image (STYLE, or --style IMAGE)")
    if len(style_paths) > MAX_STYLES:
        raise preflight.InputError(f"at most {MAX_STYLES} styles, got {len(style_paths)}")
    if args.style_weights is not None and len(args.style_weights) != len(style_paths):
        raise preflight.InputError(f"--style-weights: {len(args.style_weights)} weights for {len(style_paths)} styles")
    if args.mask is not None and len(args.mask) != len(style_paths):
        raise preflight.InputError(f"--mask: {len(args.mask)} masks for {len(style_paths)} styles (one per style)")
    several = len(style_paths) > 1
    styles = [preflight.read_image(s, f"style {i + 1}" if several else "style") for i, s in enumerate(style_paths)]
    masks = None if args.mask is None else [
        preflight.read_image(m, f"mask {i + 1}" if several else "mask") for i, m in enumerate(args.mask)]
    if many:
        output = preflight.output_folder(args.output, "output folder")
        fmt = args.format or "png"
    else:
        output = preflight.output_image_path(args.output)
        fmt = preflight.OUTPUT_EXTENSIONS[output.suffix.lower()].lower()
        if args.format is not None and args.format != fmt:
            raise preflight.InputError(f"--format {args.format} but the output {output} is {output.suffix}")
    for img, role in ([(first, "content")] if first is not None else []) + [(img, "style") for img in styles]:
        warning = preflight.small_image_warning(img, role)
        if warning:
            print(warning, file=sys.stderr)
    seeds = list(range(args.seed, args.seed + args.num_samples))
    if seeds[-1] > MAX_SEED:
        raise preflight.InputError(f"--seed {args.seed} with --num-samples {args.num_samples} passes {MAX_SEED}")
    return StylizeJob(contents, many, output, fmt, styles, args.style_weights, masks, seeds, first)


def output_paths(job: StylizeJob, content: Path, taken: set[Path]) -> list[Path]:
    """Where one content's samples go: OUTPUT itself (one file, one sample), else names with the seed."""
    ext = FORMAT_EXTENSIONS[job.fmt]
    if not job.many:
        base, ext = job.output.with_suffix(""), job.output.suffix
    else:
        base = job.output / content.stem
        if any(p.with_suffix("") == base for p in taken):  # a.png and a.jpg: keep both
            base = job.output / f"{content.stem}_{content.suffix.lstrip('.')}"
    if len(job.seeds) == 1:
        paths = [job.output] if not job.many else [base.with_name(base.name + ext)]
    else:
        paths = [base.with_name(f"{base.name}-seed-{s}{ext}") for s in job.seeds]
    taken.update(paths)
    return paths


def _stylize(args: argparse.Namespace) -> int:
    from stylevar import preflight
    from stylevar.devices import check_device

    job = check_stylize(args)
    check_device(args.device)
    if args.precision == "int8":
        from stylevar.devices import resolve_device

        if resolve_device(args.device).type != "cpu":
            raise preflight.InputError("--precision int8 runs on the CPU only (add --device cpu)")

    from stylevar.hub import resolve_model

    model_dir = resolve_model(args.model)  # a hub id: pulled on first use; offline and not cached: one error here

    from PIL import Image
    from tqdm import tqdm

    from stylevar.inference import InferenceConfig, prepare
    from stylevar.pipeline import StyleMix, StylePipeline  # the checks are done: from here on the work
    from stylevar.postprocess import OutputOptions, finish

    pipe = StylePipeline.from_pretrained(model_dir, device=args.device)
    if pipe.config.demo:
        print(f"using the {pipe.config.label}", file=sys.stderr)
    print(f"loaded {pipe.summary()}")  # before packing: packed linears hold their weights as buffers
    if pipe.device.type == "cpu":  # as the service runs it: CPU layouts, packed linears, the precision
        prepare(pipe.model, InferenceConfig(precision=args.precision))
    max_side = args.max_size  # None: the content's size, as the Python API and the service
    options = OutputOptions(max_side=max_side, preserve_color=args.preserve_color)
    mix = StyleMix(tuple(job.styles), job.weights, None if job.masks is None else tuple(job.masks))
    gen = {"style_strength": args.style_strength, "top_k": args.top_k, "top_p": args.top_p,
           "guidance": args.guidance}
    per_call = max(1, args.batch_size // len(job.seeds))  # contents per model call
    skipped: list[str] = []
    written: list[Path] = []
    taken: set[Path] = set()
    bar = tqdm(total=len(job.contents), unit="image", disable=not job.many, file=sys.stderr)
    for start in range(0, len(job.contents), per_call):
        batch: list[tuple[Path, object]] = []
        for path in job.contents[start:start + per_call]:
            if job.first is not None:
                batch.append((path, job.first))
                continue
            try:
                batch.append((path, preflight.read_image(path, "content")))
            except preflight.InputError as e:
                skipped.append(str(e))
                bar.update(1)
        if not batch:
            continue
        images = pipe.stylize_batch([img for _, img in batch for _ in job.seeds], [mix] * len(batch) * len(job.seeds),
                                    seeds=job.seeds * len(batch), resize=args.resize, max_side=options.max_side,
                                    upsample=args.upsample, **gen)
        for i, (path, img) in enumerate(batch):
            outs = finish(images[i * len(job.seeds):(i + 1) * len(job.seeds)], img, options)
            for out, target in zip(outs, output_paths(job, path, taken)):
                try:
                    save_image(out, target, job.fmt)
                except OSError as e:
                    report_skipped(skipped)
                    raise preflight.InputError(f"cannot write {target}: {e} ({len(written)} image(s) written "
                                               "before it are complete; nothing partial is left)") from e
                written.append(target)
            bar.update(1)
    bar.close()
    if written:
        with Image.open(written[0]) as first_out:
            note = upscale_note(first_out.size, pipe.image_size, pipe.upsampling(args.upsample).mode)
        if note:
            print(note, file=sys.stderr)
    report_skipped(skipped)
    if not written:
        raise preflight.InputError("no content image could be read; nothing was written")
    if job.many:
        print(f"wrote {len(written)} image(s) to {job.output}")
    else:
        for target in written:
            with Image.open(target) as im:
                print(f"wrote {target} ({im.size[0]}x{im.size[1]})")
    return EXIT_PARTIAL if skipped else 0


EXIT_PARTIAL = 1  # some inputs were skipped (listed on stderr); the others were written


def report_skipped(skipped: list[str]) -> None:
    if skipped:
        print(f"skipped {len(skipped)} unreadable file(s):", file=sys.stderr)
        for line in skipped:
            print(f"  {line}", file=sys.stderr)


def save_image(img, target: Path, fmt: str) -> None:
    """Write `img` to `target` whole or not at all: into a temporary file beside it, then renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.partial")
    try:
        img.save(tmp, format=fmt.upper())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def upscale_note(result_size: tuple[int, int], model_side: int, upsample: str = "bicubic") -> str | None:
    """A line saying that the result is larger than what the model drew (None when it is not)."""
    from stylevar.postprocess import upscale_factor

    factor = upscale_factor(result_size, model_side)
    if factor <= 1.0:
        return None
    w, h = result_size
    return (f"note: the model draws {model_side}x{model_side} pixels; the result is upscaled {factor:.1f}x to "
            f"{w}x{h} ({upsample} upsampling). --max-size {model_side} keeps the model's resolution.")


# ------------------------------------------------------------------------------------------------ the table
COMMANDS: tuple[Command, ...] = (
    Command("convert", "convert published .pth checkpoints into a model directory", convert_arguments),
    Command("stylize", "re-draw a content image in the style of another", stylize_arguments),
    Command("pull", "download a published model from the Hugging Face Hub into a model directory",
            "stylevar.hub:add_arguments"),
    Command("bench", "speed of generation and teacher forcing (random weights)", "stylevar.bench:add_arguments"),
    Command("merge-lora", "bake the LoRA adapters of a GRPO checkpoint into a plain model directory",
            "training.merge_lora:add_arguments"),  # a training file: the command lives in training/
    Command("weights", "list and fetch external weights (VGG, LPIPS, DreamSim, CLIP, ...)",
            "stylevar.weights:add_arguments"),
    Command("evaluate", "compare methods on benchmark triplets (the paper's Table 1 metrics)",
            "stylevar.evaluate:add_arguments"),
)


def _chosen(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (the first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command is listed, and the chosen one has its full arguments
    (``argv`` None: all of them, which imports every command's module)."""
    from stylevar import __version__

    chosen = _chosen(argv) if argv is not None else None
    parser = Parser(prog="stylevar", description="StyleVAR: reference-based image style transfer. "
                                                 "`stylevar COMMAND --help` describes a command.")
    parser.add_argument("--version", action="version", version=f"stylevar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if argv is None or cmd.name == chosen:
            _arguments(cmd)(p)
    return parser


def _arguments(cmd: Command) -> Callable[[argparse.ArgumentParser], None]:
    if callable(cmd.arguments):
        return cmd.arguments
    module, _, name = cmd.arguments.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as e:  # ImageError, CheckpointError, InputError, DeviceError ...
        print(f"stylevar {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
