"""StylePipeline: a model directory (`stylevar.loaders.model_dir`) or hub id in, PIL images in and out.

The pipeline composes the tokenizer and the transformer with the rest of config.json (`PipelineConfig`): it
resolves a `StylizeRequest`, draws it, and finishes the output (refine, palette, upsample). Video:
`stylize_frames` (frames in, frames out, coherent across them) and `stylize_video` (a file in, an mp4 out).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from stylevar.pipelines.coherence import (DEFAULT_TEMPORAL, Coherence, FrameSampler, TemporalMode, coherence_of,
                                          shift_grid)
from stylevar.config import GenerationConfig, StyleVARConfig, VQVAEConfig, presets
from stylevar.utils.precision import resolve_autocast_dtype
from stylevar.utils.devices import resolve_device
from stylevar.utils.heap import apply_heap_policy
from stylevar.utils.threads import apply_threads
from stylevar.pipelines.conditions import ConditionCache, cached_condition
from stylevar.pipelines.options import PYTHON, offered
from stylevar.pipelines.request import IMAGE_ONLY, StyleMix, Stylization, StylizeRequest
from stylevar.processing.images import (Fit, Picture, ResizeMode, as_image, fit_of, fit_square, pil_to_tensor,
                                        tensor_to_pil, to_rgb)
from stylevar.processing.postprocess import MAX_SEED, OutputOptions, UpsampleMode, finish, sample_seeds
from stylevar.utils.errors import unknown_name
from stylevar.loaders.model_dir import DEMO_MODEL_DIR, PipelineConfig, check_model_dir, write_model_dir
from stylevar.processing.palette import match_palette
from stylevar.loaders.pull import resolve_model
from stylevar.processing.refine import refine
from stylevar.processing.upsample import Upsampling, luminance, upscale
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import Condition, StyleBlend, StyleVAR
from stylevar.processing.video import VideoInfo, VideoLimits, VideoWriter, probe, read_frames

ProgressFn = Callable[[int, "int | None"], None]  # (frames done, frames in all when the header says)
CONDITION_CACHE_BYTES = 64 * 2**20  # a pipeline's own cache of reference images' conditions (`StylePipeline.conditions`)


@dataclass(frozen=True)
class VideoResult:
    """What `StylePipeline.stylize_video` wrote."""

    path: Path
    frames: int
    fps: Fraction
    duration_s: float  # from the first frame's start to the last one's end, in the source's timing
    size: tuple[int, int]  # (w, h) of the frames (the mp4 drops an odd last row / column)
    audio: bool  # the source's audio was copied
    seconds: float  # wall-clock time of the whole call


@dataclass(frozen=True)
class Drawings:
    """What the model drew for a batch, at its own resolution, before the result's size is reached."""

    images: torch.Tensor  # (B, 3, S, S) in [0, 1]
    seen: torch.Tensor  # (B, 3, S, S) in [0, 1]: the contents as the model saw them
    fits: list[Fit]  # how each content was fitted into the square


