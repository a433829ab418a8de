"""`stylevar stylize`: re-draw content images in the style of others (one file, a folder or a glob), or a video
(`StylePipeline.stylize_video`: frames streamed, H.264 mp4 out with the frame rate and the audio kept)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stylevar.cli.command import EXIT_PARTIAL, Command
from stylevar.cli.values import float_in, int_in, number, threads_argument
from stylevar.loaders import hub  # no torch
from stylevar.utils.helptext import DEVICE_AUTO
from stylevar.pipelines.options import CLI, IMAGE_ONLY, Option, offered  # no torch
from stylevar.pipelines.request import RequestError, StylizeRequest  # no torch either
from stylevar.utils.precision import PRECISIONS, REMOVED_PRECISIONS, precision_error, precision_setting  # no torch
from stylevar.utils.threads import THREADS_HELP  # no torch
from stylevar.processing.video import DEFAULT_TEMPORAL, TEMPORAL_HELP, TEMPORAL_MODES  # no torch either


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("content",
                   help="content image (JPEG, PNG or WebP); or a folder, or a quoted glob such as 'photos/*.jpg', "
                        "of content images: each is stylized into the -o folder, unreadable files are skipped "
                        f"and listed; or a video ({', '.join(VIDEO_EXTENSIONS)}), stylized into an -o .mp4")
    p.add_argument("style", nargs="?", default=None,
                   help="style image (JPEG, PNG or WebP); more with --style (one of the two is needed)")
    p.add_argument("-o", "--output", required=True,
                   help="output image (.png, .jpg, .jpeg or .webp); a folder when CONTENT is a folder or a glob; "
                        "an .mp4 when CONTENT is a video")
    p.add_argument("--style", dest="more_styles", action="append", default=[], metavar="IMAGE",
                   help="a style image to blend in; repeat it for several (up to 4 styles in all, with the "
                        "positional STYLE)")
    p.add_argument("--mask", action="append", default=None, metavar="IMAGE",
                   help="grayscale mask of one style (white = the style applies, black = the content stays); "
                        "repeat it once per style, in order; any size (resized to each content's)")
    p.add_argument("--model", default=None,
                   help=f"model directory, or a hub id {hub.ID_FORM} (pulled on first use; "
                        "default: the embedded demo model)")
    p.add_argument("--batch-size", type=int_in(1, 256), default=8, metavar="N",
                   help="model rows per call when stylizing several images")
    p.add_argument("--max-size", type=int_in(1), default=None, metavar="PIXELS",
                   help="long side of the result, at most the content's (default: the content's size, as the "
                        "Python API and the service)")
    for opt in offered(CLI):
        add_option(p, opt, **CLI_SPECIFIC.get(opt.name, {}))
    p.add_argument("--temporal", choices=TEMPORAL_MODES, default=DEFAULT_TEMPORAL,
                   help=f"a video: {TEMPORAL_HELP}; docs/video.md")
    p.add_argument("--device", default=None, help=f"cpu, cuda, cuda:1, mps ... (default: {DEVICE_AUTO})")
    p.add_argument("--precision", type=precision_argument, choices=PRECISIONS, default=None,
                   help="as the service's STYLEVAR_PRECISION: auto (bf16 where this CPU's bf16 products measure "
                        "faster when the model loads, else fp32; the choice and why on stderr), fp32 (the model's "
                        "weights; a seed gives the same image only at the same precision: fp32 for images that must "
                        "match on other machines), bf16 (samples other tokens at some positions, docs/cpu.md); "
                        "default: auto, or STYLEVAR_PRECISION")
    p.add_argument("--threads", type=threads_argument, default=None, metavar="N|auto|torch",
                   help=f"{THREADS_HELP}; default: auto, or STYLEVAR_THREADS")
    p.set_defaults(func=_stylize)


# where the command line differs from the declaration (stylevar.pipelines.request): the seed starts at the option's `start`
CLI_SPECIFIC: dict[str, dict[str, Any]] = {
    "num_samples": {"le": 16, "metavar": "N", "more": "; with several, OUTPUT-seed-S.EXT per sample"},  # local work
    "top_k": {"le": None, "explain": True},  # a range error repeats the help
    "top_p": {"explain": True},
    "format": {"default": None, "unset": "the output file's extension; png for a folder"},
    "style_weights": {"metavar": "W,W,..."},
}


def add_option(p: argparse.ArgumentParser, opt: Option, *, default: Any = ..., unset: str | None = None,
               le: float | None = ..., metavar: str | None = None, more: str = "", explain: bool = False) -> None:
    """The flag of a declared option: --NAME, its default (the option's `start`, else its default), its help, and a
    type that refuses what the option's range, choices and rule refuse (one line, exit 2)."""
    default = (opt.default if opt.start is None else opt.start) if default is ... else default
    le = opt.le if le is ... else le
    unset = opt.unset if unset is None else unset
    help_text = opt.help + (f", e.g. {opt.example}" if opt.example else "")
    if default is None and unset:
        help_text += f"; default: {unset}"
    elif opt.type is not bool:
        help_text += f" (default: {default:g})" if isinstance(default, float) else f" (default: {default})"
    flag = dict(dest=opt.name, default=default, help=help_text + more, metavar=metavar)
    note = f" ({opt.help})" if explain else ""
    if opt.type is bool:
        flag.pop("metavar")
        p.add_argument(f"--{opt.name.replace('_', '-')}", action="store_true", **flag)
        return
    if opt.choices:
        flag["choices"] = opt.choices
    elif opt.is_list:
        flag["type"] = number_list(opt)
    elif opt.number is int:
        flag["type"] = int_in(int(opt.ge), None if le is None else int(le), note=note)
    else:
        flag["type"] = float_in(opt.ge, le, note=note)
    p.add_argument(f"--{opt.name.replace('_', '-')}", **flag)


def precision_argument(value: str) -> str:
    """--precision's type: a removed precision (int8) is refused saying why; the rest is left to its choices."""
    if value in REMOVED_PRECISIONS:
        raise argparse.ArgumentTypeError(precision_error(value))
    return value


# a CONTENT (or an -o) with one of these is a video; the output is always an H.264 mp4
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".ogv", ".3gp")


