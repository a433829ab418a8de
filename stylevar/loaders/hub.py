"""Files on the Hugging Face Hub: hub ids (`hf:OWNER/NAME[@REVISION][:VARIANT]`), the cache, downloads through
`huggingface_hub`, and the project's cache root (`home()`). `check_cached` decides once whether the Hub may be
asked; if not, missing files are one `HubError` naming them. Imports neither torch nor huggingface_hub until needed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stylevar.utils.errors import CodedError

PREFIX = "hf:"
DEFAULT_REPO = "Senfier-LiqiJing/StyleVAR"
VAE_FILE = "vae_ch160v4096z32.pth"
VARIANTS = {"grpo": "StyleVAR-GRPO.pth", "sft": "StyleVAR_SFT.pth"}
DEFAULT_VARIANT = "grpo"
ID_FORM = f"{PREFIX}OWNER/NAME[@REVISION][:{'|'.join(VARIANTS)}]"  # how a hub id is written, for help texts
DEFAULT_PRESET = "d20"
SHAPE_FILE = "stylevar_config.json"  # optional, in the repository: the reference config fields of its weights
DEFAULT_REVISION = "main"
CONNECT_TIMEOUT_S = 1.0  # how long `unreachable` waits for the endpoint to accept a connection
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # huggingface_hub's offline switches

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def home() -> Path:
    """The project's cache root, `$STYLEVAR_HOME` (default `~/.cache/stylevar`, read on each call)."""
    env = os.environ.get("STYLEVAR_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stylevar"


class HubError(CodedError, FileNotFoundError):
    """A hub model or file that cannot be had: not cached while offline, not on the Hub, no access. Code
    ``hub_unreachable`` when the Hub could not be asked (offline, no connection), ``hub_unavailable`` otherwise."""

    code = "hub_unavailable"


@dataclass(frozen=True)
class HubFile:
    """One file of a Hub repository at a revision."""

    repo_id: str
    filename: str
    revision: str = DEFAULT_REVISION

    @property
    def url(self) -> str:
        """Where huggingface_hub downloads it from (its endpoint: `HF_ENDPOINT`)."""
        from huggingface_hub import hf_hub_url
        return hf_hub_url(self.repo_id, self.filename, revision=self.revision)


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
                raise ValueError(f"{text!r} is not a hub id ({ID_FORM})")
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
        name = self.variant
        if self.revision != DEFAULT_REVISION:
            name += "@" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.revision)
        if shape.tag:
            name += "-" + shape.tag
        return home() / "models" / self.repo_id.replace("/", "--") / name


def is_hub_id(value: object) -> bool:
    return isinstance(value, (str, os.PathLike)) and os.fspath(value).startswith(PREFIX)


def looks_like_repo_id(value: str | os.PathLike) -> bool:
    """``OWNER/NAME`` (a Hub repository written without ``hf:``), optionally with ``@REVISION`` / ``:VARIANT``."""
    return bool(_REPO_RE.match(re.split(r"[@:]", os.fspath(value), maxsplit=1)[0]))


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


def cache_dir() -> Path:  # asks huggingface_hub, which reads its variables once, when first imported
    """huggingface_hub's cache folder (HF_HUB_CACHE, else HF_HOME/hub, else its default)."""
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """huggingface_hub's offline switch (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    from huggingface_hub import is_offline_mode
    return is_offline_mode()


def _offline_variable() -> str:
    """The offline switch that is set (for the message), HF_HUB_OFFLINE when huggingface_hub found another way."""
    truthy = ("1", "ON", "YES", "TRUE")
    return next((v for v in OFFLINE_VARIABLES if os.environ.get(v, "").upper() in truthy), OFFLINE_VARIABLES[0])


def _why_local() -> str:
    """Why a download could not ask the Hub: the offline switch, or no connection."""
    return f"downloads are off ({_offline_variable()}=1)" if offline() else "the Hub cannot be reached"


def unreachable(timeout_s: float = CONNECT_TIMEOUT_S, url: str | None = None) -> str:
    """Why ``url`` (default: the Hub's endpoint) cannot be asked; "" when it connects within ``timeout_s``."""
    if url is None:
        from huggingface_hub import constants

        endpoint, what = constants.ENDPOINT, "the Hub ({})"
    else:
        host = urllib.parse.urlsplit(url)
        endpoint, what = f"{host.scheme}://{host.netloc}", "{}"
    parts = urllib.parse.urlsplit(endpoint)
    proxy = None if urllib.request.proxy_bypass(parts.hostname or "") else urllib.request.getproxies().get(parts.scheme)
    target = urllib.parse.urlsplit(proxy) if proxy else parts
    address = (target.hostname or "", target.port or (443 if target.scheme == "https" else 80))
    failure: list[str] = ["no answer"]

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout_s).close()
            failure.clear()
        except OSError as e:
            failure[0] = str(e) or type(e).__name__

    probe = threading.Thread(target=connect, daemon=True)  # a hanging name lookup cannot hold the caller
    probe.start()
    probe.join(timeout_s)
    if not failure:
        return ""
    via = f" through the proxy {target.hostname}:{address[1]}" if proxy else ""
    return f"{what.format(endpoint + via)} cannot be reached: {failure[0]} within {timeout_s:g} s"


