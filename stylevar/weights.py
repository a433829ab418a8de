"""Registry and cache of every external weight the project uses.

Each entry says what the file is, where it is looked for, where it comes from and how to check it.
Nothing is ever downloaded implicitly: a missing file raises `MissingWeightError` (naming the file,
the paths searched and the command that fetches it); `stylevar weights fetch NAME` downloads on
request (checksum verified where one is published, written atomically).

Where files are looked for:
- `home()`: `$STYLEVAR_HOME`, default `~/.cache/stylevar`; every entry can live here.
- torchvision files (VGG-19, VGG-16, AlexNet, ResNet-18) are looked for first where torchvision itself
  keeps them, `$TORCH_HOME/hub/checkpoints/` (`TORCH_HOME` defaults to `$XDG_CACHE_HOME/torch`, else
  `~/.cache/torch`), so an existing torchvision cache is reused; `fetch` writes there.

Loading helpers (`load_state_dict`, `check_state_dict`) read `.pth` files with `weights_only=True`
and report every missing, unexpected and wrongly shaped key in one error.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

Location = Literal["torch", "stylevar"]
Unpack = Literal["file", "zip", "zip-folder"]

FETCH_COMMAND = "stylevar weights fetch {name}"
_LIST_LIMIT = 12


class MissingWeightError(FileNotFoundError):
    """A registered weight is not on disk. The message names the file, the paths searched and the fix."""

    def __init__(self, weight: "Weight", searched: list[Path], detail: str = ""):
        self.weight = weight
        self.searched = searched
        where = "\n".join(f"  - {p}" for p in searched)
        if weight.downloadable:
            how = f"fetch it (needs internet) with:\n  {FETCH_COMMAND.format(name=weight.name)}"
        else:
            how = f"it has no public download URL: {weight.note or 'place the file yourself'}"
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"missing weight {weight.name!r}: {weight.filename}{extra}\n"
            f"looked for it at:\n{where}\n{how}\n"
            f"(or place the file at the first path above; STYLEVAR_HOME / TORCH_HOME move the caches)"
        )


class WeightMismatchError(ValueError):
    """A weight file's keys or shapes are not the expected layout."""

    def __init__(self, source: str, missing: list[str], unexpected: list[str], wrong_shape: list[str]):
        self.missing, self.unexpected, self.wrong_shape = missing, unexpected, wrong_shape
        parts = []
        for label, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong_shape)):
            if keys:
                shown = ", ".join(keys[:_LIST_LIMIT])
                more = f", ... and {len(keys) - _LIST_LIMIT} more" if len(keys) > _LIST_LIMIT else ""
                parts.append(f"{label} ({len(keys)}): {shown}{more}")
        super().__init__(f"{source} does not have the expected layout:\n  " + "\n  ".join(parts))


class ChecksumError(ValueError):
    """A downloaded file's sha256 is not the published one (the file is not kept)."""


@dataclass(frozen=True)
class Part:
    """One download of a weight. `path` is relative to the weight's folder (or the file itself).

    `unpack`: `file` (kept as downloaded), `zip` (extracted into the folder; an archive that wraps its
    files in one folder of its own is unwrapped), `zip-folder` (a zip with one top folder, e.g. a GitHub
    archive, extracted and renamed to `path`). `check` lists glob patterns, relative to the weight's
    folder, that must match once the part is in place (default: `path`).
    """

    path: str
    url: str | None
    sha256: str | None = None  # full digest where the source publishes it
    sha256_prefix: str | None = None  # torchvision: leading hex digits of the sha256, in the file name
    unpack: Unpack = "file"
    check: tuple[str, ...] = ()

    @property
    def mirror_name(self) -> str:
        """File name used below a mirror URL (`fetch(..., mirror=URL)`)."""
        name = Path(urllib.parse.urlparse(self.url or "").path).name
        if "." in name:
            return name
        return Path(self.path).name + (".zip" if self.unpack != "file" else "")

    def checks(self) -> tuple[str, ...]:
        return self.check or (self.path,)


