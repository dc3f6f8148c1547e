"""CogVideoX's VAE decoder, one call as the official decode makes it: a few latent frames of one
spatial tile in, their video frames out, the causal convolutions reading the last two frames of
their input in the previous call from a cache (written from the CogVideoX paper's description of
its 3D causal VAE and the released ``vae/config.json``: docs/sources.md, "Video DiTs: outside the
loop"; nothing copied).

The official decode (``AutoencoderKLCogVideoX`` with tiling enabled, as the model card and the
CogVideo repository's demo run it) cuts the latent into overlapping spatial tiles of 30 x 45 latent
pixels (a stride of 25 x 36) and decodes each tile by calls of 2 latent frames, the first call
taking the odd frames over (13 latent frames: 3, then 2, 2, 2, 2, 2); the caches start afresh on
every tile. ``companions.Companions.decode_calls`` counts the calls of each shape.

Structure (released widths 128, 256, 256, 512; 3 + 1 residual blocks per decoder stage; 32 groups):

* a 3x3x3 causal convolution from the latent's 16 channels to 512; a middle of two residual blocks;
* four stages of four residual blocks (widths 512, 256, 256, 128); after each of the first three an
  upsampling: nearest 2x in height and width (the first two also 2x in time, the first frame of an
  odd count kept single) and a 3x3 convolution (implicit zero padding) at the same width;
* a head of spatial norm, SiLU and a 3x3x3 causal convolution to 3 channels.

A residual block: spatial norm, SiLU, 3x3x3 causal convolution, spatial norm, SiLU, 3x3x3 causal
convolution, plus the input (through a 1x1x1 convolution where the width changes). The spatial
norm conditions on the call's latent: a group norm of the features times one 1x1x1 convolution of
the latent plus another, the latent brought to the features' frames and pixels by nearest
interpolation (an odd frame count: the first latent frame to the first frame, the rest to the
rest). A causal convolution joins two frames in front of its input (the cache; the first call of
a tile repeats its first frame instead: the same copy, modelled as the cache) and pads height and
width implicitly by one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.zoo.videodit.wan_vae import CausalConv

#: The group norms' epsilon (``norm_eps`` of CogVideoX's and HunyuanVideo's released configurations).
NORM_EPS = 1e-6


def nearest(x: Tensor, frames: int, height: int, width: int) -> Tensor:
    """Nearest upsampling of (B, C, T, H, W) by integer factors to (frames, height, width); a
    frame count that is odd (and above one) keeps the first frame single and scales the rest."""
    b, c, t, h, w = x.shape
    if frames > 1 and frames % 2 == 1 and t > 1:
        return torch.cat([nearest(x[:, :, :1], 1, height, width),
                          nearest(x[:, :, 1:], frames - 1, height, width)], dim=2)
    ft, fh, fw = frames // t, height // h, width // w
    out = x[:, :, :, None, :, None, :, None].expand(b, c, t, ft, h, fh, w, fw)
    return out.reshape(b, c, frames, height, width)


def causal_conv(cin: int, cout: int, time: int, space: int, height: int, width: int) -> CausalConv:
    """CogVideoX's causal convolution: Wan-VAE's (two frames cached in front of the input, the
    last two of the joined input cached for the next call), height and width padded implicitly."""
    return CausalConv(cin, cout, time, space, height, width, implicit=True)


class GroupNorm(nn.Module):
    """Group norm over (channels / groups) x frames x pixels, written out, with a learned affine."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.groups = groups
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        grouped = x.reshape(shape[0], self.groups, -1)
        mean = grouped.mean(dim=-1, keepdim=True)
        var = (grouped - mean).square().mean(dim=-1, keepdim=True)
        normed = ((grouped - mean) * torch.rsqrt(var + NORM_EPS)).reshape(shape)
        affine = (-1,) + (1,) * (len(shape) - 2)
        return normed * self.weight.reshape(affine) + self.bias.reshape(affine)


