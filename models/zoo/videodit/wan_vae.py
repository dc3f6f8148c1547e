"""Wan 2.1's VAE decoder (Wan-VAE), one call as the official decode makes it: one latent frame in,
four video frames out, the causal convolutions reading the last two frames of their input in the
previous call from a feature cache (written from the Wan paper's description of Wan-VAE and the
released configuration: docs/sources.md, "Video DiTs: outside the loop"; nothing copied).

The official decode turns a latent of T frames into 1 + 4 (T - 1) frames by T calls of the
decoder, one latent frame each; every call but the first doubles the frames twice (the first
makes one frame: it skips the temporal upsampling), so the call traced here is a later one, the
steady state, and a decode is charged T of them (the first over-counted: ``decode_calls``).

Structure (width ``dim`` = 96, ``mult`` (1, 2, 4, 4), 2 + 1 residual blocks per stage):

* the latent's 1x1x1 causal convolution (``z_dim`` -> ``z_dim``; the official code runs it once
  on the whole latent: the same work as once per call on one frame);
* a 3x3x3 causal convolution to 4 ``dim``; a middle of residual block, one-head self-attention
  over the pixels of each frame (``to_qkv`` and ``proj`` 1x1 convolutions), residual block;
* four stages of three residual blocks (widths 4, 4, 2, 1 x ``dim``); after each of the first
  three an upsampling: nearest-exact 2x in height and width (in float32) and a 3x3 convolution
  that halves the width, the first two preceded by a (3, 1, 1) causal convolution to twice the
  channels whose halves interleave into twice the frames;
* a head of RMS norm, SiLU and a 3x3x3 causal convolution to 3 channels; the video clamped to
  [-1, 1].

A residual block: RMS norm, SiLU, 3x3x3 causal convolution, RMS norm, SiLU, 3x3x3 causal
convolution, plus the input (through a 1x1x1 convolution where the width changes). The RMS norm
is an L2 normalisation over the channels times sqrt(channels) and a learned scale. A causal
convolution with a temporal kernel of 3 joins the two cached frames in front of its input (a
concatenation), pads height and width by one (``F.pad``: a copy in PyTorch) and convolves
unpadded; the frames it caches for the next call are the last two of its input (a copy). The
caches are buffers here (state carried between calls), the updated caches outputs of the call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Frames of its input a causal convolution keeps for the next call.
CACHE_FRAMES = 2


class CausalConv(nn.Module):
    """A convolution causal in time, of kernel (``time``, ``space``, ``space``); with a temporal
    kernel of 3 it reads ``CACHE_FRAMES`` frames of the previous call's input from its cache
    (a buffer of (1, in, 2, height, width)) and leaves the updated cache in ``updated``. Height
    and width are padded by a copy (``F.pad``, as Wan's code does), or with ``implicit`` inside
    the convolution (its zeros then no input: the taps on them are not counted)."""

    def __init__(self, cin: int, cout: int, time: int, space: int, height: int, width: int,
                 implicit: bool = False) -> None:
        super().__init__()
        side = space // 2
        self.conv = nn.Conv3d(cin, cout, (time, space, space), padding=(0, side, side) if implicit else 0)
        self.side = 0 if implicit else side
        self.cached = time > 1
        if self.cached:
            self.register_buffer("cache", torch.zeros(1, cin, CACHE_FRAMES, height, width), persistent=False)
        self.updated: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.cached:
            frames = x.shape[2]
            self.updated = (x[:, :, -CACHE_FRAMES:].clone() if frames >= CACHE_FRAMES
                            else torch.cat([self.cache[:, :, -1:], x], dim=2))
            x = torch.cat([self.cache, x], dim=2)
        if self.side:
            x = F.pad(x, (self.side,) * 4)
        return self.conv(x)


class RMSNorm(nn.Module):
    """Wan-VAE's norm: ``x / max(||x||, eps) * sqrt(C) * gamma`` over the channels (dim 1)."""

    def __init__(self, channels: int, dims: int) -> None:
        super().__init__()
        self.scale = channels ** 0.5
        self.gamma = nn.Parameter(torch.ones(channels, *(1,) * dims))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, height: int, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(cin, 3), RMSNorm(cout, 3)
        self.conv1 = CausalConv(cin, cout, 3, 3, height, width)
        self.conv2 = CausalConv(cout, cout, 3, 3, height, width)
        self.shortcut = CausalConv(cin, cout, 1, 1, height, width) if cin != cout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return self.shortcut(x) + self.conv2(F.silu(self.norm2(h)))


class AttentionBlock(nn.Module):
    """One-head self-attention over the pixels of each frame. The official code calls PyTorch's
    SDPA, in float32 with a head of 4 ``dim`` (384): no flash-attention kernel takes either, so
    it is written out here (scores, softmax, values) and charged as such."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = RMSNorm(channels, 2)
        self.to_qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(frames)).reshape(b * t, 3 * c, h * w).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)                                     # (bt, hw, c) each
        scores = torch.einsum("bqc,bkc->bqk", q, k) * (1.0 / math.sqrt(c))
        out = torch.einsum("bqk,bkc->bqc", scores.softmax(dim=-1), v).transpose(1, 2).reshape(b * t, c, h, w)
        return x + self.proj(out).reshape(b, t, c, h, w).transpose(1, 2)


class Upsample(nn.Module):
    """2x in height and width (nearest-exact, in float32) and a 3x3 convolution halving the width;
    with ``temporal``, first a (3, 1, 1) causal convolution to twice the channels whose two halves
    interleave into twice the frames."""

    def __init__(self, channels: int, temporal: bool, height: int, width: int) -> None:
        super().__init__()
        self.time_conv = CausalConv(channels, 2 * channels, 3, 1, height, width) if temporal else None
        self.conv = nn.Conv2d(channels, channels // 2, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        if self.time_conv is not None:
            b, c, t, h, w = x.shape
            x = torch.stack(self.time_conv(x).reshape(b, 2, c, t, h, w).unbind(1), dim=3)
            x = x.reshape(b, c, 2 * t, h, w)
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        # at a scale of 2 "nearest" picks the pixels the official "nearest-exact" picks (i // 2);
        # torch-xla lowers "nearest" without reading a value
        frames = F.interpolate(frames.float(), scale_factor=2.0, mode="nearest").type_as(x)
        out = self.conv(frames)
        return out.reshape(b, t, c // 2, 2 * h, 2 * w).transpose(1, 2)


class WanVAEDecoder(nn.Module):
    """One steady-state call of Wan-VAE's decode: ``latent`` (1, z_dim, 1, height, width) ->
    (video (1, 3, 4, 8 height, 8 width), the updated caches)."""

    def __init__(self, dim: int, z_dim: int, mult: tuple[int, ...], res_blocks: int,
                 temporal: tuple[bool, ...], height: int, width: int) -> None:
        super().__init__()
        dims = [dim * m for m in (mult[-1], *reversed(mult))]
        self.post_quant = CausalConv(z_dim, z_dim, 1, 1, height, width)
        self.conv_in = CausalConv(z_dim, dims[0], 3, 3, height, width)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0], height, width), AttentionBlock(dims[0]),
                                    ResidualBlock(dims[0], dims[0], height, width))
        layers: list[nn.Module] = []
        for stage, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            cin = cin // 2 if stage else cin  # the previous upsampling halved the width
            for block in range(res_blocks + 1):
                layers.append(ResidualBlock(cin if block == 0 else cout, cout, height, width))
            if stage < len(mult) - 1:
                layers.append(Upsample(cout, temporal[stage], height, width))
                height, width = 2 * height, 2 * width
        self.stages = nn.Sequential(*layers)
        self.norm_out = RMSNorm(dims[-1], 3)
        self.conv_out = CausalConv(dims[-1], 3, 3, 3, height, width)

    def forward(self, latent: Tensor) -> tuple[Tensor, ...]:
        x = self.conv_in(self.post_quant(latent))
        x = self.stages(self.middle(x))
        video = self.conv_out(F.silu(self.norm_out(x))).clamp(-1.0, 1.0)
        caches = [m.updated for m in self.modules() if isinstance(m, CausalConv) and m.cached]
        return (video, *caches)


def wan_vae_decoder(dim: int = 4, z_dim: int = 4, mult: tuple[int, ...] = (1, 2, 4, 4), res_blocks: int = 2,
                    temporal: tuple[bool, ...] = (True, True, False), height: int = 4,
                    width: int = 4) -> WanVAEDecoder:
    """Wan-VAE's decoder for one latent frame of ``height`` x ``width`` (tiny by default;
    ``companions.WAN_VAE_DECODER`` is the released size)."""
    return WanVAEDecoder(dim, z_dim, tuple(mult), res_blocks, tuple(temporal), height, width)
