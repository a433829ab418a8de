"""Registry and cache of every external weight the project uses: what each file is, where it is looked for, where
it comes from and how to check it. Nothing is downloaded implicitly: a missing file is a `MissingWeightError`
naming the paths searched and the command that fetches it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stylevar.loaders import hub
from stylevar.utils.atomic import atomic_write_path, replace_folder
from stylevar.loaders.hub import HubFile, home
from stylevar.utils.errors import CodedError

Location = Literal["torch", "stylevar", "hf"]
Unpack = Literal["file", "zip", "zip-folder"]

FETCH_COMMAND = "stylevar weights fetch {name}"


class MissingWeightError(CodedError, FileNotFoundError):
    """A registered weight is not on disk. The message names the file, the paths searched and the fix."""

    code = "missing_weight"

    def __init__(self, weight: "Weight", searched: list[Path], detail: str = ""):
        self.weight = weight
        self.searched = searched
        where = "\n".join(f"  - {p}" for p in searched)
        how = f"fetch it (needs internet) with:\n  {FETCH_COMMAND.format(name=weight.name)}"
        extra = f" ({detail})" if detail else ""
        super().__init__(f"missing weight {weight.name!r}: {weight.filename}{extra}\n"
                         f"looked for it at:\n{where}\n{how}\n"
                         f"(or place the file yourself at {weight.manual_path()}; "
                         f"STYLEVAR_HOME / TORCH_HOME / HF_HUB_CACHE move the caches)")


class ChecksumError(ValueError):
    """A downloaded file's sha256 is not the published one (the file is not kept)."""


class SourceUnreachableError(ConnectionError):
    """A weight's source cannot be reached: found by a short probe before any download starts."""


@dataclass(frozen=True)
class Part:
    """One download of a weight. `path` is relative to the weight's folder (or the file itself). `unpack`: `file`,
    `zip` (extracted into the folder, a lone wrapping folder unwrapped) or `zip-folder` (its one top folder renamed
    to `path`). `check`: glob patterns that must match once the part is in place (default: `path`)."""

    path: str
    url: str | None
    sha256: str | None = None  # full digest where the source publishes it
    sha256_prefix: str | None = None  # torchvision: leading hex digits of the sha256, in the file name
    unpack: Unpack = "file"
    check: tuple[str, ...] = ()
    hub: HubFile | None = None  # hosted on the Hugging Face Hub: fetched through huggingface_hub

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
        return all(p.url or p.hub for p in self.parts)

    @property
    def url(self) -> str | None:
        return self.parts[0].url if len(self.parts) == 1 else None

    @property
    def hub_file(self) -> HubFile | None:
        return self.parts[0].hub if self.location == "hf" else None

    @property
    def sha256(self) -> str | None:
        return self.parts[0].sha256 if len(self.parts) == 1 else None

    def search_paths(self) -> list[Path]:
        """Where the file (or folder) is looked for, in order; `fetch` writes to the first."""
        paths = []
        if self.location == "torch":
            paths.append(torch_hub_dir() / "checkpoints" / self.filename)
        elif self.location == "hf":
            f = self.parts[0].hub
            assert f is not None
            paths.append(hub.cached_path(f) or hub.cache_dir() / ("models--" + f.repo_id.replace("/", "--"))
                         / "snapshots" / f.revision / f.filename)
        paths.append(home() / self.filename)
        return paths

    def manual_path(self) -> Path:
        """Where a file placed by hand is found."""
        return self.search_paths()[-1 if self.location == "hf" else 0]

    def complete(self, path: Path) -> bool:
        return path.is_dir() and not self.absent(path) if self.tree else path.is_file()

    def absent(self, folder: Path) -> list[str]:
        """The check patterns no file in `folder` matches."""
        return [pat for part in self.parts for pat in part.checks() if not _matches(folder, pat)]

    def find(self) -> Path | None:
        for path in self.search_paths():
            if self.complete(path):
                return path
        return None


def _matches(folder: Path, pattern: str) -> bool:
    if any(ch in pattern for ch in "*?["):
        return any(folder.glob(pattern))
    return (folder / pattern).exists()