class SpatialNorm(nn.Module):
    """Group norm of the features, scaled and shifted by two 1x1x1 convolutions of the latent."""

    def __init__(self, channels: int, z_dim: int, groups: int) -> None:
        super().__init__()
        self.norm = GroupNorm(channels, groups)
        self.conv_y = nn.Conv3d(z_dim, channels, 1)
        self.conv_b = nn.Conv3d(z_dim, channels, 1)

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        z = nearest(z, *x.shape[2:])
        return self.norm(x) * self.conv_y(z) + self.conv_b(z)


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, z_dim: int, groups: int, height: int, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = SpatialNorm(cin, z_dim, groups), SpatialNorm(cout, z_dim, groups)
        self.conv1 = causal_conv(cin, cout, 3, 3, height, width)
        self.conv2 = causal_conv(cout, cout, 3, 3, height, width)
        self.shortcut = nn.Conv3d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x, z)))
        return self.shortcut(x) + self.conv2(F.silu(self.norm2(h, z)))


class Upsample(nn.Module):
    """Nearest 2x in height and width (with ``temporal`` also in time, an odd count's first frame
    kept single) and a 3x3 convolution per frame at the same width."""

    def __init__(self, channels: int, temporal: bool) -> None:
        super().__init__()
        self.temporal = temporal
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, t, h, w = x.shape
        frames = 2 * t - t % 2 if self.temporal and t > 1 else t
        x = nearest(x, frames, 2 * h, 2 * w)
        out = self.conv(x.transpose(1, 2).reshape(b * frames, c, 2 * h, 2 * w))
        return out.reshape(b, frames, c, 2 * h, 2 * w).transpose(1, 2)


class CogVideoXVAEDecoder(nn.Module):
    """One call of CogVideoX's decode: ``latent`` (1, z_dim, frames, height, width) of one tile ->
    (video (1, 3, 4 frames (an odd count: 4 frames - 3), 8 height, 8 width), the updated caches)."""

    def __init__(self, widths: tuple[int, ...], z_dim: int, layers: int, groups: int, temporal: int,
                 height: int, width: int) -> None:
        super().__init__()
        dims = list(reversed(widths))
        self.conv_in = causal_conv(z_dim, dims[0], 3, 3, height, width)
        self.middle = nn.ModuleList(ResidualBlock(dims[0], dims[0], z_dim, groups, height, width) for _ in range(2))
        self.blocks = nn.ModuleList()
        self.upsamples = nn.ModuleList()
        cin = dims[0]
        for stage, cout in enumerate(dims):
            self.blocks.append(nn.ModuleList(
                ResidualBlock(cin if block == 0 else cout, cout, z_dim, groups, height, width)
                for block in range(layers + 1)))
            cin = cout
            if stage < len(dims) - 1:
                self.upsamples.append(Upsample(cout, stage < temporal))
                height, width = 2 * height, 2 * width
        self.norm_out = SpatialNorm(dims[-1], z_dim, groups)
        self.conv_out = causal_conv(dims[-1], 3, 3, 3, height, width)

    def forward(self, latent: Tensor) -> tuple[Tensor, ...]:
        x = self.conv_in(latent)
        for block in self.middle:
            x = block(x, latent)
        for stage, blocks in enumerate(self.blocks):
            for block in blocks:
                x = block(x, latent)
            if stage < len(self.upsamples):
                x = self.upsamples[stage](x)
        video = self.conv_out(F.silu(self.norm_out(x, latent)))
        caches = [m.updated for m in self.modules() if isinstance(m, CausalConv) and m.cached]
        return (video, *caches)


def cogvideox_vae_decoder(widths: tuple[int, ...] = (8, 16, 16, 32), z_dim: int = 4, layers: int = 3,
                          groups: int = 4, temporal: int = 2, height: int = 4,
                          width: int = 4) -> CogVideoXVAEDecoder:
    """CogVideoX's decoder for a tile of ``height`` x ``width`` latent pixels (tiny by default;
    ``companions.COGVIDEOX_VAE_DECODER`` is the released size: ``temporal`` is log2 of the
    temporal compression, the stages that upsample in time)."""
    return CogVideoXVAEDecoder(tuple(widths), z_dim, layers, groups, temporal, height, width)
