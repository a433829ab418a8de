"""VAR's multi-scale residual vector quantizer.

A latent f (B, Cvae, n, n) becomes K token maps, coarse to fine: at scale k the residual f - f_hat, area-resized to
pn_k x pn_k, takes its nearest codebook entries, upsampled back and refined by Phi(h) = (1 - r) h + r conv3x3(h).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stylevar.utils.precision import full_precision, strict_addmm_


class Phi(nn.Conv2d):
    def __init__(self, channels: int, ratio: float):
        super().__init__(channels, channels, kernel_size=3, padding=1)
        self.ratio = ratio

    def forward(self, h_BChw: torch.Tensor) -> torch.Tensor:
        return h_BChw * (1 - self.ratio) + super().forward(h_BChw) * self.ratio


class PhiPartiallyShared(nn.Module):
    """`share` Phi convs; scale k of K uses the one whose tick is nearest to k / (K - 1)."""

    def __init__(self, channels: int, ratio: float, share: int):
        super().__init__()
        self.qresi_ls = nn.ModuleList(Phi(channels, ratio) for _ in range(share))
        lo = 1 / (3 * share) if share == 4 else 1 / (2 * share)
        # plain floats, not a buffer: choosing a conv is host work (no device sync in the sampling loop)
        self.ticks = torch.linspace(lo, 1 - lo, share, dtype=torch.float64).tolist()

    def for_scale(self, k: int, num_scales: int) -> Phi:
        at = k / (num_scales - 1) if num_scales > 1 else 0.0
        return self.qresi_ls[min(range(len(self.ticks)), key=lambda i: abs(self.ticks[i] - at))]  # first on ties


class MultiScaleQuantizer(nn.Module):
    def __init__(self, vocab_size: int, z_channels: int, patch_nums: tuple[int, ...], quant_resi: float,
                 share_quant_resi: int, beta: float):
        super().__init__()
        self.vocab_size, self.z_channels, self.patch_nums, self.beta = vocab_size, z_channels, patch_nums, beta
        self.embedding = nn.Embedding(vocab_size, z_channels)
        self.quant_resi = PhiPartiallyShared(z_channels, quant_resi, share_quant_resi)
        # per-scale codebook hit statistics (EMA); training bookkeeping, not used for inference
        self.register_buffer("ema_vocab_hit_SV", torch.zeros(len(patch_nums), vocab_size))

    @property
    def num_scales(self) -> int:
        return len(self.patch_nums)

    def phi(self, k: int) -> Phi:
        return self.quant_resi.for_scale(k, self.num_scales)

    def nearest(self, z_NC: torch.Tensor) -> torch.Tensor:
        """Index of the nearest codebook entry (squared L2) for each row of z_NC, computed in float32."""
        emb_VC = self.embedding.weight.detach().float()
        z_NC = z_NC.float()
        d_NV = torch.sum(z_NC.square(), dim=1, keepdim=True) + torch.sum(emb_VC.square(), dim=1)
        strict_addmm_(d_NV, z_NC, emb_VC.T, alpha=-2)  # never TF32: the GPU picks the CPU's codes
        return torch.argmin(d_NV, dim=1)

    @staticmethod
    def area_tokens(f_BCnn: torch.Tensor, pn: int) -> torch.Tensor:
        """f area-resized to pn x pn, as tokens (B, pn * pn, C)."""
        return F.interpolate(f_BCnn, size=(pn, pn), mode="area").flatten(2).transpose(1, 2)

    @full_precision
    def upsampled_residual(self, k: int, idx_Bl: torch.Tensor, n: int) -> torch.Tensor:
        """Phi(upsample(embedding(tokens of scale k))): what scale k adds to f_hat, (B, C, n, n), in float32."""
        pn = self.patch_nums[k]
        h_BChw = self.embedding(idx_Bl).transpose(1, 2).reshape(idx_Bl.shape[0], self.z_channels, pn, pn)
        if k != self.num_scales - 1:
            h_BChw = F.interpolate(h_BChw, size=(n, n), mode="bicubic")
        return self.phi(k)(h_BChw)

    @torch.no_grad()
    def quantize(self, f_BCnn: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Token maps of f, and f_hat after each scale (the cumulative reconstruction, (B, C, n, n))."""
        B, C, n, _ = f_BCnn.shape
        f_rest = f_BCnn  # never written in place
        f_hat = torch.zeros_like(f_BCnn)
        indices, f_hats = [], []
        for k, pn in enumerate(self.patch_nums):
            r = F.interpolate(f_rest, size=(pn, pn), mode="area") if k != self.num_scales - 1 else f_rest
            idx_Bl = self.nearest(r.permute(0, 2, 3, 1).reshape(-1, C)).view(B, pn * pn)
            h = self.upsampled_residual(k, idx_Bl, n)
            f_hat = f_hat + h
            f_rest = f_rest - h
            indices.append(idx_Bl)
            f_hats.append(f_hat)
        return indices, f_hats

    def indices_to_fhats(self, indices: list[torch.Tensor], n: int) -> list[torch.Tensor]:
        """f_hat after each of the given scales (a prefix of the K scales is allowed)."""
        f_hat = None
        out = []
        for k, idx_Bl in enumerate(indices):
            h = self.upsampled_residual(k, idx_Bl, n)
            f_hat = h if f_hat is None else f_hat + h
            out.append(f_hat)
        return out

    def next_scale_inputs(self, indices: list[torch.Tensor], n: int) -> torch.Tensor:
        """Teacher-forcing inputs: area-resize(f_hat after scales 0..k, pn_{k+1}) for k < K-1, (B, L - pn_0^2, C)."""
        f_hats = self.indices_to_fhats(indices[:-1], n)
        return torch.cat([self.area_tokens(f, pn) for f, pn in zip(f_hats, self.patch_nums[1:])], dim=1)

    def condition_tokens(self, f_hats: list[torch.Tensor]) -> torch.Tensor:
        """Condition tokens of an image: area-resize(f_hat after scales 0..k, pn_k) for every k, (B, L, C)."""
        return torch.cat([self.area_tokens(f, pn) for f, pn in zip(f_hats, self.patch_nums)], dim=1)

    def forward(self, f_BCnn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Training pass: straight-through f_hat, VQ loss, token maps and codebook usage fraction."""
        B, C, n, _ = f_BCnn.shape
        f_nograd = f_BCnn.detach()
        f_rest = f_nograd
        f_hat = torch.zeros_like(f_nograd)
        vq_loss = f_BCnn.new_zeros(())
        indices = []
        hit_V = torch.zeros(self.vocab_size, device=f_BCnn.device)
        for k, pn in enumerate(self.patch_nums):
            r = F.interpolate(f_rest, size=(pn, pn), mode="area") if k != self.num_scales - 1 else f_rest
            idx_N = self.nearest(r.permute(0, 2, 3, 1).reshape(-1, C))
            counts = torch.bincount(idx_N, minlength=self.vocab_size).float()
            hit_V += counts
            if self.training:
                with torch.no_grad():
                    self.ema_vocab_hit_SV[k].mul_(0.99).add_(counts, alpha=0.01)
            idx_Bl = idx_N.view(B, pn * pn)
            h = self.upsampled_residual(k, idx_Bl, n)
            f_hat = f_hat + h
            f_rest = f_rest - h.detach()
            indices.append(idx_Bl)
            # codebook/Phi move toward the encoder output; the encoder commits to the (detached) codes
            vq_loss = vq_loss + F.mse_loss(f_hat, f_nograd) + self.beta * F.mse_loss(f_hat.detach(), f_BCnn)
        vq_loss = vq_loss / self.num_scales
        f_hat_st = f_hat.detach() - f_nograd + f_BCnn  # straight-through to the encoder
        # gradient to codebook and Phi through the decoder as well: add what the ST estimate drops
        f_hat_st = f_hat_st + (f_hat - f_hat.detach())
        usage = (hit_V > 0).float().mean()
        return f_hat_st, vq_loss, indices, usage
