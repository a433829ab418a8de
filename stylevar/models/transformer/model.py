"""StyleVAR: predicts a target's token maps coarse to fine, conditioned on a content and a style image.

Three token streams share the embeddings: the target (teacher forcing or what was sampled so far), the style and
the content (each image's cumulative f_hat per scale). Every block: the target gives keys/values, style and
content ask, blended per scale by alpha_k; AdaLN from the style embedding. Beyond the paper, all off by default:
several styles (`StyleBlend`), guidance against the unstyled model, content injection and colour statistics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from stylevar.config import DEFAULT_GENERATION, TRANSFORMER_FILE, GenerationConfig, StyleVARConfig
from stylevar.models.encoders import NUM_COLOUR_STATS, build_image_encoder, colour_statistics, pooled
from stylevar.models.pretrained import PretrainedModel
from stylevar.models.sampling import TokenSampler, make_generators, sample
from stylevar.models.state_dict import StateDict, fit_state_dict
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer.attention import KVCache, compute_dtype
from stylevar.models.transformer.block import AdaLNHead, Block, Guide, HeadModulation, token_rows
from stylevar.models.transformer.condition import Condition, StyleBlend
from stylevar.models.transformer.pruning import FastSampling, ScalePruner


class Generated(NamedTuple):
    """What `StyleVAR.generate_with_indices` returns."""

    images: torch.Tensor  # (B, 3, H, W) in [0, 1]
    indices: list[torch.Tensor]  # the K sampled token maps, each (B, pn * pn)


def _in_model_autocast(method):
    """``method`` under the model's own autocast wherever it is called from (conditions made outside `generate` too)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._autocast(self.pos_1LC.device):
            return method(self, *args, **kwargs)

    return run


