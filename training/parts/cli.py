"""The command-line options every recipe shares and the :class:`~training.parts.schedule.LoopConfig` made from them;
importing this module does not import torch (a recipe's ``--help`` is its parser alone)."""
from __future__ import annotations

import argparse
import importlib
from dataclasses import fields
from typing import TYPE_CHECKING

from stylevar.cli.command import Parser
from stylevar.utils.devices import DeviceError, check_device
from stylevar.utils.extras import extra_error
from stylevar.utils.helptext import DEVICE_AUTO
from stylevar.utils.precision import TRAINING_PRECISIONS as PRECISIONS

if TYPE_CHECKING:
    from training.parts.schedule import LoopConfig

# options that may change when a run is resumed (they do not change what is computed)
FREE_KEYS = ("out", "save_every", "save_every_minutes", "keep_checkpoints", "log_every", "num_workers", "no_progress",
             "device", "channels_last", "max_minutes", "val_every", "val_batch_size", "val_max_batches")

DEFAULT_SAVE_EVERY_MINUTES = 5.0  # the recipes' --save-every-minutes
SFT_COMPILE_MIN_STEPS = 200  # training.sft compiles its blocks by default from this many steps on (docs/training.md)

DATA_HELP = "triplet manifest, folder (manifest.jsonl or shards), shard tar or pattern; repeatable"


def recipe_parser(module: str, doc: str, *, data_help: str = DATA_HELP) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE`` with the repeatable --data (then :func:`add_loop_args`)."""
    p = Parser(prog=f"python -m {module}", description=doc.split("\n")[0])
    p.add_argument("--data", action="append", required=True, help=data_help)
    return p


def run_recipe(parser: argparse.ArgumentParser, module: str, argv: list[str] | None, entry: str = "execute",
               extra: str | None = "train") -> int:
    """Parse ``argv``, then (torch and the models imported only now) TF32 on CUDA and ``module.entry(args)``; a
    missing ``extra`` (`.[app]` installs the service alone) or a --device this machine lacks is one line."""
    args = parser.parse_args(argv)
    if extra and (error := extra_error(extra, "this recipe")):
        parser.error(error)
    try:  # a GPU asked for where there is none: one line, as `stylevar stylize` says it
        check_device(getattr(args, "device", None))
    except DeviceError as e:
        parser.error(str(e))
    from stylevar.utils.precision import set_matmul_precision
    set_matmul_precision()
    return getattr(importlib.import_module(module), entry)(args)


def resolve_hub_options(args: argparse.Namespace, *flags: str) -> None:
    """Each option of ``flags`` that holds a hub id (hf:OWNER/NAME[@REVISION][:grpo|sft]) set to its model
    directory, pulled on first use; an id that cannot be resolved exits with one line."""
    from stylevar.loaders import hub
    from stylevar.loaders.pull import resolve_model
    for flag in flags:
        value = getattr(args, flag)
        if hub.is_hub_id(value):
            try:
                setattr(args, flag, str(resolve_model(value)))
            except (hub.HubError, ValueError) as e:
                raise SystemExit(f"error: --{flag} {value}: {e}") from None


def batch_size_option(text: str) -> int | str:
    """``--batch-size``: a positive number, or ``auto`` where the recipe offers it."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of samples or auto")
    return value


def add_loop_args(parser, *, lr: float, batch_size: int, max_grad_norm: float = 2.0, auto_batch: str = "") -> None:
    """The loop's options; ``auto_batch``: what ``--batch-size auto`` does (empty: not offered)."""
    g = parser.add_argument_group("run and loop")
    g.add_argument("--out", required=True, help="RUN directory; re-running the same command resumes it")
    g.add_argument("--max-steps", type=int, required=True, help="optimizer steps in all")
    g.add_argument("--batch-size", type=batch_size_option if auto_batch else int, default=batch_size,
                   help="global batch: samples per optimizer step over all processes and accumulation steps"
                        + (f"; auto: {auto_batch}" if auto_batch else ""))
    g.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    g.add_argument("--lr", type=float, default=lr, help="peak learning rate (AdamW)")
    g.add_argument("--warmup-steps", type=int, default=0, help="linear learning-rate warm-up steps")
    g.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay")
    g.add_argument("--max-grad-norm", type=float, default=max_grad_norm, help="0 disables clipping")
    g.add_argument("--save-every", type=int, default=500, help="checkpoint every N steps (and at the end)")
    g.add_argument("--save-every-minutes", type=float, default=DEFAULT_SAVE_EVERY_MINUTES, metavar="M",
                   help="also checkpoint once M minutes have passed since the last checkpoint (0: only by steps)")
    g.add_argument("--max-minutes", type=float, default=0.0, metavar="M",
                   help="a time budget: after M minutes of steps (start-up aside) checkpoint and stop, exit 0; the same "
                        "command continues (0: none)")
    g.add_argument("--keep-checkpoints", type=int, default=3, help="step checkpoints kept in RUN/checkpoints (older ones deleted)")
    g.add_argument("--log-every", type=int, default=10, help="steps between lines of RUN/log.jsonl and TensorBoard")
    g.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: only at the end)")
    g.add_argument("--seed", type=int, default=0, help="seed of the model initialisation, the data order and sampling")
    g.add_argument("--num-workers", type=int, default=None,
                   help="DataLoader worker processes per rank (default: on CUDA the CPUs per process less one, at "
                        "most 8; on the CPU 0; docs/gpus.md, loader policy)")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None, help=f"where to train (default: {DEVICE_AUTO})")
    g.add_argument("--precision", choices=PRECISIONS, default="auto", help="auto: bf16 autocast on CUDA, fp32 on CPU")
    g.add_argument("--no-progress", action="store_true", help="no tqdm bar")


def loop_config(args, precision: str) -> LoopConfig:
    from training.parts.schedule import LoopConfig  # with torch: once the options are parsed
    options = {f.name: getattr(args, f.name) for f in fields(LoopConfig) if f.name not in ("precision", "progress")}
    return LoopConfig(**options, precision=precision, progress=not args.no_progress)