FORMAT_EXTENSIONS = {"png": ".png", "jpeg": ".jpg", "webp": ".webp"}


def number_list(opt: Option) -> Callable[[str], tuple[float, ...]]:
    """An argparse type: comma-separated numbers that the declaration takes (`StylizeRequest`)."""

    def parse(text: str) -> tuple[float, ...]:
        values = tuple(float(number(part.strip(), float)) for part in text.split(","))
        try:
            return getattr(StylizeRequest.of(**{opt.name: values}), opt.name)
        except RequestError as e:
            raise argparse.ArgumentTypeError(f"{e}, got {text}") from None

    return parse


@dataclass(frozen=True)
class StylizeJob:
    """What `stylevar stylize` was asked to do, checked before any model loads."""

    contents: list[Path]  # one file, or the files of a folder or glob
    many: bool  # CONTENT named a folder or a glob: OUTPUT is a folder
    output: Path  # the output image, or the output folder
    fmt: str  # png, jpeg or webp
    styles: list  # PIL images (with the weights and masks: a stylevar.pipelines.request.StyleMix once torch is in)
    masks: list | None
    request: StylizeRequest  # the flags, validated by the declaration
    seeds: list[int]
    first: object | None  # the content image (PIL), read during the checks when CONTENT is one file


def content_files(spec: str) -> tuple[list[Path], bool]:
    """CONTENT -> (files, many): an existing file, a folder's files (sorted, hidden ones left out) or a glob's."""
    import glob
    from stylevar.loaders import preflight
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
    from stylevar.loaders import preflight
    from stylevar.processing.postprocess import MAX_SEED
    contents, many = content_files(args.content)
    first = None if many else read_image(contents[0], "content")
    styles, masks = check_styles(args)
    if many:
        output = preflight.output_folder(args.output, "output folder")
        if not output.exists() and output.suffix.lower() in preflight.OUTPUT_EXTENSIONS:  # `-o out.png` for a folder
            raise preflight.InputError(
                f"output folder {output} is named like an image: content {args.content} is {len(contents)} file(s), "
                f"each written into the -o folder; give a folder, e.g. -o {output.with_suffix('')}")
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
    return StylizeJob(contents, many, output, fmt, styles, masks, stylize_request(args, format=fmt), seeds, first)