@dataclass(frozen=True)
class Weight:
    """A registered external weight: a single file, or a folder (`tree`) assembled from several parts."""

    name: str
    filename: str  # the file (or folder) name, below the search folders
    description: str
    used_by: str
    parts: tuple[Part, ...]
    location: Location = "stylevar"
    note: str = ""

    @property
    def tree(self) -> bool:
        return len(self.parts) > 1 or self.parts[0].unpack != "file"

    @property
    def downloadable(self) -> bool:
        return all(p.url for p in self.parts)

    @property
    def url(self) -> str | None:
        return self.parts[0].url if len(self.parts) == 1 else None

    @property
    def sha256(self) -> str | None:
        return self.parts[0].sha256 if len(self.parts) == 1 else None

    def search_paths(self) -> list[Path]:
        """Where the file (or folder) is looked for, in order; `fetch` writes to the first."""
        paths = [torch_home() / "hub" / "checkpoints" / self.filename] if self.location == "torch" else []
        paths.append(home() / self.filename)
        return paths

    def complete(self, path: Path) -> bool:
        if not self.tree:
            return path.is_file()
        return path.is_dir() and all(_matches(path, pattern) for part in self.parts for pattern in part.checks())

    def find(self) -> Path | None:
        for path in self.search_paths():
            if self.complete(path):
                return path
        return None


def _matches(folder: Path, pattern: str) -> bool:
    if any(ch in pattern for ch in "*?["):
        return any(folder.glob(pattern))
    return (folder / pattern).exists()