def torch_hub_dir() -> Path:
    """torch's hub folder, by torch itself (`torch.hub.get_dir()`: `$TORCH_HOME/hub` unless set_dir was called)."""
    import torch.hub
    return Path(torch.hub.get_dir())


def _torchvision(name: str, url: str, description: str, used_by: str) -> Weight:
    filename = Path(urllib.parse.urlparse(url).path).name
    prefix = filename.rsplit("-", 1)[-1].split(".", 1)[0]
    return Weight(name, filename, description, used_by, (Part(filename, url, sha256_prefix=prefix),), location="torch")


_DREAMSIM_ZIP = "https://github.com/ssundaram21/dreamsim/releases/download/v0.2.0-checkpoints/dreamsim_dino_vitb16_checkpoint.zip"
_DINO_REPO_ZIP = "https://github.com/facebookresearch/dino/zipball/main"
_DINO_BACKBONE = "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"
_VAR_REPO = "FoundationVision/var"
_ADAIN_RELEASE = "https://github.com/naoto0804/pytorch-AdaIN/releases/download/v0.0.0"
_CLIP_REPO = "timm/vit_base_patch32_clip_224.openai"

_NO_SHA = "the source publishes no sha256; `fetch` prints the digest it got"


def _on_hub(name: str, repo_id: str, filename: str, description: str, used_by: str, *, placed_as: str = "") -> Weight:
    """An entry hosted on the Hugging Face Hub (`placed_as`: its path below STYLEVAR_HOME when placed by hand)."""
    return Weight(name, placed_as or filename, description, used_by,
                  (Part(filename, None, hub=HubFile(repo_id, filename)),), location="hf",
                  note=f"on the Hugging Face Hub ({repo_id}); the cache records its sha256 as the blob name")


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
        _on_hub("clip", _CLIP_REPO, "open_clip_model.safetensors",
                "open_clip ViT-B-32, OpenAI weights (the file open_clip loads for pretrained='openai')",
                "CLIP similarity", placed_as="open_clip/ViT-B-32-openai/open_clip_model.safetensors"),
        Weight("adain_vgg", "vgg_normalised.pth", "AdaIN encoder: torch7-converted normalised VGG-19",
               "AdaIN baseline (adain)", (Part("vgg_normalised.pth", f"{_ADAIN_RELEASE}/vgg_normalised.pth"),),
               note=_NO_SHA),
        Weight("adain_decoder", "decoder.pth", "AdaIN decoder (trained with vgg_normalised.pth)",
               "AdaIN baseline (adain, adain-paper)", (Part("decoder.pth", f"{_ADAIN_RELEASE}/decoder.pth"),),
               note=_NO_SHA),
        _on_hub("var_vae", _VAR_REPO, hub.VAE_FILE, "VAR multi-scale VQ-VAE tokenizer", "official presets (d16..d30)"),
    ]
    for depth in (16, 20, 24, 30):
        entries.append(_on_hub(f"var_d{depth}", _VAR_REPO, f"var_d{depth}.pth",
                               f"class-conditional VAR d{depth} (ImageNet 256)", "StyleVAR SFT initialisation"))
    entries += [
        _on_hub("stylevar_sft", hub.DEFAULT_REPO, hub.VARIANTS["sft"], "StyleVAR d20 after SFT (reference format)",
                "stylevar convert (stylevar pull --variant sft does download and conversion)"),
        _on_hub("stylevar_grpo", hub.DEFAULT_REPO, hub.VARIANTS["grpo"],
                "StyleVAR d20 after GRPO, LoRA merged (reference format)",
                "stylevar convert (stylevar pull does download and conversion)"),
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
            detail = f"{partial[0]} is incomplete, it lacks: {', '.join(weight.absent(partial[0]))}"
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


def _part_url(part: Part, mirror: str | None) -> str:
    if mirror:
        return mirror.rstrip("/") + "/" + part.mirror_name
    if part.url is None:
        raise ValueError(f"{part.path}: no download URL (pass a mirror, or place the file yourself)")
    return part.url


def _download(url: str, dest: Path, part: Part, *, progress: bool) -> str:
    """`url` to `dest` (torch's downloader), its sha256 returned; a failed download leaves nothing behind."""
    import torch.hub
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected = (part.sha256 or part.sha256_prefix or "").lower() or None
    try:
        torch.hub.download_url_to_file(url, str(dest), hash_prefix=expected, progress=progress)
    except urllib.error.URLError as e:  # an HTTP error, or the connection lost after the probe: said with the URL
        why = f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError) else str(e.reason)
        raise OSError(f"cannot download {url}: {why}") from e
    except RuntimeError as e:
        if "invalid hash value" not in str(e):
            raise OSError(f"{url}: {e}") from e
        what = "is not the published" if part.sha256 else "does not start with"
        raise ChecksumError(f"{url}: the sha256 {what} {expected} ({e}); file discarded") from None
    return hub.sha256_of(dest, progress=False)


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
    """Move a complete unpacked entry (a folder or a file, on the same filesystem) atomically over ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        if dest.exists() and not dest.is_dir():
            dest.unlink()
        replace_folder(src, dest)
        return
    if dest.is_dir():
        shutil.rmtree(dest)
    atomic_write_path(dest, lambda tmp: os.replace(src, tmp))  # fsynced, then renamed over dest


def _from_hub(weight: Weight, hub_file: HubFile, *, progress: bool) -> Path:
    """The file through huggingface_hub, or from its cache alone when the Hub cannot be asked."""
    why = hub.local_only()
    if why and hub.cached_path(hub_file) is None:
        raise _unreachable(weight, hub_file.filename, hub_file.url, why, weight.manual_path())
    path = hub.download(hub_file, progress=progress, local_only=bool(why))
    assert path is not None
    return path


def check_reachable(weight: Weight, mirror: str | None = None) -> None:
    """SourceUnreachableError when a URL `fetch_weight` would download from cannot be reached."""
    probed: dict[str, str] = {}
    for part in weight.parts:
        url = _part_url(part, mirror)
        host = urllib.parse.urlsplit(url).netloc
        if host not in probed:
            probed[host] = hub.unreachable(url=url)
        if probed[host]:
            where = weight.manual_path() / part.path if weight.tree else weight.manual_path()
            raise _unreachable(weight, part.mirror_name, url, probed[host], where, unpacked=part.unpack != "file")


def _unreachable(weight: Weight, filename: str, url: str, why: str, where: Path, *,
                 unpacked: bool = False) -> SourceUnreachableError:
    put = f"unpack it into {where}" if unpacked else f"put it at {where}"
    return SourceUnreachableError(
        f"cannot download {filename}: {why}\n"
        f"  its URL: {url}\n"
        f"  to fetch it by hand, download that URL where there is internet and {put}; or fetch from a mirror "
        f"that serves it (--mirror URL, STYLEVAR_WEIGHTS_MIRROR)")


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
    if weight.hub_file is not None and not mirror:  # huggingface_hub and its cache (a Hub mirror: HF_ENDPOINT)
        path = _from_hub(weight, weight.hub_file, progress=progress)
        return FetchResult(weight.name, path, (hub.sha256_of(path, progress=progress),))
    check_reachable(weight, mirror)  # offline: one error within about a second, not a download's wait
    dest = weight.manual_path()  # from a plain URL or --mirror: torch's folder, else STYLEVAR_HOME
    digests = []
    if weight.tree:
        for part in weight.parts:
            if not force and dest.is_dir() and all(_matches(dest, pat) for pat in part.checks()):
                continue  # this part is already in place
            digests.append(_install_part(part, _part_url(part, mirror), dest, progress=progress))
        if not weight.complete(dest):
            raise ValueError(f"{weight.name}: downloads did not produce {', '.join(weight.absent(dest))} in {dest}")
    else:
        part = weight.parts[0]
        digests.append(_download(_part_url(part, mirror), dest, part, progress=progress))
    return FetchResult(weight.name, dest, tuple(digests))


def fetch(name: str, *, mirror: str | None = None, force: bool = False, progress: bool = True) -> FetchResult:
    return fetch_weight(get(name), mirror=mirror, force=force, progress=progress)