def stylize_request(args: argparse.Namespace, **values: Any) -> StylizeRequest:
    """The flags as one `StylizeRequest` (``values`` over them); what the declaration refuses is one line."""
    from stylevar.loaders import preflight
    flags = {opt.name: getattr(args, opt.name) for opt in offered(CLI) if opt.name != "format"}
    try:
        return StylizeRequest.of(**{**flags, **values})
    except RequestError as e:
        raise preflight.InputError(str(e)) from None


def check_styles(args: argparse.Namespace) -> tuple[list, list | None]:
    """The style images and masks (PIL), their counts agreeing with each other and with --style-weights."""
    from stylevar.loaders import preflight
    from stylevar.pipelines.request import check_mix_counts
    style_paths = ([args.style] if args.style else []) + list(args.more_styles)
    if not style_paths:
        raise preflight.InputError("give a style image (STYLE, or --style IMAGE)")
    try:
        check_mix_counts(len(style_paths), None if args.style_weights is None else len(args.style_weights),
                         None if args.mask is None else len(args.mask))
    except ValueError as e:
        raise preflight.InputError(f"{e} (--style, --style-weights, --mask)") from None
    several = len(style_paths) > 1
    styles = [read_image(s, f"style {i + 1}" if several else "style") for i, s in enumerate(style_paths)]
    masks = None if args.mask is None else [
        read_image(m, f"mask {i + 1}" if several else "mask") for i, m in enumerate(args.mask)]
    return styles, masks


def read_image(path: str | Path, role: str):
    """The image (PIL) at ``path``, decoded as the service decodes uploads; one over the pixel limit is shrunk while
    decoding, and a note says so (the line the service sends as X-Content-Shrunk)."""
    from stylevar.loaders import preflight
    decoded = preflight.read_image(path, role)
    note = decoded.shrink_note(role)
    if note:
        print(f"note: {path}: {note}", file=sys.stderr)
    return decoded.image


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
    from stylevar.loaders import preflight
    if is_video(args):
        return _stylize_video(args)
    job = check_stylize(args)
    model_dir = check_machine(args)

    from PIL import Image
    pipe = load_pipeline(model_dir, args)
    written, skipped = stylize_all(pipe, job, args)
    if written:
        with Image.open(written[0]) as first_out:
            notes = [upscale_note(first_out.size, pipe.image_size, pipe.upsampling(args.upsample).mode),
                     cap_note(job, first_out.size, args.max_size)]
        for note in filter(None, notes):
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


def check_machine(args: argparse.Namespace) -> Path:
    """A local --model folder's files (before torch is imported), the device and precision checks (--precision
    settled: the flag, else STYLEVAR_PRECISION, else auto), then the model directory (a hub id pulled on first use;
    offline and not cached: one error here)."""
    from stylevar.loaders.model_dir import check_model_files  # no torch
    from stylevar.utils.devices import check_device
    if args.model is not None and not hub.is_hub_id(args.model):
        check_model_files(args.model)
    check_device(args.device)
    args.precision = precision_setting(args.precision)

    from stylevar.loaders.pull import resolve_model
    return resolve_model(args.model)