class StylePipeline:
    """``conditions``: the cache of what each reference image contributes (`stylevar.pipelines.conditions`; default
    `CONDITION_CACHE_BYTES`, ``ConditionCache(0)`` keeps nothing across calls): a style repeated across calls or rows
    is encoded once."""

    def __init__(self, model: StyleVAR, config: PipelineConfig, conditions: ConditionCache | None = None):
        self.model = model.eval()
        self.config = config
        self.conditions = conditions if conditions is not None else ConditionCache(CONDITION_CACHE_BYTES)

    def uncached(self) -> "StylePipeline":
        """This model and its settings without a condition cache: each call computes every picture's conditions."""
        return type(self)(self.model, self.config, ConditionCache(0))

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_models(cls, model: StyleVAR, **config_kwargs) -> "StylePipeline":
        return cls(model, PipelineConfig(model.tokenizer.cfg, model.cfg, **config_kwargs))

    @classmethod
    def random(cls, preset: str | tuple[VQVAEConfig, StyleVARConfig] = "tiny", seed: int = 0,
               name: str = "random-init") -> "StylePipeline":
        """An untrained pipeline (for tests and benchmarks)."""
        vq_cfg, tr_cfg = presets(preset) if isinstance(preset, str) else preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = StyleVAR(tr_cfg, MultiScaleVQVAE(vq_cfg))
        return cls.from_models(model, name=name)

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike | None = None, device: str | torch.device | None = None,
                        autocast_dtype: torch.dtype | str | None = "auto",
                        threads: int | str | None = None) -> "StylePipeline":
        """Load a model directory (default: the embedded demo model), or a hub id
        ``hf:OWNER/NAME[@REVISION][:grpo|sft]`` (pulled on first use). ``autocast_dtype``: "auto" = bf16 on CUDA
        and none on the CPU; None = float32 everywhere; or a dtype or its name ("bf16", "float16", ...).
        ``threads``: torch's CPU threads, a count, "torch" (left as it is) or None (`stylevar.utils.threads`
        decides at the process's first load, as `stylevar.utils.heap` decides the heap's policy)."""
        apply_threads(threads)
        apply_heap_policy()
        d = resolve_model(model_dir) if model_dir is not None else DEMO_MODEL_DIR
        config = check_model_dir(d)
        model = StyleVAR.from_pretrained(d)
        device = resolve_device(None if device is None else str(device))  # one asked for and missing: DeviceError
        model.to(device)
        model.autocast_dtype = resolve_autocast_dtype(autocast_dtype, device)
        return cls(model, config)

    def save_pretrained(self, model_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                        model_card: str | None = None) -> Path:
        """Write the model directory (`write_model_dir`): the models' files, config.json, the model card when given."""
        return write_model_dir(self.model, self.config, model_dir, dtype, model_card)

    # ---- properties ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.pos_1LC.device

    @property
    def image_size(self) -> int:
        return self.config.tokenizer.image_size

    def summary(self) -> str:
        """What is loaded, in one line: ``NAME: 64 px, 6 scales, 9.12 M parameters (transformer with its image
        encoders 5.88 M: what training.sft trains; tokenizer 3.24 M)``. Counted on the model's parameters:
        call it before `stylevar.runtime.inference.prepare`, whose packed layers hold their weights as buffers."""
        total = sum(p.numel() for p in self.model.parameters())
        tok = sum(p.numel() for p in self.model.tokenizer.parameters())
        scales = len(self.config.transformer.patch_nums)
        return (f"{self.config.label}: {self.image_size} px, {scales} scales, {total / 1e6:.2f} M parameters "
                f"(transformer with its image encoders {(total - tok) / 1e6:.2f} M: what training.sft trains; "
                f"tokenizer {tok / 1e6:.2f} M)")

    def to(self, device: str | torch.device) -> "StylePipeline":
        self.model.to(resolve_device(str(device)))
        return self

    # ---- images -------------------------------------------------------------------------------
    def preprocess(self, images: Sequence[Image.Image], resize: ResizeMode = "stretch"
                   ) -> tuple[torch.Tensor, list[Fit]]:
        """PIL images -> (B, 3, S, S) in [-1, 1] on the model's device, how each was fitted (a repeat resized once)."""
        done: dict[int, tuple[torch.Tensor, Fit]] = {}
        for im in images:
            if id(im) not in done:
                sq, fit = fit_square(to_rgb(im), self.image_size, resize)
                done[id(im)] = (pil_to_tensor(sq), fit)
        x = torch.stack([done[id(im)][0] for im in images]).to(self.device)
        return x.mul(2).sub(1), [done[id(im)][1] for im in images]

    def mask_tensor(self, mask: Image.Image, content: Image.Image, resize: ResizeMode = "stretch") -> torch.Tensor:
        """A style mask (any mode or size) -> (S, S) in [0, 1]: resized to the content's size, then fitted as it is."""
        gray = mask.convert("L")
        if gray.size != content.size:
            gray = gray.resize(content.size, Image.BILINEAR)
        sq, _ = fit_square(gray.convert("RGB"), self.image_size, resize)
        return pil_to_tensor(sq)[0]

    def style_input(self, contents: Sequence[Image.Image], mixes: Sequence[StyleMix], resize: ResizeMode
                    ) -> torch.Tensor | StyleBlend:
        """The model's style input for a batch: one image tensor when every row is one style without a mask
        (the published computation), else a `StyleBlend`. Every row must have as many styles of weight > 0."""
        mixes = [m.active() for m in mixes]
        counts = {len(m.images) for m in mixes}
        if len(counts) != 1:
            raise ValueError(f"rows of one batch need as many styles each, got {sorted(counts)}")
        if all(m.plain for m in mixes):
            return self.preprocess([m.images[0] for m in mixes], "crop")[0]
        (S,) = counts
        styles = [self.preprocess([m.images[s] for m in mixes], "crop")[0] for s in range(S)]
        weights = torch.tensor([m.weights or (1.0,) * S for m in mixes], dtype=torch.float32, device=self.device)
        masks = None
        if any(m.masks is not None for m in mixes):
            ones = torch.ones(self.image_size, self.image_size)
            masks = torch.stack([
                torch.stack([ones if m.masks is None else self.mask_tensor(m.masks[s], c, resize) for s in range(S)])
                for m, c in zip(mixes, contents)]).to(self.device)
        return StyleBlend(styles, weights, masks)

    def stylize_batch(self, contents: Sequence[Picture], styles: Sequence[Picture | StyleMix], *,
                      max_side: int | None = None, upsample: UpsampleMode | None = None,
                      **draw_kwargs) -> list[Image.Image]:
        """One `generate` call for a batch (`draw`); each result has its content's aspect ratio (see `unfit`),
        its long side at most ``max_side``. ``upsample``: how the drawing reaches the result's size
        (`stylevar.processing.upsample`; None: the model's setting). Pictures may be paths (`as_image`)."""
        contents = [as_image(c, f"content {i + 1}") for i, c in enumerate(contents)]
        styles = [s if isinstance(s, StyleMix) else as_image(s, f"style {i + 1}") for i, s in enumerate(styles)]
        drawn = self.draw(contents, styles, **draw_kwargs)
        return self.upscaled(drawn, contents, [max_side] * len(contents), upsample)

    def upscaled(self, drawn: Drawings, contents: Sequence[Image.Image], max_sides: Sequence[int | None],
                 upsample: UpsampleMode | None = None) -> list[Image.Image]:
        """Each drawing at its content's aspect ratio (`unfit`), its long side at most its ``max_sides`` entry,
        upsampled from its content (``upsample``: the mode; None: the model's)."""
        up = self.upsampling(upsample)
        return [upscale(img, seen, fit, c, side, up)
                for img, seen, fit, c, side in zip(drawn.images, drawn.seen, drawn.fits, contents, max_sides)]

    def draw(self, contents: Sequence[Image.Image], styles: Sequence[Image.Image | StyleMix], *,
             seeds: Sequence[int] | int | Callable | None = None, resize: ResizeMode = "stretch",
             on_scale: Callable[[int, torch.Tensor], None] | None = None,
             condition: Callable[[torch.Tensor, torch.Tensor | StyleBlend, bool], Condition] | None = None,
             generation: GenerationConfig | None = None, **gen_kwargs) -> Drawings:
        """The model's drawings at its own resolution (one `generate` call, then palette and refinement).

        A row's style is one image or a `StyleMix`. ``generation``: the resolved settings, else ``gen_kwargs``
        over the model's. ``condition`` (content, style inputs, unstyled -> `Condition`) replaces `condition`."""
        if len(contents) != len(styles):
            raise ValueError(f"{len(contents)} content images but {len(styles)} style images")
        if generation is not None and gen_kwargs:
            raise TypeError(f"give the generation settings or {', '.join(gen_kwargs)}, not both")
        gen = generation if generation is not None else self.generation_config(**gen_kwargs)
        content, fits = self.preprocess(contents, resize)
        style = self.style_input(contents, [StyleMix.of(s) for s in styles], resize)
        cond = (condition or self.condition)(content, style, gen.guidance > 0)
        out = self.model.generate(content, style, gen, seed=seeds, on_scale=on_scale, cond=cond)
        out = match_palette(out, style, self.config.palette)  # (B, 3, S, S) in [0, 1]
        seen = content.add(1).mul(0.5)  # (B, 3, S, S) in [0, 1]
        if self.config.refine.enabled:  # guided by the content
            out = refine(out, seen, self.config.refine)
        return Drawings(out, seen, fits)

    def condition(self, content_B3HW: torch.Tensor, style: torch.Tensor | StyleBlend, unstyled: bool = False,
                  scopes: Sequence[str] | None = None) -> Condition:
        """`StyleVAR.condition` through `conditions`: each distinct image of the batch computed once, or found from
        an earlier call (in its row's ``scopes`` entry); the cache is emptied when the model has changed."""
        self.conditions.follow(self.model)
        return cached_condition(self.model, self.conditions, content_B3HW, style, unstyled, scopes)

    def upsampling(self, mode: UpsampleMode | None = None) -> Upsampling:
        """The model's upsampling settings with the caller's mode (None: the model's)."""
        return self.config.upsample if mode is None else dataclasses.replace(self.config.upsample, mode=mode)

    def generation_config(self, **gen_kwargs) -> GenerationConfig:
        """A batch call's settings: the caller's (None = unset) over the model's recommended ones over the defaults."""
        return GenerationConfig.resolve(self.config.generation, **gen_kwargs)

    # ---- one request ----------------------------------------------------------------------------
    @staticmethod
    def request(caller: str, options: dict[str, Any], without: tuple[str, ...] = ()) -> StylizeRequest:
        """The Python call's options as a `StylizeRequest` (the fields but ``format``, and ``without``): an unknown
        name is a TypeError, a refused value a `stylevar.pipelines.request.RequestError` (a ValueError)."""
        known = {opt.name for opt in offered(PYTHON)} - set(without)
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"{caller}(): " + "; ".join(unknown_name("keyword argument", k, known) for k in unknown))
        return StylizeRequest.of(**options)

    def prepare(self, request: StylizeRequest, content: Image.Image | None,
                style: Image.Image | Sequence[Image.Image] | StyleMix, style_masks: Sequence[Image.Image] | None = None,
                max_side: int | None = None, random_seed: Callable[[], int] | None = None) -> Stylization:
        """``request`` resolved for ``content``: the seeds (``seed .. seed + num_samples - 1``; without a seed the
        first is ``random_seed()``, else drawn from torch's global generator), the style mix (weighted by
        ``style_weights``, confined to ``style_masks``) and the generation settings over the model's, once.
        ``content`` None: a clip's (`stylize_frames`; each frame is the content of its row)."""
        seed = request.seed if request.seed is not None or random_seed is None else random_seed()
        mix = StyleMix.of(style, request.style_weights, style_masks).active()
        return Stylization(request, content, mix, request.generation(self.config.generation),
                           tuple(sample_seeds(seed, request.num_samples)),
                           OutputOptions(max_side=max_side, preserve_color=request.preserve_color))

    def run(self, items: Sequence[Stylization], *, on_scale: Callable[[int, torch.Tensor], None] | None = None,
            condition: Callable[[torch.Tensor, torch.Tensor | StyleBlend, bool], Condition] | None = None
            ) -> list[list[Image.Image]]:
        """Stylizations of one `BatchKey` in one `generate` call: each one's images, one per seed, at its size
        (`unfit`), upsampled as its request says, its colours kept when it asks."""
        key = items[0].key
        if any(item.key != key for item in items[1:]):
            raise ValueError("stylizations of one run need equal batch keys")
        rows = [item for item in items for _ in item.seeds]
        drawn = self.draw([r.content for r in rows], [r.style for r in rows], seeds=[s for i in items for s in i.seeds],
                          resize=key.resize, on_scale=on_scale, condition=condition, generation=key.generation)
        images = self.upscaled(drawn, [r.content for r in rows], [r.output.max_side for r in rows], key.upsample)
        out, start = [], 0
        for item in items:
            out.append(finish(images[start:start + len(item.seeds)], item.content, item.output))
            start += len(item.seeds)
        return out

    def __call__(self, content: Picture, style: Picture | Sequence[Picture] | StyleMix, *,
                 style_masks: Sequence[Picture] | None = None, max_side: int | None = None,
                 **options: Any) -> Image.Image | list[Image.Image]:
        """Re-draw ``content`` in the style of ``style``, as ``POST /stylize`` does.

        ``options``: the fields of `stylevar.pipelines.request.StylizeRequest` but ``format`` (their help is there);
        left out or None: the model's ``style_strength``, ``top_k``, ``top_p``, ``alphas``, ``guidance`` and
        ``upsample``, a random ``seed`` (torch's global generator), equal ``style_weights``. ``style``: one image, or
        a list blended by ``style_weights``, each confined to its ``style_masks`` image when given (grayscale, white
        = apply; see `StyleMix`). ``num_samples`` left out returns one image, ``n`` a list of n (seeds ``seed ..
        seed+n-1``, one model call). ``max_side``: long side of the result (None: the content's size). Every picture
        may be a PIL image or the path of one (`stylevar.processing.images.as_image`).
        """
        request = self.request("StylePipeline", options, without=("format",))
        content = as_image(content, "content")
        images = self.run([self.prepare(request, content, style, style_masks, max_side)])[0]
        return images if "num_samples" in request.model_fields_set else images[0]

    # ---- video --------------------------------------------------------------------------------
    def stylize_frames(self, frames: Iterable[Image.Image], style: Image.Image | Sequence[Image.Image] | StyleMix, *,
                       temporal: TemporalMode | Coherence = DEFAULT_TEMPORAL, batch_size: int = 4,
                       style_masks: Sequence[Image.Image] | None = None, max_side: int | None = None,
                       request: StylizeRequest | None = None, **options: Any) -> Iterator[Image.Image]:
        """Re-draw a clip's frames (consumed ``batch_size`` at a time, in order) in the style of ``style``; each
        result's ``info`` keeps its frame's ``time_s`` and ``index``. ``options``: `__call__`'s but ``num_samples`` (or
        a `StylizeRequest` built already as ``request``). ``temporal`` (`stylevar.pipelines.coherence`): ``independent``
        (frame i: seed + i), ``same-seed`` (every frame the seed), ``coherent`` (the draws follow the content's motion,
        on a canvas that moves with it), ``coherent-reuse`` (and all but the finest scale's tokens kept where the
        content did not change), or a `stylevar.pipelines.coherence.Coherence`."""
        if request is None:
            request = self.request("stylize_frames", options, without=IMAGE_ONLY)
        elif options:
            raise TypeError(f"give the request or {', '.join(options)}, not both")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        clip = self.prepare(request, None, style, style_masks, max_side)  # each frame is its own content
        seed, output, mix, generation = clip.seeds[0], clip.output, clip.mix, clip.generation
        cfg = coherence_of(temporal)
        sampler = None if cfg is None else FrameSampler(seed, cfg, self.config.transformer.patch_nums, self.image_size)
        done, it = 0, iter(frames)
        while batch := list(itertools.islice(it, batch_size)):
            seeds = sampler if sampler is not None else [seed] * len(batch) if temporal == "same-seed" else \
                [(seed + done + i) % (MAX_SEED + 1) for i in range(len(batch))]
            images = self._draw_frames(batch, mix, seeds, request, generation, output.max_side)
            for i, (image, frame) in enumerate(zip(images, batch)):
                out = finish([image], frame, output)[0]
                out.info.update(time_s=frame.info.get("time_s"), index=frame.info.get("index", done + i))
                yield out
            done += len(batch)

    def _draw_frames(self, frames: list[Image.Image], mix: StyleMix, seeds: list[int] | FrameSampler,
                     request: StylizeRequest, generation: GenerationConfig, max_side: int | None) -> list[Image.Image]:
        """`stylize_batch` of frames; a `FrameSampler` moves each frame by its phase and its drawing back (settled)."""
        resize, upsample = request.resize, request.upsample
        if not isinstance(seeds, FrameSampler):
            return self.stylize_batch(frames, [mix] * len(frames), seeds=seeds, resize=resize, max_side=max_side,
                                      upsample=upsample, generation=generation)
        x_B3SS, fits = self.preprocess(frames, resize)
        motion = seeds.begin(x_B3SS.add(1).mul(0.5), *_guides(frames, resize, self.image_size))
        phases = [tuple(p) for p in motion.phase_B2.tolist()] if seeds.quantum else [(0.0, 0.0)] * len(frames)
        if all(p == (0.0, 0.0) for p in phases) and not seeds.cfg.settle:
            return self.stylize_batch(frames, [mix] * len(frames), seeds=seeds, resize=resize, max_side=max_side,
                                      upsample=upsample, generation=generation)
        moved = [_move(f, p, fit) for f, p, fit in zip(frames, phases, fits)]
        drawn = self.draw(moved, [mix] * len(frames), seeds=seeds, resize=resize, generation=generation)
        back, _ = shift_grid(seeds.settle(drawn.images), -torch.tensor(phases, dtype=torch.float32), mode="bicubic")
        settled = Drawings(back.clamp(0, 1), x_B3SS.add(1).mul(0.5), fits)
        return self.upscaled(settled, frames, [max_side] * len(frames), upsample)

    def stylize_video(self, src: str | os.PathLike, style: Image.Image | Sequence[Image.Image] | StyleMix,
                      out: str | os.PathLike, *, limits: VideoLimits | None = None, progress: ProgressFn | None = None,
                      info: VideoInfo | None = None, **kwargs: Any) -> VideoResult:
        """Re-draw the video ``src`` into the H.264 mp4 ``out`` by `stylize_frames` (its keyword arguments), with
        the source's timing and audio. ``limits``: refuse a longer or larger clip (`VideoError`, before any model call).
        ``progress(done, total)`` after each frame (``total`` None when the header does not say); an exception
        it raises stops the work and leaves ``out`` as it was. ``info``: ``src``'s `probe` when the caller has
        it already (checked against ``limits``), so the clip is not opened for it twice."""
        t0 = time.perf_counter()
        info = probe(src, limits) if info is None else info
        done, first_s, last_s = 0, None, 0.0
        with VideoWriter(out, info, audio_from=src if info.has_audio else None) as writer:
            for image in self.stylize_frames(read_frames(src, limits), style, **kwargs):
                time_s = image.info.get("time_s")
                writer.write(image, time_s)
                first_s = time_s if first_s is None else first_s
                last_s = (time_s or 0.0) - (first_s or 0.0)
                done += 1
                if progress is not None:
                    progress(done, info.frames)
        path = writer.path
        return VideoResult(path, done, info.fps, last_s + 1 / float(info.fps), writer.size, info.has_audio,
                           time.perf_counter() - t0)