def home() -> Path:
    """The project's weight cache: `$STYLEVAR_HOME`, default `~/.cache/stylevar`."""
    env = os.environ.get("STYLEVAR_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stylevar"


def torch_home() -> Path:
    """torch's cache folder by torch's own rule: `$TORCH_HOME`, else `$XDG_CACHE_HOME/torch`, else `~/.cache/torch`."""
    env = os.environ.get("TORCH_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "torch"


def _torchvision(name: str, url: str, description: str, used_by: str) -> Weight:
    filename = Path(urllib.parse.urlparse(url).path).name
    prefix = filename.rsplit("-", 1)[-1].split(".", 1)[0]
    return Weight(name, filename, description, used_by, (Part(filename, url, sha256_prefix=prefix),), location="torch")


_DREAMSIM_ZIP = "https://github.com/ssundaram21/dreamsim/releases/download/v0.2.0-checkpoints/dreamsim_dino_vitb16_checkpoint.zip"
_DINO_REPO_ZIP = "https://github.com/facebookresearch/dino/zipball/main"
_DINO_BACKBONE = "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"
_VAR_HF = "https://huggingface.co/FoundationVision/var/resolve/main"
_ADAIN_RELEASE = "https://github.com/naoto0804/pytorch-AdaIN/releases/download/v0.0.0"
_CLIP_HF = "https://huggingface.co/timm/vit_base_patch32_clip_224.openai/resolve/main/open_clip_model.safetensors"

_NO_SHA = "the source publishes no sha256; `fetch` prints the digest it got"


def _registry() -> dict[str, Weight]:
    entries = [
        _torchvision("vgg19", "https://download.pytorch.org/models/vgg19-dcbb9e9d.pth",
                     "torchvision VGG-19, ImageNet weights", "style/content loss; AdaIN paper-evaluation encoder"),
        _torchvision("vgg16", "https://download.pytorch.org/models/vgg16-397923af.pth",
                     "torchvision VGG-16, ImageNet weights", "LPIPS (VGG backbone, default)"),
        _torchvision("alexnet", "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
                     "torchvision AlexNet, ImageNet weights", "LPIPS (AlexNet backbone, --lpips-net alex)"),
        _torchvision("resnet18", "https://download.pytorch.org/models/resnet18-f37072fd.pth",
                     "torchvision ResNet-18, ImageNet weights", "StyleVAR style/content encoders (init)"),
        Weight(
            "dreamsim", "dreamsim",
            "DreamSim dino_vitb16: LoRA adapter + DINO head, DINO hub repo, DINO ViT-B/16 backbone",
            "DreamSim metric",
            (
                Part(".", _DREAMSIM_ZIP, unpack="zip", check=(
                    "dino_vitb16_pretrain.pth", "dino_vitb16_single_lora/adapter_config.json",
                    "dino_vitb16_single_lora/adapter_model.*")),
                Part("facebookresearch_dino_main", _DINO_REPO_ZIP, unpack="zip-folder",
                     check=("facebookresearch_dino_main/hubconf.py",)),
                Part("checkpoints/dino_vitbase16_pretrain.pth", _DINO_BACKBONE),
            ),
            note="a folder: the dreamsim cache_dir, which is also torch.hub's dir while DreamSim loads; " + _NO_SHA,
        ),
        Weight("clip", "open_clip/ViT-B-32-openai/open_clip_model.safetensors",
               "open_clip ViT-B-32, OpenAI weights (the file open_clip loads for pretrained='openai')",
               "CLIP similarity", (Part("open_clip_model.safetensors", _CLIP_HF),), note=_NO_SHA),
        Weight("adain_vgg", "vgg_normalised.pth", "AdaIN encoder: torch7-converted normalised VGG-19",
               "AdaIN baseline (adain)", (Part("vgg_normalised.pth", f"{_ADAIN_RELEASE}/vgg_normalised.pth"),),
               note=_NO_SHA),
        Weight("adain_decoder", "decoder.pth", "AdaIN decoder (trained with vgg_normalised.pth)",
               "AdaIN baseline (adain, adain-paper)", (Part("decoder.pth", f"{_ADAIN_RELEASE}/decoder.pth"),),
               note=_NO_SHA),
        Weight("var_vae", "vae_ch160v4096z32.pth", "VAR multi-scale VQ-VAE tokenizer", "official presets (d16..d30)",
               (Part("vae_ch160v4096z32.pth", f"{_VAR_HF}/vae_ch160v4096z32.pth"),), note=_NO_SHA),
    ]
    for depth in (16, 20, 24, 30):
        entries.append(Weight(
            f"var_d{depth}", f"var_d{depth}.pth", f"class-conditional VAR d{depth} (ImageNet 256)",
            "StyleVAR SFT initialisation", (Part(f"var_d{depth}.pth", f"{_VAR_HF}/var_d{depth}.pth"),), note=_NO_SHA))
    no_url = "the StyleVAR checkpoints have no known public URL: obtain the file from the authors and place it"
    entries += [
        Weight("stylevar_sft", "StyleVAR_SFT.pth", "StyleVAR d20 after SFT (reference format)", "stylevar import",
               (Part("StyleVAR_SFT.pth", None),), note=no_url + " at the first path listed"),
        Weight("stylevar_grpo", "StyleVAR-GRPO.pth", "StyleVAR d20 after GRPO (reference format)", "stylevar import",
               (Part("StyleVAR-GRPO.pth", None),), note=no_url + " at the first path listed"),
    ]
    return {w.name: w for w in entries}


REGISTRY: Mapping[str, Weight] = _registry()


def get(name: str) -> Weight:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown weight {name!r}; registered: {', '.join(REGISTRY)}") from None


def resolve(name: str) -> Path:
    """Path of a registered weight (a file, or the folder of a tree); `MissingWeightError` if absent."""
    weight = get(name)
    found = weight.find()
    if found is not None:
        return found
    searched = weight.search_paths()
    detail = ""
    if weight.tree:
        partial = [p for p in searched if p.is_dir()]
        if partial:
            absent = [pat for part in weight.parts for pat in part.checks() if not _matches(partial[0], pat)]
            detail = f"{partial[0]} is incomplete, it lacks: {', '.join(absent)}"
    raise MissingWeightError(weight, searched, detail)


def missing(names: Iterable[str]) -> dict[str, MissingWeightError]:
    """The subset of `names` that is not on disk, each with its error."""
    out: dict[str, MissingWeightError] = {}
    for name in dict.fromkeys(names):
        try:
            resolve(name)
        except MissingWeightError as e:
            out[name] = e
    return out


# ----------------------------------------------------------------------------------------------- loading


def load_state_dict(path: str | os.PathLike, *, key: str | None = None) -> dict[str, torch.Tensor]:
    """Read a state dict from `.safetensors` or `.pth` (pickle read with `weights_only=True`).

    `key` selects a nested dict (e.g. "state_dict"). Memory-maps where the file format allows it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weight file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        obj: object = load_file(str(path), device="cpu")
    else:
        try:
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) serialisation
        except Exception as e:  # noqa: BLE001 - unpickling errors come in many types
            raise ValueError(f"cannot read weight file {path}: {e}") from e
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise WeightMismatchError(str(path), [key], [], [])
        obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return obj


def check_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor | torch.Size | tuple[int, ...]],
    *,
    source: str,
    allow_unexpected: bool = False,
) -> None:
    """Raise `WeightMismatchError` listing every missing, unexpected and wrongly shaped key."""

    def shape(v) -> tuple[int, ...]:
        return tuple(v.shape) if isinstance(v, torch.Tensor) else tuple(v)

    missing_keys = [k for k in expected if k not in state_dict]
    unexpected = [] if allow_unexpected else [k for k in state_dict if k not in expected]
    wrong = [
        f"{k}: file {shape(state_dict[k])} vs expected {shape(expected[k])}"
        for k in expected
        if k in state_dict and shape(state_dict[k]) != shape(expected[k])
    ]
    if missing_keys or unexpected or wrong:
        raise WeightMismatchError(source, missing_keys, unexpected, wrong)


def load_into(module: torch.nn.Module, path: str | os.PathLike, *, source: str | None = None) -> None:
    """Strictly load a state-dict file into `module` after checking keys and shapes."""
    sd = load_state_dict(path)
    check_state_dict(sd, module.state_dict(), source=source or str(path))
    module.load_state_dict(sd, strict=True)


# ----------------------------------------------------------------------------------------------- fetching


def _part_url(part: Part, mirror: str | None) -> str:
    if mirror:
        return mirror.rstrip("/") + "/" + part.mirror_name
    if part.url is None:
        raise ValueError(f"{part.path}: no download URL (pass a mirror, or place the file yourself)")
    return part.url


def _download(url: str, dest: Path, part: Part, *, progress: bool) -> str:
    """Stream `url` to a temporary file next to `dest`, verify, then rename. Returns the sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "stylevar-weights"})
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(request, timeout=60) as response:
            total = response.headers.get("Content-Length")
            with _bar(int(total) if total and total.isdigit() else None, dest.name, progress) as bar:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        got = digest.hexdigest()
        if part.sha256 and got != part.sha256.lower():
            raise ChecksumError(f"{url}: sha256 {got} is not the published {part.sha256}; file discarded")
        if part.sha256_prefix and not got.startswith(part.sha256_prefix.lower()):
            raise ChecksumError(f"{url}: sha256 {got} does not start with {part.sha256_prefix}; file discarded")
        os.replace(tmp, dest)
        return got
    finally:
        tmp.unlink(missing_ok=True)


