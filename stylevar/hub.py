"""Models and files on the Hugging Face Hub: hub ids, `stylevar pull`, and the `--model` resolver.

Every download goes through `huggingface_hub`, so its cache (`HF_HOME` / `HF_HUB_CACHE`), its token
(`HF_TOKEN`), its offline switch (`HF_HUB_OFFLINE=1`) and its endpoint (`HF_ENDPOINT`, for a mirror of the
Hub) apply. The environment is read on each call, not once at import.

A hub id names a published StyleVAR model: `hf:OWNER/NAME[@REVISION][:VARIANT]` (variant `grpo`, the
default, or `sft`). Its repository holds the reference checkpoints (`vae_ch160v4096z32.pth` and
`StyleVAR-GRPO.pth` or `StyleVAR_SFT.pth`); pulling it downloads them, converts them with the project's
checkpoint loaders and writes a model directory whose `config.json` records the repository, the revision,
the commit and the sha256 of each source file. The model's shape is the `d20` preset unless the
repository carries `stylevar_config.json` (the reference config fields, as `stylevar convert --config`
takes) or the caller names another (`--preset`, `--config`).

`resolve_model(value)` is the one function every entry point calls on its `--model` value: a hub id
becomes its model directory (pulled on first use, which is an explicit request for it), anything else is
taken as a directory as it is. Offline with files missing from the cache, it raises `HubError` before any
other work, naming the repository, the files and the `stylevar pull` command.

This module imports neither torch nor huggingface_hub until it needs them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "hf:"
DEFAULT_REPO = "Senfier-LiqiJing/StyleVAR"
VAE_FILE = "vae_ch160v4096z32.pth"
VARIANTS = {"grpo": "StyleVAR-GRPO.pth", "sft": "StyleVAR_SFT.pth"}
DEFAULT_VARIANT = "grpo"
DEFAULT_PRESET = "d20"
SHAPE_FILE = "stylevar_config.json"  # optional, in the repository: the reference config fields of its weights
DEFAULT_REVISION = "main"

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TRUE = {"1", "on", "yes", "true"}


class HubError(FileNotFoundError):
    """A hub model or file that cannot be had: not cached while offline, not on the Hub, no access."""


# ------------------------------------------------------------------------------------------------ ids
@dataclass(frozen=True)
class HubFile:
    """One file of a Hub repository at a revision."""

    repo_id: str
    filename: str
    revision: str = DEFAULT_REVISION

    @property
    def url(self) -> str:
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        return f"{endpoint}/{self.repo_id}/resolve/{self.revision}/{self.filename}"


@dataclass(frozen=True)
class HubModel:
    """A published StyleVAR model: a repository, a variant (which checkpoint) and a revision."""

    repo_id: str = DEFAULT_REPO
    variant: str = DEFAULT_VARIANT
    revision: str = DEFAULT_REVISION

    def __post_init__(self) -> None:
        if not _REPO_RE.match(self.repo_id):
            raise ValueError(f"{self.repo_id!r} is not a Hub repository id (OWNER/NAME)")
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose from {', '.join(VARIANTS)}")
        if not self.revision or any(c.isspace() for c in self.revision):
            raise ValueError(f"bad revision {self.revision!r}")

    @classmethod
    def parse(cls, text: str, *, prefix: bool = True) -> "HubModel":
        """`hf:OWNER/NAME[@REVISION][:VARIANT]` (without `hf:` when `prefix` is False)."""
        body = str(text)
        if prefix:
            if not body.startswith(PREFIX):
                raise ValueError(f"{text!r} is not a hub id (hf:OWNER/NAME[:variant])")
            body = body[len(PREFIX):]
        body, _, variant = body.partition(":")
        repo, _, revision = body.partition("@")
        return cls(repo, variant or DEFAULT_VARIANT, revision or DEFAULT_REVISION)

    @property
    def id(self) -> str:
        rev = f"@{self.revision}" if self.revision != DEFAULT_REVISION else ""
        return f"{PREFIX}{self.repo_id}{rev}:{self.variant}"

    @property
    def checkpoint(self) -> str:
        return VARIANTS[self.variant]

    def files(self) -> tuple[HubFile, HubFile]:
        """The tokenizer and the transformer checkpoints."""
        return (HubFile(self.repo_id, VAE_FILE, self.revision), HubFile(self.repo_id, self.checkpoint, self.revision))

    def default_dir(self, shape: "Shape") -> Path:
        """`STYLEVAR_HOME/models/OWNER--NAME/VARIANT[@REVISION][-SHAPE]`."""
        from stylevar.weights import home

        name = self.variant
        if self.revision != DEFAULT_REVISION:
            name += "@" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.revision)
        if shape.tag:
            name += "-" + shape.tag
        return home() / "models" / self.repo_id.replace("/", "--") / name


def is_hub_id(value: object) -> bool:
    return isinstance(value, (str, os.PathLike)) and os.fspath(value).startswith(PREFIX)


# ------------------------------------------------------------------------------------------------ shapes
@dataclass(frozen=True)
class Shape:
    """Which configuration the checkpoints are read with: the repository's default, a preset, or reference fields."""

    preset: str | None = None  # a named preset (explicit)
    reference: dict[str, Any] | None = field(default=None, hash=False)  # reference config fields (explicit)

    @property
    def key(self) -> str:
        if self.reference is not None:
            return "config:" + self._digest()
        return f"preset:{self.preset}" if self.preset else "default"

    @property
    def tag(self) -> str:
        """Suffix of the default folder: empty for the repository's default shape."""
        if self.reference is not None:
            return "config-" + self._digest()[:10]
        return self.preset or ""

    def _digest(self) -> str:
        return hashlib.sha256(json.dumps(self.reference, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------ the cache
def cache_dir() -> Path:
    """huggingface_hub's cache folder by its own variables, read now: HF_HUB_CACHE, else HF_HOME/hub."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now as well as when huggingface_hub was imported."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or any(
        os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached_path(f: HubFile) -> Path | None:
    """The file in the local cache, or None (never touches the network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(f.repo_id, f.filename, cache_dir=cache_dir(), revision=f.revision)
    return Path(found) if isinstance(found, str) else None


def _cached_absent(f: HubFile) -> bool:
    """True when the cache knows that the file does not exist in the repository at that revision."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(f.repo_id, f.filename, cache_dir=cache_dir(), revision=f.revision)
    return found is not None and not isinstance(found, str)  # the documented "cached as absent" marker


def pull_command(model: HubModel, shape: Shape | None = None) -> str:
    cmd = f"stylevar pull {model.repo_id} --variant {model.variant}"
    if model.revision != DEFAULT_REVISION:
        cmd += f" --revision {model.revision}"
    if shape is not None and shape.preset:
        cmd += f" --preset {shape.preset}"
    elif shape is not None and shape.reference is not None:
        cmd += " --config CONFIG.json"
    return cmd


def _unavailable(what: str, repo_id: str, revision: str, files: list[str], why: str, fix: str) -> HubError:
    return HubError(
        f"{what}: {why}\n"
        f"  repository {repo_id} (revision {revision}), files: {', '.join(files)}\n"
        f"  Hugging Face cache: {cache_dir()}\n"
        f"{fix}")


def check_cached(model: HubModel, shape: Shape | None = None) -> None:
    """Offline: raise one `HubError` naming every file of `model` the cache lacks (online: nothing to check)."""
    if not offline():
        return
    absent = [f.filename for f in model.files() if cached_path(f) is None]
    if absent:
        raise _unavailable(
            model.id, model.repo_id, model.revision, absent,
            "not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE=1)",
            f"fetch it on a machine with internet access with:\n  {pull_command(model, shape)}\n"
            "then copy the Hugging Face cache (or the model folder it writes) here, or unset HF_HUB_OFFLINE")


def download(f: HubFile, *, progress: bool = True, missing_ok: bool = False) -> Path | None:
    """The file through huggingface_hub (its cache, token, offline switch, endpoint); `HubError` if it cannot
    be had. With `missing_ok`, None when the repository has no such file (or, offline, the cache has none)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub import errors as hf_errors

    is_offline = offline()
    try:
        return Path(hf_hub_download(f.repo_id, f.filename, revision=f.revision, cache_dir=cache_dir(),
                                    local_files_only=is_offline, tqdm_class=None if progress else _silent_bar()))
    except hf_errors.LocalEntryNotFoundError:
        if missing_ok:  # not cached, and the Hub cannot be asked: treated as absent
            return None
        why = ("not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE=1)" if is_offline else
               "not in the Hugging Face cache, and the Hub cannot be reached")
        fix = "fetch it on a machine with internet access, or unset HF_HUB_OFFLINE"
    except hf_errors.RemoteEntryNotFoundError:
        if missing_ok:
            return None
        why, fix = "the repository has no such file at that revision", "check the repository's file list"
    except hf_errors.GatedRepoError as e:
        why, fix = f"the repository is gated ({e})", "accept its terms on the Hub and set HF_TOKEN"
    except hf_errors.RepositoryNotFoundError:
        why, fix = "no such repository, or it is private", "check the name; for a private repository set HF_TOKEN"
    except hf_errors.RevisionNotFoundError:
        why, fix = f"no revision {f.revision!r} in the repository", "check --revision"
    except OSError as e:  # HfHubHTTPError, connection errors, a full disk
        why, fix = f"download failed: {e}", "check the network (HF_ENDPOINT for a mirror) and try again"
    raise _unavailable(f.filename, f.repo_id, f.revision, [f.filename], why, fix)


def _silent_bar():
    from tqdm.auto import tqdm

    class Silent(tqdm):  # huggingface_hub's progress bar, switched off for this call only
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


def _optional(f: HubFile) -> Path | None:
    """An optional file of the repository: its path, or None when the repository has none."""
    found = cached_path(f)
    if found is not None or _cached_absent(f):
        return found
    return download(f, progress=False, missing_ok=True)


def sha256_of(path: Path, *, progress: bool = True) -> str:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with open(path, "rb") as fh, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, file=sys.stderr,
                                      desc=f"sha256 {path.name}", disable=not progress, leave=False) as bar:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ pulling
@dataclass(frozen=True)
class PullResult:
    path: Path
    skipped: bool  # the folder was already complete: nothing done


def _source_matches(folder: Path, model: HubModel, shape: Shape) -> bool:
    """`folder` is a whole model directory pulled from `model` with `shape`."""
    try:
        source = json.loads((folder / "config.json").read_text())["extra"]["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if (source.get("repo"), source.get("variant"), source.get("revision"), source.get("shape")) != (
            model.repo_id, model.variant, model.revision, shape.key):
        return False
    from stylevar.pipeline import missing_model_files  # (torch: only once a pulled folder is there)

    return not missing_model_files(folder)


def _is_pulled(folder: Path) -> bool:
    try:
        return "source" in json.loads((folder / "config.json").read_text()).get("extra", {})
    except (OSError, ValueError, AttributeError):
        return False


def _configs(shape: Shape, repo_shape: dict[str, Any] | None):
    from stylevar.config import StyleVARConfig, VQVAEConfig, presets

    ref = shape.reference if shape.reference is not None else (None if shape.preset else repo_shape)
    if ref is not None:
        try:
            return VQVAEConfig.from_reference(ref), StyleVARConfig.from_reference(ref)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the reference config lacks or mistypes a field ({e!r}); it needs patch_nums, "
                             "V, Cvae, ch and depth") from None
    return presets(shape.preset or DEFAULT_PRESET)


def _model_card(model: HubModel, source: dict[str, Any]) -> str:
    rows = "\n".join(f"| `{name}` | `{info['sha256']}` | {info['size']:,} |" for name, info in source["files"].items())
    return (f"# {model.checkpoint} ({model.repo_id})\n\n"
            f"Converted by `stylevar pull` from the Hugging Face repository `{model.repo_id}`, revision "
            f"`{model.revision}` (commit `{source['commit']}`), variant `{model.variant}`, shape `{source['shape']}`.\n"
            "The weights are the published ones, only rearranged into this project's layout.\n\n"
            f"| source file | sha256 | bytes |\n|---|---|---|\n{rows}\n")


def pull(model: HubModel, *, shape: Shape = Shape(), out: str | os.PathLike | None = None, force: bool = False,
         progress: bool = True) -> PullResult:
    """Download `model`'s checkpoints, convert them and write a model directory (default: `model.default_dir`).

    A folder that already holds this pull (same repository, variant, revision and shape) is left as it is
    unless `force`. The folder is written next to its place and renamed into it, so it is whole or absent;
    a lock (below STYLEVAR_HOME/.locks) lets one process convert while others (the ranks of a torchrun
    job) wait for it.
    """
    dest = Path(out) if out is not None else model.default_dir(shape)
    if not force and _source_matches(dest, model, shape):
        return PullResult(dest, skipped=True)
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not _is_pulled(dest))):
        raise ValueError(f"{dest} exists and is not a folder written by `stylevar pull`; choose another --out")
    check_cached(model, shape)  # offline: fail before any download or model work

    from filelock import FileLock

    from stylevar.weights import home

    locks = home() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(dest.resolve()).encode()).hexdigest()[:16]
    with FileLock(str(locks / f"pull-{key}.lock")):
        if not force and _source_matches(dest, model, shape):  # another process pulled it meanwhile
            return PullResult(dest, skipped=True)
        _pull_into(model, shape, dest, progress)
    return PullResult(dest, skipped=False)


