"""Style measured by a pretrained network, and sharpness: what a blur cannot fake.

`style_cosine` and `style_gram_distance` compare two images through the teacher's `StylePredictor` (the `teacher`
extra); `sharpness(a, reference)` is the Laplacian energy over the reference's. Each gives a value per pair, (B,).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stylevar.loaders.teacher import EXTRA, REINSTALL, STYLE_SIZE, TeacherUnavailable, models_dir
from stylevar.metrics.vgg import gram_matrix, relative_gram_distance
from stylevar.processing.upsample import luminance
from stylevar.utils.extras import install_line

PREDICTOR_FILE = "arbitrary_predict.onnx"
GRAM_SIDES = (128, 64, 32, 16)  # feature-map sides (at a 256 px input) whose first Relu6 the Gram distance uses
MIN_SIDE = 32  # the network halves a side five times
_LAPLACIAN = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])


class StylePredictor(nn.Module):
    """`predictor(images_B3HW) -> (style vectors (B, 100), [features (B, C, s, s) for s in GRAM_SIDES])`.

    Magenta's ONNX graph run by torch node by node (another graph is refused): int8 weights dequantized once,
    activations fake-quantized with a straight-through gradient, so it matches onnxruntime and can be a loss."""

    OPS = ("QuantizeLinear", "DequantizeLinear", "Transpose", "Conv", "Clip", "Add", "GlobalAveragePool", "Reshape")

    def __init__(self) -> None:
        super().__init__()
        path = models_dir() / PREDICTOR_FILE
        try:
            import onnx
            from onnx import numpy_helper
        except ModuleNotFoundError as e:
            raise TeacherUnavailable(f"the pretrained style measures need {e.name}: {install_line(EXTRA)}") from None
        if not path.is_file():
            raise TeacherUnavailable(f"{PREDICTOR_FILE} not found in {path.parent}: reinstall the teacher ({REINSTALL})")
        graph = onnx.load(str(path)).graph
        unknown = sorted({n.op_type for n in graph.node} - set(self.OPS))
        if unknown:
            raise TeacherUnavailable(f"{path} is not the expected style predictor (operators {unknown})")
        consts = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer}
        self._input, self._output = graph.input[0].name, graph.output[0].name
        self._nodes = []
        for n in graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if n.op_type == "DequantizeLinear" and n.input[0] in consts:  # a weight: dequantized once
                consts[n.output[0]] = _dequantize(*(consts[i] for i in n.input), attrs.get("axis", 1))
                continue
            self._nodes.append((n.op_type, list(n.input), n.output[0], attrs))
        self._consts = consts
        relus = [out for op, _, out, _ in self._nodes if op == "Clip"]  # Relu6, in graph order
        self._layers = self._first_per_side(relus)
        self.requires_grad_(False)

    def _first_per_side(self, relus: list[str]) -> list[str]:
        """The first Relu6 output at each of GRAM_SIDES (at a 256 px input)."""
        values = self._run(torch.zeros(1, 3, STYLE_SIZE, STYLE_SIZE))
        first: dict[int, str] = {}
        for name in relus:
            first.setdefault(values[name].shape[-1], name)  # NCHW: the last axis is the side
        missing = [s for s in GRAM_SIDES if s not in first]
        if missing:
            raise TeacherUnavailable(f"{PREDICTOR_FILE} has no Relu6 output at {missing} px: not the expected network")
        return [first[s] for s in GRAM_SIDES]

    def _run(self, x_B3HW: torch.Tensor, until: str | None = None) -> dict[str, torch.Tensor]:
        """Every tensor of the graph by name, computed in order up to the node that writes `until` (default: all)."""
        values = {**self._consts, self._input: x_B3HW.permute(0, 2, 3, 1)}  # the graph takes NHWC
        for op, ins, out, attrs in self._nodes:
            values[out] = _OPS[op](*(values[i] for i in ins if i), **attrs)
            if out == until:
                break
        return values

    def features(self, img_B3HW: torch.Tensor) -> list[torch.Tensor]:
        """The Gram layers' features of images in [0, 1] at their own size, the rest of the network skipped."""
        if min(img_B3HW.shape[-2:]) < MIN_SIDE:
            raise ValueError(f"the style predictor's features need images of at least {MIN_SIDE} px a side, "
                             f"not {tuple(img_B3HW.shape[-2:])}")
        values = self._run(img_B3HW.float().clamp(0, 1), until=self._layers[-1])
        return [values[name] for name in self._layers]

    def forward(self, img_B3HW: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = img_B3HW.float().clamp(0, 1)
        if x.shape[-2:] != (STYLE_SIZE, STYLE_SIZE):
            x = F.interpolate(x, size=(STYLE_SIZE, STYLE_SIZE), mode="bicubic", align_corners=False).clamp(0, 1)
        values = self._run(x)
        return values[self._output].reshape(x.shape[0], -1), [values[name] for name in self._layers]


def _dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, axis: int = 1) -> torch.Tensor:
    if scale.ndim == 1 and q.ndim > 1:  # per channel along `axis`
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (q.float() - zero.float()) * scale.float()