class StyleVAR(PretrainedModel, nn.Module):
    """The transformer, holding its frozen tokenizer (`tokenizer`). `save_pretrained(folder)` writes
    `transformer.safetensors` (the state dict without the tokenizer's) and config.json's ``"transformer"``
    section; `from_pretrained(folder)` reads them back, with the folder's tokenizer or a given one
    (`stylevar.models.pretrained`)."""

    config_section = "transformer"
    weights_file = TRANSFORMER_FILE

    def __init__(self, cfg: StyleVARConfig, tokenizer: MultiScaleVQVAE):
        super().__init__()
        if tuple(tokenizer.cfg.patch_nums) != tuple(cfg.patch_nums) or tokenizer.cfg.vocab_size != cfg.vocab_size \
                or tokenizer.cfg.z_channels != cfg.z_channels:
            raise ValueError("tokenizer and transformer configs disagree on patch_nums, vocab_size or z_channels")
        self.cfg = cfg
        C, L, K = cfg.embed_dim, cfg.num_tokens, len(cfg.patch_nums)
        self.tokenizer = tokenizer.requires_grad_(False).eval()

        self.style_encoder = build_image_encoder(cfg.image_encoder, cfg.encoder_dim)
        self.content_encoder = build_image_encoder(cfg.image_encoder, cfg.encoder_dim)
        self.feat_emb = nn.Linear(cfg.encoder_dim, C)
        self.word_embed = nn.Linear(cfg.z_channels, C)
        first_l = cfg.patch_nums[0] ** 2
        self.pos_start = nn.Parameter(torch.zeros(1, first_l, C))
        self.pos_1LC = nn.Parameter(torch.zeros(1, L, C))
        self.lvl_embed = nn.Embedding(K, C)
        self.blocks = nn.ModuleList(Block(cfg, drop_path) for drop_path in cfg.drop_path_rates)
        self.head_nm = AdaLNHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, cfg.vocab_size)
        self.content_in = nn.Linear(C, C) if cfg.content_injection else None
        self.colour_in = nn.Linear(NUM_COLOUR_STATS, C) if cfg.colour_stats else None

        lvl_L = torch.cat([torch.full((pn * pn,), k) for k, pn in enumerate(cfg.patch_nums)])
        self.register_buffer("lvl_L", lvl_L, persistent=False)
        mask_LL = lvl_L[:, None] >= lvl_L[None, :]  # a query at level i sees keys of levels <= i
        self.register_buffer("mask_2LL", torch.cat([mask_LL, mask_LL]), persistent=False)  # style, content
        self.register_buffer("alpha_K", torch.tensor(cfg.alpha_nums, dtype=torch.float32), persistent=False)
        self.autocast_dtype: torch.dtype | None = None  # e.g. torch.bfloat16 on CUDA
        # autocast of the sampling loop alone (stylevar.runtime.inference's bf16 precision: the blocks and head hold
        # bf16 weights, the tokenizer and image encoders stay float32)
        self.loop_autocast_dtype: torch.dtype | None = None
        self.activation_checkpointing = False  # recompute block activations in backward (training memory)
        self.fast_sampling = FastSampling()  # what `fast=True` prunes (stylevar.models.transformer.pruning)
        self.reset_parameters()

    # ---- housekeeping -------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Fresh initialisation for training from scratch (loading a checkpoint overwrites it)."""
        for name, m in self.named_modules():
            if name.startswith("tokenizer"):
                continue
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                nn.init.trunc_normal_(m.weight, std=std)
        for p in (self.pos_start, self.pos_1LC):
            nn.init.trunc_normal_(p, std=std)
        depth_scale = 1 / math.sqrt(2 * self.cfg.depth)
        for blk in self.blocks:
            blk.attn.proj.weight.mul_(depth_scale)
            blk.ffn.fc2.weight.mul_(depth_scale)
            blk.attn.v_bias.zero_()
            lin = blk.ada_lin[1]
            lin.weight.mul_(0.5)
            C = self.cfg.embed_dim
            lin.weight[: 2 * C].mul_(1e-3)  # gammas start small: blocks start close to identity
            lin.bias[: 2 * C].fill_(1e-3)
        self.head.weight.mul_(0.1)
        self.head_nm.ada_lin[1].weight.mul_(0.1)
        for variant in (self.content_in, self.colour_in):  # zero: training starts from the published computation
            if variant is not None:
                nn.init.zeros_(variant.weight)
                nn.init.zeros_(variant.bias)

    def _apply(self, fn, recurse: bool = True):
        # a part that cannot follow a move (stylevar.runtime.inference's packed layers) refuses it before anything moves
        for m in self.modules():
            if m is not self and hasattr(m, "check_move"):
                m.check_move(fn)
        return super()._apply(fn, recurse)

    def train(self, mode: bool = True):
        super().train(mode)
        self.tokenizer.eval()  # frozen: BatchNorm-free, but keep it deterministic regardless
        return self

    def transformer_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("tokenizer.")}

    def load_transformer_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True):
        full = {f"tokenizer.{k}": v for k, v in self.tokenizer.state_dict().items()}
        full.update(sd)
        return self.load_state_dict(full, strict=strict)

    def pretrained_state_dict(self) -> dict[str, torch.Tensor]:
        if getattr(self, "inference_config", None) is not None:
            raise ValueError("this model was prepared for inference (stylevar.runtime.inference.prepare: fused, maybe "
                             "quantised layers); save the model as loaded instead")
        return self.transformer_state_dict()

    @classmethod
    def from_state_dict(cls, sd: StateDict, cfg: StyleVARConfig, tokenizer: MultiScaleVQVAE) -> "StyleVAR":
        """The transformer of ``cfg`` holding ``tokenizer`` and the weights ``sd`` (this project's layout,
        without the tokenizer's; derived buffers recomputed), in eval mode. A state dict that does not fit
        is one `stylevar.models.state_dict.CheckpointMismatchError`."""
        model = cls(cfg, tokenizer)
        own = model.transformer_state_dict()
        what = f"StyleVAR(depth={cfg.depth}, dim={cfg.embed_dim}, V={cfg.vocab_size})"
        model.load_transformer_state_dict(fit_state_dict(sd, own, what))
        return model.eval()

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, tokenizer: MultiScaleVQVAE | None = None) -> "StyleVAR":
        """The transformer saved in ``folder`` (eval mode, on the CPU), holding ``tokenizer`` (default: folder's)."""
        tokenizer = tokenizer if tokenizer is not None else MultiScaleVQVAE.from_pretrained(folder)
        section, sd = cls.read_pretrained(folder)
        return cls.from_state_dict(sd, StyleVARConfig.from_dict(section), tokenizer)

    def _autocast(self, device: torch.device, dtype: torch.dtype | None = None):
        dtype = dtype or self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype)

    @property
    def loop_dtype(self) -> torch.dtype:
        """The dtype generation's token loop computes in: its own autocast's, else the model's, else float32."""
        return self.loop_autocast_dtype or self.autocast_dtype or torch.float32

    def loop_autocast(self, device: torch.device):
        """The autocast of generation's token loop (`loop_dtype`)."""
        return self._autocast(device, self.loop_autocast_dtype)

    def blend_alphas(self, alphas: Sequence[float] | torch.Tensor | None = None,
                     style_strength: float = 0.0) -> torch.Tensor:
        """Per-scale blend coefficients (K,): the config's, or `alphas`, shifted by 0.5 * style_strength."""
        if not -1.0 <= float(style_strength) <= 1.0:
            raise ValueError(f"style_strength must lie in [-1, 1], got {style_strength}")
        K = len(self.cfg.patch_nums)
        a = self.alpha_K if alphas is None else torch.as_tensor(alphas, dtype=torch.float32, device=self.alpha_K.device)
        if a.shape != (K,):
            raise ValueError(f"alphas must hold one value per scale ({K}), got shape {tuple(a.shape)}")
        if style_strength:
            a = (a + 0.5 * float(style_strength)).clamp(0.01, 0.99)
        return a

    # ---- conditioning -------------------------------------------------------------------------
    def lvl_pos(self) -> torch.Tensor:
        return self.lvl_embed(self.lvl_L).unsqueeze(0) + self.pos_1LC  # (1, L, C)

    @_in_model_autocast
    def condition(self, content: torch.Tensor, style: torch.Tensor | StyleBlend, *, unstyled: bool = False,
                  style_parts: Callable | None = None, content_parts: Callable | None = None) -> Condition:
        """The condition of (content, style); ``style`` one image batch or a `StyleBlend` of several.
        ``unstyled``: also embed the content with the style encoder (what guidance needs). ``style_parts``,
        ``content_parts``: what computes the images' parts in place of the methods of those names (a cache's lookups,
        `stylevar.pipelines.conditions`)."""
        style_parts, content_parts = style_parts or self.style_parts, content_parts or self.content_parts
        blend = style if isinstance(style, StyleBlend) else None
        styles = list(blend.styles) if blend is not None else [style]
        B, S = content.shape[0], len(styles)
        if any(s.shape[0] != B for s in styles):
            raise ValueError(f"content batch {B} and style batch {[s.shape[0] for s in styles]} differ")
        style_all = styles[0] if S == 1 else torch.cat(styles)  # (S * B, 3, H, W), style-major
        cond_BD, style_ln = style_parts(style_all)
        style_ln_BSLC = style_ln.unflatten(0, (S, B)).transpose(0, 1)
        sos, content_ln, inject, unstyled_BD = content_parts(content, unstyled)
        shares = adaln_BLD = None
        per_token = False
        if blend is not None:
            cond_BSD = cond_BD.unflatten(0, (S, B)).transpose(0, 1)
            cond_BD = (blend.normalised_weights().to(cond_BD.dtype).unsqueeze(2) * cond_BSD).sum(1)
            shares = blend.shares(self.cfg.patch_nums)
            # the same mix at every token, every token fully styled (no mask, or white ones): one AdaLN input
            per_token = blend.masks_BSHW is not None and not (
                bool((shares == shares[:, :, :1]).all()) and bool((shares.sum(1) == 1).all()))
        if per_token:
            if unstyled_BD is None:
                unstyled_BD = self.style_embedding(content)
            sh_BSL = shares.to(cond_BSD.dtype)
            adaln_BLD = (torch.einsum("bsl,bsd->bld", sh_BSL, cond_BSD)
                         + (1 - sh_BSL.sum(1)).unsqueeze(2) * unstyled_BD.unsqueeze(1))
        return Condition(cond_BD, sos, style_ln_BSLC, content_ln, inject, shares, unstyled_BD, adaln_BLD)

    def _stream_ln(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        """An image's LayerNorm'ed token stream (B, L, C)."""
        with torch.no_grad():
            tok = self.tokenizer.quantize.condition_tokens(self.tokenizer.encode(img_B3HW)[1])
        return self.token_stream_ln(tok)

    def token_stream_ln(self, tokens_BLc: torch.Tensor) -> torch.Tensor:
        """Condition tokens (B, L, Cvae) as the blocks see them: LayerNorm(word_embed + level and position
        embeddings), (B, L, C)."""
        return F.layer_norm(self.word_embed(tokens_BLc) + self.lvl_pos(), (self.cfg.embed_dim,),
                            eps=self.cfg.norm_eps)

    @_in_model_autocast
    def style_parts(self, style: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What each style image contributes on its own: its embedding (B, C) and token stream (B, L, C)."""
        return self.style_embedding(style), self._stream_ln(style)

    def style_embedding(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        """An image's AdaLN input (B, C): its pooled style features (+ its colour statistics with `colour_stats`)."""
        emb_BC = self.feat_emb(pooled(self.style_encoder, img_B3HW))
        if self.colour_in is not None:
            emb_BC = emb_BC + self.colour_in(colour_statistics(img_B3HW))
        return emb_BC

    @_in_model_autocast
    def content_parts(self, content: torch.Tensor, unstyled: bool = False, tokens_BLc: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What each content image contributes: start token (B, 1, C), token stream (B, L, C), the
        injection (variant, else None) and, with ``unstyled``, its style-encoder embedding (B, C).
        ``tokens_BLc``: the content's condition tokens when already at hand (training's fused encode or token
        cache), else the tokenizer encodes the content."""
        content_ln = self._stream_ln(content) if tokens_BLc is None else self.token_stream_ln(tokens_BLc)
        sos = self.feat_emb(pooled(self.content_encoder, content)).unsqueeze(1) + self.pos_start
        inject = self.content_in(content_ln) if self.content_in is not None else None
        unstyled_BD = self.style_embedding(content) if unstyled else None
        return sos, content_ln, inject, unstyled_BD

    def stream_alphas(self, cond: Condition, alpha_K: torch.Tensor) -> torch.Tensor:
        """Blend coefficient of every style stream at every token: (1, 1, L, 1) for one style without a
        mask (the published per-scale alphas), else (B, S, L, 1) = alpha_k * the blend's shares."""
        alpha_L = alpha_K[self.lvl_L]
        if cond.shares_BSL is None:
            return alpha_L.view(1, 1, -1, 1)
        return (alpha_L * cond.shares_BSL.to(alpha_L.device)).unsqueeze(-1)

    def stream_mask(self, num_styles: int) -> torch.Tensor:
        """Teacher forcing's attention mask for S style streams and the content stream: ((S + 1) L, L)."""
        if num_styles == 1:
            return self.mask_2LL
        return self.mask_2LL[: self.cfg.num_tokens].repeat(num_styles + 1, 1)

    def logits(self, x_BLC: torch.Tensor, head_mod: HeadModulation) -> torch.Tensor:
        return self.head(self.head_nm(x_BLC, head_mod)).float()

    # ---- teacher forcing ----------------------------------------------------------------------
    def teacher_forcing_logits(
        self,
        content: torch.Tensor | None,
        style: torch.Tensor | StyleBlend | None,
        target_indices: list[torch.Tensor],
        *,
        alphas: Sequence[float] | torch.Tensor | None = None,
        style_strength: float = 0.0,
        cond: Condition | None = None,
    ) -> torch.Tensor:
        """Logits (B, L, V) float32 for every target token given the true coarser scales.

        `cond` (from `condition(content, style)`) may be passed instead of the images when it is reused.
        """
        with self._autocast(target_indices[0].device):
            cond = cond if cond is not None else self.condition(content, style)
            with torch.no_grad():
                x_in = self.tokenizer.quantize.next_scale_inputs(target_indices, self.tokenizer.latent_size)
            x = torch.cat([cond.sos_B1C.expand(x_in.shape[0], -1, -1), self.word_embed(x_in)], dim=1)
            x = cond.target_inputs(x + self.lvl_pos(), 0, self.cfg.num_tokens)
            alpha_BSL1 = self.stream_alphas(cond, self.blend_alphas(alphas, style_strength))
            guide = Guide(alpha_BSL1, cond.style_ln_BSLC, cond.content_ln_BLC)
            mask = self.stream_mask(cond.num_styles)
            for blk in self.blocks:
                args = (x, blk.modulation(cond.adaln()), guide, mask)
                if self.activation_checkpointing and torch.is_grad_enabled():
                    x = torch.utils.checkpoint.checkpoint(blk, *args, use_reentrant=False)
                else:
                    x = blk(*args)
            return self.logits(x, self.head_nm.modulation(cond.adaln()))

    # ---- generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        content: torch.Tensor,
        style: torch.Tensor | StyleBlend,
        config: GenerationConfig | None = None,
        *,
        seed: int | Sequence[int] | TokenSampler | None = None,
        on_scale: Callable[[int, torch.Tensor], None] | None = None,
        return_indices: bool = False,
        cond: Condition | None = None,
        **settings: Any,
    ) -> torch.Tensor:
        """Sample the target coarse to fine: images (B, 3, H, W) in [0, 1].

        ``config``: a `stylevar.config.GenerationConfig`, or its fields as keyword ``settings``; ``seed``: the
        rows' seeds, over ``config.seed``. ``style``: one image batch or a `StyleBlend`. ``cond`` (from
        `condition(content, style, unstyled=guidance > 0)`) may replace the images. ``on_scale(k, images)``: called
        after each scale with the preview so far. ``return_indices=True`` is deprecated (`generate_with_indices`).
        """
        out = self._generate(content, style, settings_of(config, settings), on_scale, cond, seed)
        if return_indices:
            warnings.warn("StyleVAR.generate(return_indices=True) is deprecated; use generate_with_indices",
                          DeprecationWarning, stacklevel=3)  # past torch.no_grad's wrapper
            return out
        return out.images

    @torch.no_grad()
    def generate_with_indices(self, content: torch.Tensor, style: torch.Tensor | StyleBlend,
                              config: GenerationConfig | None = None, *,
                              seed: int | Sequence[int] | TokenSampler | None = None,
                              on_scale: Callable[[int, torch.Tensor], None] | None = None,
                              cond: Condition | None = None, **settings: Any) -> Generated:
        """`generate`, returning the images and the K sampled token maps, each (B, pn * pn)."""
        return self._generate(content, style, settings_of(config, settings), on_scale, cond, seed)

    def _generate(self, content: torch.Tensor | None, style: torch.Tensor | StyleBlend | None,
                  settings: GenerationConfig, on_scale: Callable[[int, torch.Tensor], None] | None,
                  cond: Condition | None, seed: int | Sequence[int] | TokenSampler | None = None) -> Generated:
        guidance = settings.guidance
        if not (math.isfinite(guidance) and guidance >= 0):
            raise ValueError(f"guidance must be a finite number >= 0, got {guidance}")
        if cond is None and not isinstance(style, StyleBlend) and style.shape[0] != content.shape[0]:
            raise ValueError(f"content batch {content.shape[0]} and style batch {style.shape[0]} differ")
        B = cond.cond_BD.shape[0] if cond is not None else content.shape[0]
        device = cond.cond_BD.device if cond is not None else content.device
        generators = make_generators(settings.seed if seed is None else seed, B, device)
        alpha_K = self.blend_alphas(settings.alphas, settings.style_strength)
        with self._autocast(device):
            cond = cond if cond is not None else self.condition(content, style, unstyled=guidance > 0)
            if guidance > 0 and cond.unstyled_BD is None:  # a condition made elsewhere (a cache): add what guidance needs
                if content is None:
                    raise ValueError("guidance needs the content image, or a condition made with unstyled=True")
                cond = dataclasses.replace(cond, unstyled_BD=self.style_embedding(content))
            f_hat, indices = self.sample_tokens(cond, generators, alpha_K, settings, on_scale)
            images = self.tokenizer.decode_fhat(f_hat).float().add(1).mul(0.5)
        return Generated(images, indices)

    @torch.no_grad()
    def sample_tokens(self, cond: Condition, generators: list[torch.Generator] | TokenSampler, alpha_K: torch.Tensor,
                      config: GenerationConfig = DEFAULT_GENERATION,
                      on_scale: Callable[[int, torch.Tensor], None] | None = None
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The autoregressive loop: f_hat (B, Cvae, n, n) and the K sampled token maps. ``config``: top-k, top-p,
        guidance and fast (its seed and blend are the generators' and ``alpha_K``'s). With guidance the unstyled
        condition runs as B more rows of the batch; with fast, flat 2 x 2 groups merge (`...transformer.pruning`).
        """
        with self.loop_autocast(cond.cond_BD.device):
            return self._sample_tokens(cond, generators, alpha_K, config, on_scale)

    def _sample_tokens(self, cond: Condition, generators: list[torch.Generator] | TokenSampler,
                       alpha_K: torch.Tensor, config: GenerationConfig,
                       on_scale: Callable[[int, torch.Tensor], None] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        B, device = cond.cond_BD.shape[0], cond.cond_BD.device
        guided = config.guidance > 0
        coverage_BL = cond.coverage_BL() if guided else None
        run = cond.cat(cond.unstyled()) if guided else cond  # rows: B, or 2B (styled, then unstyled)
        R, S = run.cond_BD.shape[0], run.num_styles
        tok, patch_nums = self.tokenizer, self.cfg.patch_nums
        n = tok.latent_size
        lvl_pos = self.lvl_pos()
        dtype = compute_dtype(device, lvl_pos.dtype)
        caches = [KVCache(R, self.cfg.num_heads, self.cfg.num_tokens, self.cfg.head_dim, device, dtype)
                  for _ in self.blocks]
        mods = [blk.modulation(run.adaln()) for blk in self.blocks]
        head_mod = self.head_nm.modulation(run.adaln())
        per_token = run.adaln_BLD is not None  # modulations (R, L, C): each scale takes its tokens' rows
        alpha_RSL1 = None if run.shares_BSL is None else self.stream_alphas(run, alpha_K)
        pruner = ScalePruner(self.fast_sampling, patch_nums, guided) if config.fast else None
        L = self.cfg.num_tokens if pruner is None else pruner.full_until()  # a pruned scale makes its own queries
        # the guide queries of every scale, per block: (R, H, S + 1, L, c); each scale takes its columns
        queries = [blk.queries(run.style_ln_BSLC[:, :, :L], run.content_ln_BLC[:, :L],
                               token_rows(mod, 0, L) if per_token else mod).unflatten(2, (S + 1, -1))
                   for blk, mod in zip(self.blocks, mods)]
        f_hat = torch.zeros(B, self.cfg.z_channels, n, n, device=device)
        x = run.target_inputs(run.sos_B1C.expand(R, -1, -1) + lvl_pos[:, : patch_nums[0] ** 2], 0, patch_nums[0] ** 2)
        indices, start = [], 0
        for k, pn in enumerate(patch_nums):
            end = start + pn * pn
            alpha = (alpha_K[k].expand(R, S, pn * pn, 1) if alpha_RSL1 is None
                     else alpha_RSL1[:, :, start:end])
            if pruner is not None and pruner.prunes(k):
                x = pruner.scale(k, start, x, run, self.blocks, mods, caches, alpha, per_token)
            else:
                for blk, mod, cache, q_RHSLc in zip(self.blocks, mods, caches, queries):
                    guide = Guide(alpha, q_BHXc=q_RHSLc[:, :, :, start:end].flatten(2, 3))
                    x = blk(x, token_rows(mod, start, end) if per_token else mod, guide, None, cache)
            logits_RlV = self.logits(x, token_rows(head_mod, start, end) if per_token else head_mod)
            if guided:
                logits_RlV = guided_logits(logits_RlV, config.guidance, coverage_BL[:, start:end])
            idx_Bl = sample(logits_RlV, generators, config.top_k, config.top_p)
            indices.append(idx_Bl)
            f_hat = f_hat + tok.quantize.upsampled_residual(k, idx_Bl, n).float()
            if on_scale is not None:
                on_scale(k, tok.decode_fhat(f_hat).float().add(1).mul(0.5))
            if k + 1 < len(patch_nums):
                x = self._next_inputs(run, f_hat, lvl_pos, end, patch_nums[k + 1], guided)
            start = end
        return f_hat, indices

    def _next_inputs(self, run: Condition, f_hat: torch.Tensor, lvl_pos: torch.Tensor, end: int, nxt: int,
                     guided: bool) -> torch.Tensor:
        """The next scale's input rows (R, nxt * nxt, C) from the sampled image so far (twice when guided)."""
        x_BlC = self.word_embed(self.tokenizer.quantize.area_tokens(f_hat, nxt))
        return run.target_inputs((x_BlC.repeat(2, 1, 1) if guided else x_BlC) + lvl_pos[:, end:end + nxt * nxt],
                                 end, end + nxt * nxt)


def settings_of(config: GenerationConfig | None, settings: dict[str, Any]) -> GenerationConfig:
    """``config``, or its fields given as keyword ``settings`` (not both)."""
    if config is not None and settings:
        raise TypeError(f"give a GenerationConfig or {', '.join(sorted(settings))}, not both")
    return config if config is not None else GenerationConfig(**settings)


def guided_logits(logits_RlV: torch.Tensor, guidance: float, coverage_Bl: torch.Tensor) -> torch.Tensor:
    """The styled rows pushed away from the unstyled ones (rows B..2B), by ``guidance`` where the styles cover."""
    styled_BlV, plain_BlV = logits_RlV.chunk(2)
    g_Bl1 = guidance * coverage_Bl[:, :, None].to(styled_BlV.dtype)
    return styled_BlV + g_Bl1 * (styled_BlV - plain_BlV)