def _bar(total: int | None, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, file=sys.stderr)


def _safe_extract(zf: zipfile.ZipFile, into: Path) -> None:
    root = into.resolve()
    for info in zf.infolist():
        target = (into / info.filename).resolve()
        if target != root and root not in target.parents:
            raise ValueError(f"refusing zip entry outside the target folder: {info.filename}")
    zf.extractall(into)


def _install_part(part: Part, url: str, folder: Path, *, progress: bool) -> str:
    """Put one part in place below `folder` (the weight's own folder for trees)."""
    target = folder / part.path
    if part.unpack == "file":
        return _download(url, target, part, progress=progress)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=folder))
    try:
        archive = staging / "download.zip"
        got = _download(url, archive, part, progress=progress)
        unpacked = staging / "unpacked"
        with zipfile.ZipFile(archive) as zf:
            _safe_extract(zf, unpacked)
        if part.unpack == "zip":
            root = unpacked
            entries = list(unpacked.iterdir())
            firsts = {Path(c).parts[0] for c in part.checks()}
            if len(entries) == 1 and entries[0].is_dir() and entries[0].name not in firsts:
                root = entries[0]  # the archive wraps its files in one folder of its own
            for entry in root.iterdir():
                _replace(entry, folder / part.path / entry.name)
        else:  # zip-folder: one top folder, renamed to part.path
            tops = [e for e in unpacked.iterdir()]
            if len(tops) != 1 or not tops[0].is_dir():
                raise ValueError(f"{url}: expected one top folder in the archive, found {[t.name for t in tops]}")
            _replace(tops[0], target)
        return got
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():
        shutil.rmtree(dest)
    elif dest.exists():
        dest.unlink()
    os.replace(src, dest)