def _fake_quantize(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """QuantizeLinear's integer levels as floats, with a straight-through gradient."""
    lo, hi = (-128, 127) if zero.dtype == torch.int8 else (0, 255)
    q = x / scale.float() + zero.float()
    return q + (q.round().clamp(lo, hi) - q).detach()


def _conv(x, w, b=None, *, strides=(1, 1), pads=(0, 0, 0, 0), group=1, dilations=(1, 1), **_):
    if pads[0] != pads[2] or pads[1] != pads[3]:
        x, pads = F.pad(x, (pads[1], pads[3], pads[0], pads[2])), (0, 0, 0, 0)
    return F.conv2d(x, w, b, tuple(strides), (pads[0], pads[1]), tuple(dilations), group)


_OPS = {
    "QuantizeLinear": lambda x, s, z, **_: _fake_quantize(x, s, z),
    "DequantizeLinear": lambda q, s, z, **_: (q - z.float()) * s.float(),
    "Transpose": lambda x, perm, **_: x.permute(*perm),
    "Conv": _conv,
    "Clip": lambda x, lo=None, hi=None, **a: x.clamp(a.get("min", lo), a.get("max", hi)),
    "Add": lambda a, b, **_: a + b,
    "GlobalAveragePool": lambda x, **_: x.mean((2, 3), keepdim=True),
    "Reshape": lambda x, shape, **_: _reshape(x, shape),
}


def _reshape(x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """ONNX Reshape (0 keeps that axis) with the exported batch of 1 read as the input's batch."""
    dims = [int(d) if d != 0 else x.shape[i] for i, d in enumerate(shape.tolist())]
    return x.reshape([x.shape[0], *dims[1:]])


@torch.no_grad()
def style_cosine(predictor: StylePredictor, a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(predictor(a_B3HW)[0], predictor(b_B3HW)[0], dim=1)


def gram_distance(feats_a: list[torch.Tensor], feats_b: list[torch.Tensor]) -> torch.Tensor:
    """Per pair, the mean over layers of ||G_a - G_b||_F / (||G_a||_F + ||G_b||_F)."""
    return relative_gram_distance([gram_matrix(f) for f in feats_a], [gram_matrix(f) for f in feats_b])


@torch.no_grad()
def style_gram_distance(predictor: StylePredictor, a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
    return gram_distance(predictor(a_B3HW)[1], predictor(b_B3HW)[1])


def compare(seen_a: tuple[torch.Tensor, list[torch.Tensor]], seen_b: tuple[torch.Tensor, list[torch.Tensor]]
            ) -> dict[str, torch.Tensor]:
    """The two pretrained measures from the predictor's outputs: {"cosine": (B,), "gram": (B,)}."""
    (vectors_a, feats_a), (vectors_b, feats_b) = seen_a, seen_b
    return {"cosine": F.cosine_similarity(vectors_a, vectors_b, dim=1), "gram": gram_distance(feats_a, feats_b)}


def laplacian_energy(img_B3HW: torch.Tensor) -> torch.Tensor:
    """(B,) the mean absolute Laplacian of the luminance (replicate-padded)."""
    y = luminance(img_B3HW.float().clamp(0, 1))  # (B, 1, H, W)
    k = _LAPLACIAN.to(y)[None, None]
    return F.conv2d(F.pad(y, (1, 1, 1, 1), mode="replicate"), k).abs().flatten(1).mean(1)


def sharpness(img_B3HW: torch.Tensor, reference_B3HW: torch.Tensor) -> torch.Tensor:
    """(B,) the image's Laplacian energy over the reference's (compare at the same size)."""
    return laplacian_energy(img_B3HW) / laplacian_energy(reference_B3HW).clamp_min(1e-8)
