"""VAR's convolutional encoder and decoder (LDM-style, GroupNorm + SiLU, attention at the lowest scale).

Module names follow the published `vae_ch160v4096z32.pth` layout so its state dict loads unchanged.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _norm(channels: int, groups: int = 32) -> nn.GroupNorm:
    # 32 groups as published; a channel count that 32 does not divide falls back to a divisor of it
    return nn.GroupNorm(num_groups=math.gcd(groups, channels), num_channels=channels, eps=1e-6, affine=True)


def _norm_silu(norm: nn.GroupNorm, x_BCHW: torch.Tensor) -> torch.Tensor:
    """SiLU(GroupNorm(x)), in place on the norm's fresh output where no gradient is taken."""
    h = norm(x_BCHW)
    return F.silu(h, inplace=not h.requires_grad)


class ResnetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, dropout: float = 0.0, groups: int = 32):
        super().__init__()
        self.norm1 = _norm(c_in, groups)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = _norm(c_out, groups)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        h = self.conv1(_norm_silu(self.norm1, x_BCHW))
        h = self.conv2(self.dropout(_norm_silu(self.norm2, h)))
        skip = self.nin_shortcut(x_BCHW)
        if h.requires_grad or skip.dtype != h.dtype:
            return skip + h
        return h.add_(skip)  # the same sum (addition commutes), in conv2's fresh output


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with a fused 1x1 qkv conv."""

    def __init__(self, channels: int, groups: int = 32):
        super().__init__()
        self.norm = _norm(channels, groups)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x_BCHW.shape
        qkv = self.qkv(self.norm(x_BCHW)).reshape(B, 3, C, H * W)  # reshape: a channels-last input copies
        q, k, v = (t.transpose(1, 2).unsqueeze(1) for t in qkv.unbind(1))  # each (B, 1, HW, C)
        h = F.scaled_dot_product_attention(q, k, v)  # scale C ** -0.5
        h = h.squeeze(1).transpose(1, 2).reshape(B, C, H, W)
        return x_BCHW + self.proj_out(h)


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: ``n`` res blocks (with ``attention``), then `Downsample` or `Upsample` (``resample``)."""

    def __init__(self, c_in: int, c_out: int, n: int, attention: bool, resample: type[nn.Module] | None,
                 dropout: float, groups: int):
        super().__init__()
        blocks = []
        for _ in range(n):
            blocks.append(ResnetBlock(c_in, c_out, dropout, groups))
            c_in = c_out
        self.channels = c_in  # what the level gives
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList([AttnBlock(c_in, groups) for _ in range(n)] if attention else [])
        name = None if resample is None else resample.__name__.lower()
        if resample is not None:
            self.add_module(name, resample(c_in))
        self._resample_name = name

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        if self._resample_name is not None:
            h = getattr(self, self._resample_name)(h)
        return h


class _Mid(nn.Module):
    def __init__(self, channels: int, dropout: float, attention: bool, groups: int):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, dropout, groups)
        self.attn_1 = AttnBlock(channels, groups) if attention else nn.Identity()
        self.block_2 = ResnetBlock(channels, channels, dropout, groups)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(h)))


class Encoder(nn.Module):
    def __init__(self, *, ch: int, ch_mult, num_res_blocks: int, z_channels: int, dropout: float = 0.0,
                 using_sa: bool = True, using_mid_sa: bool = True, norm_groups: int = 32, space_to_channel: int = 1):
        super().__init__()
        n = len(ch_mult)
        self.s2c = space_to_channel
        self.conv_in = nn.Conv2d(3 * space_to_channel ** 2, ch, 3, padding=1)
        levels, c_in = [], ch
        for i, mult in enumerate(ch_mult):
            levels.append(_Level(c_in, ch * mult, num_res_blocks, i == n - 1 and using_sa,
                                 Downsample if i != n - 1 else None, dropout, norm_groups))
            c_in = levels[-1].channels
        self.down = nn.ModuleList(levels)
        self.mid = _Mid(c_in, dropout, using_mid_sa, norm_groups)
        self.norm_out = _norm(c_in, norm_groups)
        self.conv_out = nn.Conv2d(c_in, z_channels, 3, padding=1)

    def forward(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(F.pixel_unshuffle(img_B3HW, self.s2c) if self.s2c > 1 else img_B3HW)
        for level in self.down:
            h = level(h)
        h = self.mid(h)
        return self.conv_out(_norm_silu(self.norm_out, h))


class Decoder(nn.Module):
    def __init__(self, *, ch: int, ch_mult, num_res_blocks: int, z_channels: int, dropout: float = 0.0,
                 using_sa: bool = True, using_mid_sa: bool = True, norm_groups: int = 32, space_to_channel: int = 1):
        super().__init__()
        n = len(ch_mult)
        self.s2c = space_to_channel
        c_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, c_in, 3, padding=1)
        self.mid = _Mid(c_in, dropout, using_mid_sa, norm_groups)
        levels: list[_Level] = []
        for i in reversed(range(n)):
            levels.insert(0, _Level(c_in, ch * ch_mult[i], num_res_blocks + 1, i == n - 1 and using_sa,
                                    Upsample if i != 0 else None, dropout, norm_groups))
            c_in = levels[0].channels
        self.up = nn.ModuleList(levels)  # up[i] works at level i; run from the last to the first
        self.norm_out = _norm(c_in, norm_groups)
        self.conv_out = nn.Conv2d(c_in, 3 * space_to_channel ** 2, 3, padding=1)

    def forward(self, z_BCHW: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z_BCHW))
        for level in reversed(self.up):
            h = level(h)
        out = self.conv_out(_norm_silu(self.norm_out, h))
        return F.pixel_shuffle(out, self.s2c) if self.s2c > 1 else out


def widen_to_space_to_channel(sd: dict[str, torch.Tensor], s: int) -> dict[str, torch.Tensor]:
    """A tokenizer's weights (space-to-channel 1) as those of its space-to-channel-`s` twin, which starts out as it
    on the image shrunk s times: only the stem (averaging) and the head (repeating) change."""
    out = dict(sd)
    w_in = sd["encoder.conv_in.weight"]  # (ch, 3, 3, 3)
    out["encoder.conv_in.weight"] = w_in.repeat_interleave(s * s, dim=1) / (s * s)
    for name in ("decoder.conv_out.weight", "decoder.conv_out.bias"):
        out[name] = sd[name].repeat_interleave(s * s, dim=0)
    return out
