"""Checks of the files a user names on the command line, run before any model loads (no torch): each failure is
an `InputError` (a ValueError) whose one line names the path. Images are decoded as the service's uploads are.
"""
from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from stylevar.processing.images import ACCEPTED_FORMATS, Decoded, ImageError, decode_image, url_error
from stylevar.utils.errors import CodedError

# output file extensions: the formats the service returns (and accepts)
OUTPUT_EXTENSIONS: dict[str, str] = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}
# an input whose short side is below this carries little of the content or style: the command line says so
SMALL_SIDE = 16


class InputError(CodedError, ValueError):
    """A path or file given on the command line that cannot be used."""

    code = "invalid_input"


def read_image(path: str | os.PathLike, role: str) -> Decoded:
    """The ``role`` image at ``path`` as 8-bit RGB, decoded as the service decodes uploads."""
    p = input_file(path, f"{role} image")  # a web address, a missing file, a folder
    try:
        return decode_image(p, formats=ACCEPTED_FORMATS)
    except ImageError as e:  # its message names the file
        raise InputError(f"{role} image {e}") from e


def small_image_warning(img: Image.Image, role: str) -> str | None:
    """A warning line for an image too small to carry much (None if it is large enough)."""
    w, h = img.size
    if min(w, h) >= SMALL_SIDE:
        return None
    return (f"warning: the {role} image is only {w}x{h} pixels; it is scaled up to the model's size and "
            f"carries little {role} (use an image of at least {SMALL_SIDE}x{SMALL_SIDE})")


def output_image_path(path: str | os.PathLike) -> Path:
    """``path`` if an image can be written there in the format its extension names; else InputError."""
    p = Path(path)
    names = ", ".join(OUTPUT_EXTENSIONS)
    if p.is_dir():
        raise InputError(f"output {p} is a folder; give a file name such as {p / 'stylized.png'}")
    fmt = OUTPUT_EXTENSIONS.get(p.suffix.lower())
    if fmt is None:
        why = f": {p.suffix} is not an output image format" if p.suffix else " has no extension to tell its format"
        raise InputError(f"output {p}{why} (use {names})")
    Image.init()
    if fmt not in Image.SAVE:
        raise InputError(f"output {p}: this Pillow build cannot write {fmt} images (use {names})")
    output_folder(p.parent, "output folder")
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(f"output {p} exists and is not writable")
    return p


def input_file(path: str | os.PathLike, role: str) -> Path:
    """``path`` if it is an existing file; else InputError naming the ``role`` ("--vae checkpoint", ...)."""
    p = Path(path)
    if said := url_error(path, role):
        raise InputError(said)
    if not p.exists():
        raise InputError(f"{role} not found: {p}")
    if not p.is_file():
        raise InputError(f"{role} {p} is {'a folder, ' if p.is_dir() else ''}not a file")
    return p


def output_folder(path: str | os.PathLike, role: str = "output folder") -> Path:
    """``path`` if it is a folder, or can be made one (its nearest existing parent is a writable folder)."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise InputError(f"{role} {p} exists and is not a folder")
        _writable_folder(p, f"{role} {p}")
        return p
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{role} {p} cannot be made: {parent} is not a folder")
    _writable_folder(parent, f"{role} {p} cannot be made: {parent}")
    return p


def _writable_folder(folder: Path, what: str) -> None:
    if not folder.is_dir():
        raise InputError(f"{what} does not exist" if not folder.exists() else f"{what} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what} is not writable")
