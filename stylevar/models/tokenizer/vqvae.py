"""MultiScaleVQVAE: VAR's tokenizer (encoder -> quant_conv -> multi-scale quantizer -> post_quant_conv -> decoder)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from stylevar.config import TOKENIZER_FILE, VQVAEConfig
from stylevar.models.pretrained import PretrainedModel
from stylevar.models.state_dict import StateDict, fit_state_dict
from stylevar.models.tokenizer.autoencoder import Decoder, Encoder
from stylevar.models.tokenizer.quantizer import MultiScaleQuantizer
from stylevar.utils.precision import full_precision


@dataclass
class VQVAEOutput:
    recon: torch.Tensor  # (B, 3, H, W) in about [-1, 1] (not clamped, for the loss)
    vq_loss: torch.Tensor  # scalar
    usage: torch.Tensor  # scalar: fraction of the codebook hit in this batch
    indices: list[torch.Tensor]  # K x (B, pn*pn)


class MultiScaleVQVAE(PretrainedModel, nn.Module):
    """The tokenizer. `save_pretrained(folder)` writes `tokenizer.safetensors` and config.json's ``"tokenizer"``
    section; `from_pretrained(folder)` reads them back from a tokenizer folder or a whole model directory.
    Encoding and decoding run in float32 under any autocast; training (`forward`) follows its run's precision."""

    config_section = "tokenizer"
    weights_file = TOKENIZER_FILE

    def __init__(self, cfg: VQVAEConfig):
        super().__init__()
        self.cfg = cfg
        arch = dict(ch=cfg.ch, ch_mult=cfg.ch_mult, num_res_blocks=cfg.num_res_blocks, z_channels=cfg.z_channels,
                    dropout=cfg.dropout, using_sa=cfg.using_sa, using_mid_sa=cfg.using_mid_sa,
                    norm_groups=cfg.norm_groups, space_to_channel=cfg.space_to_channel)
        self.encoder = Encoder(**arch)
        self.decoder = Decoder(**arch)
        self.quantize = MultiScaleQuantizer(cfg.vocab_size, cfg.z_channels, cfg.patch_nums, cfg.quant_resi,
                                            cfg.share_quant_resi, cfg.beta)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 3, padding=1)
        self.post_quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 3, padding=1)

    @classmethod
    def from_state_dict(cls, sd: StateDict, cfg: VQVAEConfig) -> "MultiScaleVQVAE":
        """The tokenizer of ``cfg`` holding the weights ``sd``, in eval mode (CheckpointMismatchError if unfit)."""
        model = cls(cfg)
        own = model.state_dict()
        hit = "quantize.ema_vocab_hit_SV"
        if hit in sd and sd[hit].shape != own[hit].shape:  # training statistics only
            sd = {**sd, hit: own[hit]}
        model.load_state_dict(fit_state_dict(sd, own, f"MultiScaleVQVAE({cfg.ch}ch, V={cfg.vocab_size}, "
                                                      f"Cvae={cfg.z_channels})"))
        return model.eval()

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "MultiScaleVQVAE":
        """The tokenizer saved in ``folder`` (eval mode, on the CPU)."""
        section, sd = cls.read_pretrained(folder)
        return cls.from_state_dict(sd, VQVAEConfig.from_dict(section))

    @property
    def latent_size(self) -> int:
        return self.cfg.patch_nums[-1]

    def _check_images(self, img_B3HW: torch.Tensor) -> None:
        s = self.cfg.image_size
        if img_B3HW.ndim != 4 or img_B3HW.shape[1] != 3 or img_B3HW.shape[-2:] != (s, s):
            raise ValueError(f"expected images (B, 3, {s}, {s}) in [-1, 1], got {tuple(img_B3HW.shape)}")

    def latent(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        self._check_images(img_B3HW)
        return self.quant_conv(self.encoder(img_B3HW))

    @torch.no_grad()
    @full_precision
    def encode(self, img_B3HW: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Token maps and the cumulative f_hat after each scale."""
        return self.quantize.quantize(self.latent(img_B3HW))

    @torch.no_grad()
    def encode_indices(self, img_B3HW: torch.Tensor) -> list[torch.Tensor]:
        """Images in [-1, 1] -> K token maps, each (B, pn*pn) int64."""
        return self.encode(img_B3HW)[0]

    @full_precision
    def decode_fhat(self, f_hat_BCnn: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(f_hat_BCnn)).clamp(-1, 1)

    @torch.no_grad()
    def decode_indices(self, indices: list[torch.Tensor]) -> torch.Tensor:
        """K token maps -> images (B, 3, H, W) in [-1, 1]."""
        if len(indices) != len(self.cfg.patch_nums):
            raise ValueError(f"expected {len(self.cfg.patch_nums)} token maps, got {len(indices)}")
        return self.decode_partial(indices)

    @torch.no_grad()
    def decode_partial(self, indices: list[torch.Tensor]) -> torch.Tensor:
        """Preview from the first k token maps (coarse to fine), (B, 3, H, W) in [-1, 1]."""
        return self.decode_fhat(self.quantize.indices_to_fhats(indices, self.latent_size)[-1])

    def forward(self, img_B3HW: torch.Tensor) -> VQVAEOutput:
        f_hat, vq_loss, indices, usage = self.quantize(self.latent(img_B3HW))
        recon = self.decoder(self.post_quant_conv(f_hat))
        return VQVAEOutput(recon=recon, vq_loss=vq_loss, usage=usage, indices=indices)