def load_pipeline(model_dir: Path, args: argparse.Namespace):
    """The pipeline on its device, prepared as the service runs it."""
    from stylevar.runtime.inference import InferenceConfig, precision_of, prepare_for_serving
    from stylevar.pipelines.pipeline import StylePipeline  # the checks are done: from here on the work
    from stylevar.utils.precision import set_matmul_precision
    set_matmul_precision()  # TF32 on CUDA
    pipe = StylePipeline.from_pretrained(model_dir, device=args.device, threads=args.threads)
    if pipe.config.demo:
        print(f"using the {pipe.config.label}", file=sys.stderr)
    print(f"loaded {pipe.summary()}")  # before packing: packed linears hold their weights as buffers
    prepare_for_serving(pipe.model, InferenceConfig(precision=args.precision))
    if args.precision == "auto":  # what it settled on, and why
        choice = precision_of(pipe.model)
        print(f"precision: {choice.precision} ({choice.reason})", file=sys.stderr)
    return pipe


def stylize_all(pipe, job: StylizeJob, args: argparse.Namespace) -> tuple[list[Path], list[str]]:
    """Every content, ``--batch-size`` model rows a call: (the files written, the inputs skipped)."""
    from tqdm import tqdm
    per_call = max(1, args.batch_size // len(job.seeds))  # contents per model call
    skipped: list[str] = []
    written: list[Path] = []
    taken: set[Path] = set()
    bar = tqdm(total=len(job.contents), unit="image", disable=not job.many, file=sys.stderr)
    for start in range(0, len(job.contents), per_call):
        batch = read_batch(job, job.contents[start:start + per_call], skipped, bar)
        if not batch:
            continue
        results = pipe.run([pipe.prepare(job.request, img, job.styles, job.masks, args.max_size) for _, img in batch])
        for (path, _), images in zip(batch, results):
            for out, target in zip(images, output_paths(job, path, taken)):
                write_image(out, target, job.fmt, written, skipped)
            bar.update(1)
    bar.close()
    return written, skipped


def read_batch(job: StylizeJob, paths: list[Path], skipped: list[str], bar) -> list[tuple[Path, object]]:
    """The content images of one model call; an unreadable one is listed in ``skipped`` (and counted done)."""
    from stylevar.loaders import preflight
    if job.first is not None:
        return [(path, job.first) for path in paths]
    batch = []
    for path in paths:
        try:
            batch.append((path, read_image(path, "content")))
        except preflight.InputError as e:
            skipped.append(str(e))
            bar.update(1)
    return batch


def write_image(img, target: Path, fmt: str, written: list[Path], skipped: list[str]) -> None:
    """Save one result (added to ``written``); a failed write ends the command with one line."""
    from stylevar.loaders import preflight
    from stylevar.utils.atomic import WriteFailedError
    try:
        save_image(img, target, fmt)
    except OSError as e:  # a WriteFailedError names the file and why
        report_skipped(skipped)
        why = e if isinstance(e, WriteFailedError) else f"cannot write {target}: {e}"
        raise preflight.InputError(f"{why} ({len(written)} image(s) written before it are complete; "
                                   "nothing partial is left)") from e
    written.append(target)


def report_skipped(skipped: list[str]) -> None:
    if skipped:
        print(f"skipped {len(skipped)} unreadable file(s):", file=sys.stderr)
        for line in skipped:
            print(f"  {line}", file=sys.stderr)


def save_image(img, target: Path, fmt: str) -> None:
    """Write `img` to `target` whole or not at all (stylevar.utils.atomic)."""
    from stylevar.utils.atomic import atomic_write_path
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_path(target, lambda tmp: img.save(tmp, format=fmt.upper()), what="image")


def cap_note(job: StylizeJob, result_size: tuple[int, int], max_size: int | None) -> str | None:
    """The line saying that --max-size capped the content's size (the service's X-Size-Capped); None when it did
    not (or CONTENT is several files)."""
    from stylevar.processing.postprocess import size_cap, size_cap_note
    cap = None if job.first is None else size_cap(job.first.size, result_size, max_size)
    return None if cap is None else size_cap_note(cap, max_size, "--max-size")


def upscale_note(result_size: tuple[int, int], model_side: int, upsample: str = "bicubic") -> str | None:
    """A line saying that the result is larger than what the model drew (None when it is not)."""
    from stylevar.processing.postprocess import upscale_factor
    factor = upscale_factor(result_size, model_side)
    if factor <= 1.0:
        return None
    w, h = result_size
    return (f"note: the model draws {model_side}x{model_side} pixels; the result is upscaled {factor:.1f}x to "
            f"{w}x{h} ({upsample} upsampling). --max-size {model_side} keeps the model's resolution.")


# ---- a video ---------------------------------------------------------------------------------------
def is_video(args: argparse.Namespace) -> bool:
    """CONTENT or OUTPUT names a video by its extension."""
    return any(Path(p).suffix.lower() in VIDEO_EXTENSIONS for p in (args.content, args.output))


@dataclass(frozen=True)
class VideoJob:
    """What `stylevar stylize CLIP STYLE -o OUT.mp4` was asked to do, checked before any model loads."""

    content: Path
    info: object  # the clip's stylevar.processing.video.VideoInfo
    output: Path
    styles: list
    masks: list | None
    request: StylizeRequest  # the flags, validated by the declaration


def check_video(args: argparse.Namespace) -> VideoJob:
    """Every check of a video job (InputError, one line): the clip's header, the styles, the output .mp4."""
    import os
    from stylevar.loaders import preflight
    from stylevar.processing.video import VideoError, probe
    content = preflight.input_file(args.content, "content video")
    try:
        info = probe(content)
    except VideoError as e:  # its message names the file
        raise preflight.InputError(f"content video {e}") from e
    output = Path(args.output)
    if output.suffix.lower() != ".mp4":
        raise preflight.InputError(f"output {output}: a video is written as an H.264 .mp4 (give OUTPUT.mp4)")
    if args.num_samples != 1:
        raise preflight.InputError("--num-samples: a video gives one output video (leave it at 1)")
    if args.format is not None:
        raise preflight.InputError("--format: a video is written as an .mp4 (leave --format out)")
    if output.is_dir() or (output.exists() and not os.access(output, os.W_OK)):
        raise preflight.InputError(f"output {output}: cannot be written (a folder, or a file not writable)")
    preflight.output_folder(output.absolute().parent, "output folder")  # made before the video is written
    styles, masks = check_styles(args)
    request = stylize_request(args, **{name: None for name in IMAGE_ONLY})
    return VideoJob(content, info, output, styles, masks, request)


def _stylize_video(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from stylevar.loaders import preflight
    from stylevar.utils.atomic import WriteFailedError
    from stylevar.processing.video import VideoError
    job = check_video(args)
    pipe = load_pipeline(check_machine(args), args)
    bar = tqdm(total=job.info.frames, unit="frame", file=sys.stderr)

    def progress(done: int, total: int | None) -> None:
        bar.update(done - bar.n)

    try:
        job.output.parent.mkdir(parents=True, exist_ok=True)
        result = pipe.stylize_video(job.content, job.styles, job.output, request=job.request, style_masks=job.masks,
                                    temporal=args.temporal, batch_size=args.batch_size, max_side=args.max_size,
                                    progress=progress, info=job.info)
    except VideoError as e:  # found while decoding: a truncated or damaged clip; nothing was written
        raise preflight.InputError(f"content video {e} (nothing was written)") from e
    except WriteFailedError as e:
        raise preflight.InputError(f"{e} (nothing partial is left)") from e
    finally:
        bar.close()
    w, h = result.size
    print(f"wrote {result.path} ({w}x{h}, {result.frames} frames at {float(result.fps):g} fps, "
          f"{result.duration_s:.2f} s{', audio copied' if result.audio else ''}; {result.seconds:.1f} s)")
    return 0


COMMAND = Command("stylize", "re-draw a content image in the style of another", add_arguments)