@dataclass(frozen=True)
class FetchResult:
    name: str
    path: Path
    sha256: tuple[str, ...]  # one digest per downloaded part
    skipped: bool = False  # already present


def fetch_weight(weight: Weight, *, mirror: str | None = None, force: bool = False, progress: bool = True) -> FetchResult:
    """Download `weight` into its first search path (atomic per file; checksums verified where published)."""
    found = weight.find()
    if found is not None and not force:
        return FetchResult(weight.name, found, (), skipped=True)
    if not weight.downloadable and not mirror:
        raise MissingWeightError(weight, weight.search_paths())
    dest = weight.search_paths()[0]
    digests = []
    if weight.tree:
        for part in weight.parts:
            if not force and dest.is_dir() and all(_matches(dest, pat) for pat in part.checks()):
                continue  # this part is already in place
            digests.append(_install_part(part, _part_url(part, mirror), dest, progress=progress))
        if not weight.complete(dest):
            absent = [pat for part in weight.parts for pat in part.checks() if not _matches(dest, pat)]
            raise ValueError(f"{weight.name}: downloads did not produce {', '.join(absent)} in {dest}")
    else:
        part = weight.parts[0]
        digests.append(_download(_part_url(part, mirror), dest, part, progress=progress))
    return FetchResult(weight.name, dest, tuple(digests))


def fetch(name: str, *, mirror: str | None = None, force: bool = False, progress: bool = True) -> FetchResult:
    """Download a registered weight by name (see `fetch_weight`)."""
    return fetch_weight(get(name), mirror=mirror, force=force, progress=progress)


# ----------------------------------------------------------------------------------------------- CLI


def status_rows() -> list[dict[str, str]]:
    rows = []
    for w in REGISTRY.values():
        found = w.find()
        rows.append({
            "name": w.name,
            "status": "present" if found else "missing",
            "path": str(found or w.search_paths()[0]),
            "used_by": w.used_by,
            "source": w.url or ("several downloads" if w.downloadable else "no public URL"),
        })
    return rows


def _cmd_status(args: argparse.Namespace) -> int:
    rows = status_rows()
    print(f"STYLEVAR_HOME = {home()}\nTORCH_HOME    = {torch_home()}\n")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['status']:<7}  {r['path']}\n{'':<{width}}  {'':<7}  used by: {r['used_by']}")
    n_missing = sum(r["status"] == "missing" for r in rows)
    print(f"\n{len(rows) - n_missing} present, {n_missing} missing; fetch with: stylevar weights fetch NAME|all")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    names = list(REGISTRY) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        print(f"error: unknown weight(s) {', '.join(unknown)}; registered: {', '.join(REGISTRY)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        weight = REGISTRY[name]
        if not weight.downloadable and not args.mirror:
            if weight.find() is None:
                print(f"{name}: skipped, no public URL ({weight.note})", file=sys.stderr)
            continue
        try:
            result = fetch_weight(weight, mirror=args.mirror, force=args.force, progress=not args.quiet)
        except (OSError, ValueError) as e:  # URLError is an OSError; ChecksumError a ValueError
            print(f"{name}: FAILED: {e}", file=sys.stderr)
            failed += 1
            continue
        if result.skipped:
            print(f"{name}: present at {result.path}")
        else:
            print(f"{name}: fetched to {result.path} (sha256 {', '.join(result.sha256)})")
    return 1 if failed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `stylevar weights status|fetch` (listed in stylevar.cli)."""
    sub = parser.add_subparsers(dest="weights_command", required=True)
    p_status = sub.add_parser("status", help="list every registered weight and whether it is present")
    p_status.set_defaults(func=_cmd_status)
    p_fetch = sub.add_parser("fetch", help="download weights (needs internet; checksums verified where published)")
    p_fetch.add_argument("names", nargs="+", metavar="NAME", help=f"'all' or any of: {', '.join(REGISTRY)}")
    p_fetch.add_argument("--mirror", default=os.environ.get("STYLEVAR_WEIGHTS_MIRROR"),
                         help="base URL serving the files under their own names (env STYLEVAR_WEIGHTS_MIRROR)")
    p_fetch.add_argument("--force", action="store_true", help="download again even if present")
    p_fetch.add_argument("--quiet", action="store_true", help="no progress bars")
    p_fetch.set_defaults(func=_cmd_fetch)