def local_only() -> str:
    """Why downloads from the Hub cannot be asked for now ("" when they can)."""
    return _why_local() if offline() else unreachable()


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


def _unavailable(what: str, repo_id: str, revision: str, files: list[str], why: str, fix: str,
                 code: str = HubError.code) -> HubError:
    return HubError(
        f"{what}: {why}\n"
        f"  repository {repo_id} (revision {revision}), files: {', '.join(files)}\n"
        f"  Hugging Face cache: {cache_dir()}\n"
        f"{fix}", code=code)


def _not_cached(model: HubModel, shape: Shape | None, why: str) -> HubError:
    """The one error for a model whose files are not all cached while the Hub cannot be asked."""
    absent = [f.filename for f in model.files() if cached_path(f) is None]
    instead = (f", or unset {_offline_variable()}" if offline() else
               ", or set HF_ENDPOINT to a mirror of the Hub that this machine reaches")
    return _unavailable(
        model.id, model.repo_id, model.revision, absent, f"not in the Hugging Face cache, and {why}",
        f"fetch it on a machine with internet access with:\n  {pull_command(model, shape)}\n"
        f"then copy the Hugging Face cache (or the model folder it writes) here{instead}", code="hub_unreachable")


def check_cached(model: HubModel, shape: Shape | None = None) -> bool:
    """Whether `model`'s files must come from the cache alone; then one `HubError` naming every file it lacks."""
    why = local_only()
    if not why:
        return False
    if any(cached_path(f) is None for f in model.files()):
        raise _not_cached(model, shape, why)
    return True


def download_model(model: HubModel, shape: Shape | None = None, *, progress: bool = True,
                   local_only: bool = False) -> dict[str, Path]:
    """Every file of `model` (`download`); a failure names every file the cache lacks (`_not_cached`)."""
    paths = {}
    for f in model.files():
        try:
            found = download(f, progress=progress, local_only=local_only)
        except HubError as e:
            if e.code != "hub_unreachable":
                raise
            raise _not_cached(model, shape, _why_local()) from None
        assert found is not None
        paths[f.filename] = found
    return paths


def download(f: HubFile, *, progress: bool = True, missing_ok: bool = False, local_only: bool = False) -> Path | None:
    """The file through huggingface_hub; `HubError` if it cannot be had. With `missing_ok`, None when the
    repository (or, offline, the cache) has no such file; with `local_only`, from the cache alone."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub import errors as hf_errors
    is_offline = offline() or local_only
    code = HubError.code
    try:
        return Path(hf_hub_download(f.repo_id, f.filename, revision=f.revision, cache_dir=cache_dir(),
                                    local_files_only=is_offline, tqdm_class=None if progress else _silent_bar()))
    except hf_errors.LocalEntryNotFoundError:
        if missing_ok:  # not cached, and the Hub cannot be asked: treated as absent
            return None
        why = f"not in the Hugging Face cache, and {_why_local()}"
        fix = "fetch it on a machine with internet access" + (f", or unset {_offline_variable()}" if offline() else "")
        code = "hub_unreachable"
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
    raise _unavailable(f.filename, f.repo_id, f.revision, [f.filename], why, fix, code)


def _silent_bar():
    from tqdm.auto import tqdm

    class Silent(tqdm):  # huggingface_hub's progress bar, switched off for this call only
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


def optional_file(f: HubFile, *, local_only: bool = False) -> Path | None:
    """An optional file of the repository: its path, or None when the repository (or the cache) has none."""
    found = cached_path(f)
    if found is not None or _cached_absent(f):
        return found
    return download(f, progress=False, missing_ok=True, local_only=local_only)


def sha256_of(path: Path, *, progress: bool = True) -> str:
    from tqdm.auto import tqdm
    digest = hashlib.sha256()
    with open(path, "rb") as fh, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, file=sys.stderr,
                                      desc=f"sha256 {path.name}", disable=not progress, leave=False) as bar:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()
