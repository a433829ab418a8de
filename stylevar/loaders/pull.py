"""Published models into model directories: `stylevar pull` and the `--model` resolver (`resolve_model`).

A pulled hub id's checkpoints are converted into a model directory whose config.json records the repository,
revision, commit and each file's sha256. Imports neither torch nor huggingface_hub until needed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stylevar.loaders.hub import (DEFAULT_PRESET, SHAPE_FILE, VAE_FILE, HubFile, HubModel, Shape, check_cached,
                                  download_model, home, is_hub_id, optional_file, sha256_of)
from stylevar.loaders.model_dir import PipelineConfig, missing_model_files, write_model_dir


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
    """Download and convert `model`'s checkpoints into a model directory (default: `model.default_dir`), whole or
    absent; one already there is kept unless `force`; other processes (torchrun's ranks) wait on a lock."""
    dest = Path(out) if out is not None else model.default_dir(shape)
    if not force and _source_matches(dest, model, shape):
        return PullResult(dest, skipped=True)
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not _is_pulled(dest))):
        raise ValueError(f"{dest} exists and is not a folder written by `stylevar pull`; choose another --out")
    local_only = check_cached(model, shape)  # offline or unreachable: fail before any download or model work

    from filelock import FileLock
    locks = home() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(dest.resolve()).encode()).hexdigest()[:16]
    with FileLock(str(locks / f"pull-{key}.lock")):
        if not force and _source_matches(dest, model, shape):  # another process pulled it meanwhile
            return PullResult(dest, skipped=True)
        _pull_into(model, shape, dest, progress, local_only)
    return PullResult(dest, skipped=False)


def _repo_shape(model: HubModel, local_only: bool) -> dict[str, Any] | None:
    """The repository's `stylevar_config.json`, or None when it has none."""
    found = optional_file(HubFile(model.repo_id, SHAPE_FILE, model.revision), local_only=local_only)
    if found is None:
        return None
    try:
        return json.loads(found.read_text())
    except ValueError as e:
        raise ValueError(f"{model.repo_id}/{SHAPE_FILE} is not JSON ({e})") from None


def _source_file(name: str, path: Path, progress: bool) -> dict[str, Any]:
    """A downloaded file's sha256 and size, its blob name checked against the digest."""
    digest = sha256_of(path, progress=progress)
    blob = path.resolve().name
    if re.fullmatch(r"[0-9a-f]{64}", blob) and blob != digest:  # LFS blobs are named by their sha256
        raise ValueError(f"cached {name} is damaged: sha256 {digest} is not its blob name {blob}; "
                         f"delete {path.resolve()} and pull again")
    return {"sha256": digest, "size": path.stat().st_size}


def _pull_into(model: HubModel, shape: Shape, dest: Path, progress: bool, local_only: bool) -> None:
    paths = download_model(model, shape, progress=progress, local_only=local_only)
    repo_shape = _repo_shape(model, local_only) if shape.preset is None and shape.reference is None else None
    vq_cfg, tr_cfg = _configs(shape, repo_shape)

    from tqdm.auto import tqdm
    with tqdm(total=len(paths) + 3, desc=f"convert {model.id}", unit="step", file=sys.stderr,
              disable=not progress) as steps:
        files: dict[str, dict[str, Any]] = {}
        for name, path in paths.items():
            files[name] = _source_file(name, path, progress)
            steps.update()
        commit = paths[model.checkpoint].parent.name  # .../snapshots/<commit>/<file>
        source = {"repo": model.repo_id, "variant": model.variant, "revision": model.revision, "commit": commit,
                  "shape": shape.key, "files": files, "hub_id": model.id}
        if repo_shape is not None:
            source["shape_file"] = SHAPE_FILE

        from stylevar.utils.atomic import atomic_folder
        from stylevar.loaders.convert import load_stylevar, load_vqvae

        tokenizer = load_vqvae(paths[VAE_FILE], vq_cfg)
        steps.update()
        transformer = load_stylevar(paths[model.checkpoint], tr_cfg, tokenizer)
        steps.update()
        config = PipelineConfig(tokenizer.cfg, transformer.cfg, name=Path(model.checkpoint).stem,
                                extra={"source": source})
        with atomic_folder(dest, what="model directory") as staging:  # an older pull is replaced whole
            write_model_dir(transformer, config, staging, model_card=_model_card(model, source))
        steps.update()


def resolve_model(value: str | os.PathLike | None, *, progress: bool = True) -> Path | None:
    """The local model directory for a `--model` value: a hub id is pulled on first use and becomes its
    folder below STYLEVAR_HOME/models; a path is returned as it is; None (the demo model) stays None."""
    if value is None:
        return None
    if not is_hub_id(value):
        return Path(value)
    return pull(HubModel.parse(os.fspath(value)), progress=progress).path