def _move(image: Image.Image, phase: tuple[float, float], fit: Fit) -> Image.Image:
    """``image`` moved by ``phase`` model pixels (as ``fit`` maps them), bilinear, edges replicated (or itself)."""
    if phase == (0.0, 0.0):
        return image
    (w, h), (left, top, right, bottom) = fit.size, fit.box
    fx, fy = (min(w, h) / (right - left),) * 2 if fit.mode == "crop" else (w / (right - left), h / (bottom - top))
    d = torch.tensor([[phase[0] * fx, phase[1] * fy]])
    moved, _ = shift_grid(pil_to_tensor(to_rgb(image))[None], d)
    return tensor_to_pil(moved[0])


GUIDE_SIDE = 256  # the longest side the motion between frames is estimated at (`stylevar.pipelines.coherence`)


def _guides(frames: list[Image.Image], resize: ResizeMode, side: int) -> tuple[torch.Tensor, tuple[float, float]]:
    """The luminance of what the model sees of each frame (the centre square for ``crop``), at most `GUIDE_SIDE`
    pixels a side: (B, H, W), and the model pixels per guide pixel (x, y)."""
    fit = fit_of(frames[0].size, side, resize)
    w, h = fit.size
    box = (0, 0, w, h) if fit.mode != "crop" else ((w - min(w, h)) // 2, (h - min(w, h)) // 2,
                                                    (w + min(w, h)) // 2, (h + min(w, h)) // 2)
    bw, bh = box[2] - box[0], box[3] - box[1]
    f = min(1.0, GUIDE_SIDE / max(bw, bh))
    size = (max(1, round(bw * f)), max(1, round(bh * f)))
    rgb = torch.stack([pil_to_tensor(to_rgb(im).crop(box).resize(size, Image.BILINEAR) if f < 1 or box != (0, 0, w, h)
                                     else to_rgb(im)) for im in frames])
    left, top, right, bottom = fit.box
    return luminance(rgb)[:, 0], ((right - left) / size[0], (bottom - top) / size[1])