def _pull_into(model: HubModel, shape: Shape, dest: Path, progress: bool) -> None:
    paths = {f.filename: download(f, progress=progress) for f in model.files()}
    repo_shape = None
    if shape.preset is None and shape.reference is None:
        found = _optional(HubFile(model.repo_id, SHAPE_FILE, model.revision))
        if found is not None:
            try:
                repo_shape = json.loads(found.read_text())
            except ValueError as e:
                raise ValueError(f"{model.repo_id}/{SHAPE_FILE} is not JSON ({e})") from None
    vq_cfg, tr_cfg = _configs(shape, repo_shape)

    from tqdm.auto import tqdm

    with tqdm(total=len(paths) + 3, desc=f"convert {model.id}", unit="step", file=sys.stderr,
              disable=not progress) as steps:
        files: dict[str, dict[str, Any]] = {}
        for name, path in paths.items():
            assert path is not None
            digest = sha256_of(path, progress=progress)
            blob = path.resolve().name
            if re.fullmatch(r"[0-9a-f]{64}", blob) and blob != digest:  # LFS blobs are named by their sha256
                raise ValueError(f"cached {name} is damaged: sha256 {digest} is not its blob name {blob}; "
                                 f"delete {path.resolve()} and pull again")
            files[name] = {"sha256": digest, "size": path.stat().st_size}
            steps.update()
        commit = paths[model.checkpoint].parent.name  # .../snapshots/<commit>/<file>
        source = {"repo": model.repo_id, "variant": model.variant, "revision": model.revision, "commit": commit,
                  "shape": shape.key, "files": files, "hub_id": model.id}
        if repo_shape is not None:
            source["shape_file"] = SHAPE_FILE

        from stylevar.checkpoints import load_stylevar, load_vqvae
        from stylevar.pipeline import StylePipeline

        tokenizer = load_vqvae(paths[VAE_FILE], vq_cfg)
        steps.update()
        transformer = load_stylevar(paths[model.checkpoint], tr_cfg, tokenizer)
        steps.update()
        pipe = StylePipeline.from_models(transformer, name=Path(model.checkpoint).stem, extra={"source": source})
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
        try:
            pipe.save_pretrained(staging, model_card=_model_card(model, source))
            if dest.exists():  # an older pull, or an empty folder: replaced whole
                old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
                os.replace(dest, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        steps.update()


def resolve_model(value: str | os.PathLike | None, *, progress: bool = True) -> Path | None:
    """The local model directory for a `--model` value: a hub id is pulled on first use and becomes its
    folder below STYLEVAR_HOME/models; a path is returned as it is; None (the demo model) stays None."""
    if value is None:
        return None
    if not is_hub_id(value):
        return Path(value)
    return pull(HubModel.parse(os.fspath(value)), progress=progress).path


# ------------------------------------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `stylevar pull` (listed in stylevar.cli)."""
    p.description = ("Download a published StyleVAR model from the Hugging Face Hub (through huggingface_hub: its "
                     "cache, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT) and convert it into a model directory. "
                     "Re-running is a no-op once the folder is complete.")
    p.add_argument("repo_id", nargs="?", default=DEFAULT_REPO, metavar="REPO_ID",
                   help=f"Hub repository OWNER/NAME (default {DEFAULT_REPO})")
    p.add_argument("--variant", choices=tuple(VARIANTS), default=None,
                   help=f"which checkpoint: grpo ({VARIANTS['grpo']}, LoRA merged; the default) or sft ({VARIANTS['sft']})")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--preset", default=None, help=f"model shape (default: the repository's {SHAPE_FILE} "
                                                      f"if it has one, else {DEFAULT_PRESET})")
    shape.add_argument("--config", metavar="CONFIG.json",
                       help="reference config fields (patch_nums, V, Cvae, ch, depth, ...) for non-standard sizes")
    p.add_argument("--revision", default=DEFAULT_REVISION, help="branch, tag or commit (default main)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="model directory to write (default STYLEVAR_HOME/models/OWNER--NAME/VARIANT...)")
    p.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_pull)


def _cmd_pull(args: argparse.Namespace) -> int:
    from stylevar import preflight
    from stylevar.config import PRESETS

    model = HubModel.parse(args.repo_id.removeprefix(PREFIX), prefix=False)  # a hub id is taken too
    model = HubModel(model.repo_id, args.variant or model.variant,
                     args.revision if args.revision != DEFAULT_REVISION else model.revision)
    if args.preset is not None and args.preset not in PRESETS:
        raise preflight.InputError(f"--preset {args.preset!r}: choose from {', '.join(PRESETS)}")
    shape = Shape(preset=args.preset)
    if args.config:
        try:
            shape = Shape(reference=json.loads(preflight.input_file(args.config, "--config").read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise preflight.InputError(f"--config {args.config} is not a JSON file ({e})") from None
    if args.out is not None:
        preflight.output_folder(args.out, "--out folder")
    result = pull(model, shape=shape, out=args.out, force=args.force, progress=not args.quiet)
    if result.skipped:
        print(f"{model.id} is already at {result.path}: nothing to do (--force converts again)")
    else:
        print(f"wrote {result.path}")
    print(f"use it with: stylevar stylize CONTENT STYLE -o OUT.png --model {result.path}\n"
          f"         or: python -m serve --model {result.path}")
    return 0
