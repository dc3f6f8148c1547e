"""HunyuanVideo's VAE decoder, one call as the official tiled decode makes it: a whole temporal
tile of latent frames of one spatial tile in, its video frames out, no cache (written from the
HunyuanVideo paper's description of its causal 3D VAE and the released configuration:
docs/sources.md, "Video DiTs: outside the loop"; nothing copied).

The official decode (``sample_video.py``, VAE tiling on by default, float16) cuts the latent in
time into tiles of 16 + 1 latent frames every 12 and each of those in space into tiles of 32 x 32
latent pixels every 24; every tile is one call of the decoder (``post_quant_conv`` and the
decoder), the overlaps blended. ``companions.Companions.decode_calls`` counts the calls of each
shape.

Structure (released widths 128, 256, 512, 512; 2 + 1 residual blocks per decoder stage; 32 groups):

* the latent's 1x1x1 convolution (``post_quant_conv``, 16 -> 16);
* a 3x3x3 causal convolution to 512; a middle of residual block, one-head self-attention over all
  the tile's pixels and frames (a frame attends to itself and the frames before it), residual
  block;
* four stages of three residual blocks (widths 512, 512, 256, 128); after each of the first three
  an upsampling: nearest 2x in height and width (the second and third also 2x in time, the first
  frame kept single) and a 3x3x3 causal convolution at the same width;
* a head of group norm, SiLU and a 3x3x3 causal convolution to 3 channels.

A residual block: group norm, SiLU, 3x3x3 causal convolution, group norm, SiLU, 3x3x3 causal
convolution, plus the input (through a 1x1x1 convolution where the width changes). A causal
convolution pads its input by replication (``F.pad``, a copy): two copies of the first frame in
front, one pixel each side in height and width; then convolves unpadded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.zoo.videodit.cogvideox_vae import GroupNorm, nearest


class CausalConv(nn.Module):
    """A convolution causal in time, kernel (``k``, ``k``, ``k``), its input padded by replication
    (first frame twice in front, a pixel each side) for ``k`` = 3."""

    def __init__(self, cin: int, cout: int, k: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, k)
        self.pad = (k // 2, k // 2, k // 2, k // 2, k - 1, 0)

    def forward(self, x: Tensor) -> Tensor:
        if any(self.pad):
            x = F.pad(x, self.pad, mode="replicate")
        return self.conv(x)


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = GroupNorm(cin, groups), GroupNorm(cout, groups)
        self.conv1, self.conv2 = CausalConv(cin, cout, 3), CausalConv(cout, cout, 3)
        self.shortcut = CausalConv(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return self.shortcut(x) + self.conv2(F.silu(self.norm2(h)))


class AttentionBlock(nn.Module):
    """One-head self-attention over every pixel of every frame, causal by frame (an additive mask:
    the official code's SDPA takes it, so no flash-attention kernel: written out here)."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = GroupNorm(channels, groups)
        self.q, self.k, self.v, self.out = (nn.Linear(channels, channels) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, c, t, h, w = x.shape
        tokens = self.norm(x).reshape(b, c, t * h * w).transpose(1, 2)
        q, k, v = self.q(tokens), self.k(tokens), self.v(tokens)
        frame = torch.arange(t, device=x.device).repeat_interleave(h * w)
        mask = torch.zeros(t * h * w, t * h * w, dtype=x.dtype, device=x.device).masked_fill(
            frame[None, :] > frame[:, None], float("-inf"))
        scores = torch.einsum("bqc,bkc->bqk", q, k) * (1.0 / math.sqrt(c)) + mask
        out = torch.einsum("bqk,bkc->bqc", scores.float().softmax(dim=-1).type_as(v), v)
        return x + self.out(out).transpose(1, 2).reshape(b, c, t, h, w)


class Upsample(nn.Module):
    """Nearest 2x in height and width (with ``temporal`` also in time, the first frame kept single)
    and a 3x3x3 causal convolution at the same width."""

    def __init__(self, channels: int, temporal: bool) -> None:
        super().__init__()
        self.temporal = temporal
        self.conv = CausalConv(channels, channels, 3)

    def forward(self, x: Tensor) -> Tensor:
        _, _, t, h, w = x.shape
        frames = 2 * t - 1 if self.temporal and t > 1 else t
        return self.conv(nearest(x, frames, 2 * h, 2 * w))


class HunyuanVAEDecoder(nn.Module):
    """One call of HunyuanVideo's tiled decode: ``latent`` (1, z_dim, frames, height, width) of one
    tile -> video (1, 3, 1 + 4 (frames - 1), 8 height, 8 width)."""

    def __init__(self, widths: tuple[int, ...], z_dim: int, layers: int, groups: int, temporal: int) -> None:
        super().__init__()
        dims = list(reversed(widths))
        self.post_quant = nn.Conv3d(z_dim, z_dim, 1)
        self.conv_in = CausalConv(z_dim, dims[0], 3)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0], groups), AttentionBlock(dims[0], groups),
                                    ResidualBlock(dims[0], dims[0], groups))
        stages: list[nn.Module] = []
        cin = dims[0]
        for stage, cout in enumerate(dims):
            stages += [ResidualBlock(cin if block == 0 else cout, cout, groups) for block in range(layers + 1)]
            cin = cout
            if stage < len(dims) - 1:   # time upsampling in the last ``temporal`` of the upsampling stages
                stages.append(Upsample(cout, stage >= len(dims) - 1 - temporal))
        self.stages = nn.Sequential(*stages)
        self.norm_out = GroupNorm(dims[-1], groups)
        self.conv_out = CausalConv(dims[-1], 3, 3)

    def forward(self, latent: Tensor) -> Tensor:
        x = self.stages(self.middle(self.conv_in(self.post_quant(latent))))
        return self.conv_out(F.silu(self.norm_out(x)))


def hunyuan_vae_decoder(widths: tuple[int, ...] = (8, 16, 32, 32), z_dim: int = 4, layers: int = 2,
                        groups: int = 4, temporal: int = 2, height: int = 4,
                        width: int = 4) -> HunyuanVAEDecoder:
    """HunyuanVideo's decoder (tiny by default; ``companions.HUNYUAN_VAE_DECODER`` is the released
    size). ``height`` and ``width`` (the tile's, in latent pixels) size nothing: no cache; they are
    taken so that every VAE factory takes the tile's size."""
    return HunyuanVAEDecoder(tuple(widths), z_dim, layers, groups, temporal)
