"""OpenSora v1.2's VAE decoders, re-implemented for tracing with torch-xla (and for timing the
same code eagerly on a GPU: ``benchmarks/gpu_vae_decode.py``).

What a generation's decode runs and how it is cut into calls: ``models.opensora.vae_config``.
Two modules, one per traced program:

* :class:`TemporalDecoder`: one chunk of 5 latent frames -> 17 frames (``VAE_Temporal_SD``'s
  ``post_quant_conv`` + decoder, after the pipeline's per-channel scale and shift): causal 3-D
  convolutions (the input padded in front in time, then an unpadded ``Conv3d``), residual blocks of
  GroupNorm, SiLU and convolution, and upsampling in time by a convolution to twice the channels
  followed by a depth-to-space rearrange;
* :class:`SpatialDecoder`: 4 frames -> 4 images (the SDXL VAE's ``post_quant_conv`` + decoder):
  a mid block (two residual blocks around a one-head self-attention over the pixels) and four
  up blocks of residual blocks, three of them ending in a nearest-neighbour 2x upsampling and a
  convolution.

Each op is the PyTorch call the official code makes, so that ``--exec torch`` charges one kernel
per call (grouped by the source locations torch-xla writes): ``F.conv2d``/``F.conv3d``,
``F.silu``, ``F.pad``, ``F.interpolate``, ``F.group_norm``; the GroupNorms, linear layers and
copies are marked as the one library kernel each is in PyTorch (torch-xla lowers a GroupNorm to
several ops). Weights are random: the cost does not depend on their values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.opensora.library_calls import library_call
from models.opensora.vae_config import FULL_VAE, VAEConfig

__all__ = ["SpatialDecoder", "TemporalDecoder"]


class GroupNorm(nn.Module):
    """nn.GroupNorm with affine parameters (statistics in float32 inside the kernel, the result in
    the input's dtype)."""

    def __init__(self, groups: int, channels: int, eps: float) -> None:
        super().__init__()
        if channels % groups:
            raise ValueError(f"GroupNorm: {channels} channels are no multiple of {groups} groups")
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    @library_call("group_norm")  # one kernel in PyTorch (native_group_norm)
    def forward(self, x: Tensor) -> Tensor:
        return torch.group_norm(x, self.groups, self.weight, self.bias, self.eps)


class Linear(nn.Linear):
    """nn.Linear, one cuBLASLt GEMM with its bias in the epilogue."""

    @library_call("linear")
    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class CausalConv3d(nn.Module):
    """A 3-D convolution causal in time: the input is padded by ``kernel - 1`` frames in front
    (and symmetrically in height and width), then convolved unpadded (OpenSora's CausalConv3d)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel, bias=bias)
        side = kernel // 2
        self.padding = (side, side, side, side, kernel - 1, 0)  # (W, W, H, H, T front, T back)

    def forward(self, x: Tensor) -> Tensor:
        if any(self.padding):
            x = F.pad(x, self.padding)  # a copy of the whole tensor in PyTorch
        return self.conv(x)


class TemporalResBlock(nn.Module):
    """GroupNorm, SiLU, 3x3x3 convolution, twice; a 1x1x1 convolution on the shortcut when the
    width changes. The convolutions have no bias."""

    def __init__(self, in_channels: int, out_channels: int, config: VAEConfig) -> None:
        super().__init__()
        groups, eps = config.temporal_groups, config.temporal_eps
        self.norm1 = GroupNorm(groups, in_channels, eps)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, bias=False)
        self.norm2 = GroupNorm(groups, out_channels, eps)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, bias=False)
        self.conv3 = (CausalConv3d(in_channels, out_channels, 1, bias=False)
                      if in_channels != out_channels else None)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        shortcut = self.conv3(x) if self.conv3 is not None else x
        return h + shortcut


@library_call("copy")
def depth_to_time(x: Tensor, factor: int) -> Tensor:
    """(B, C*factor, T, H, W) -> (B, C, T*factor, H, W), channel c*factor + k becoming frame
    t*factor + k (einops' ``B (C ts) T H W -> B C (T ts) H W``): a copy in PyTorch."""
    b, c, t, h, w = x.shape
    x = x.reshape(b, c // factor, factor, t, h, w).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, c // factor, t * factor, h, w)


class TemporalDecoder(nn.Module):
    """One chunk of the temporal VAE's decode: (B, 4, 5, h, w) latent -> (B, 4, 17, h, w)."""

    def __init__(self, config: VAEConfig = FULL_VAE) -> None:
        super().__init__()
        self.config = config
        latent, filters = config.latent_channels, config.temporal_filters
        widths = [filters * m for m in config.temporal_multipliers]
        self.post_quant_conv = CausalConv3d(latent, latent, 1)
        self.conv1 = CausalConv3d(latent, widths[-1], 3)
        self.res_blocks = nn.ModuleList(TemporalResBlock(widths[-1], widths[-1], config)
                                        for _ in range(config.temporal_res_blocks))
        # Levels from the widest down; level i > 0 ends in an upsampling where the encoder's
        # level i - 1 downsampled in time.
        self.levels = nn.ModuleList()
        self.upsamplers = nn.ModuleList()
        width = widths[-1]
        for level in reversed(range(len(widths))):
            blocks = nn.ModuleList()
            for _ in range(config.temporal_res_blocks):
                blocks.append(TemporalResBlock(width, widths[level], config))
                width = widths[level]
            self.levels.append(blocks)
            upsamples = level > 0 and config.temporal_downsample[level - 1]
            self.upsamplers.append(CausalConv3d(width, 2 * width, 3) if upsamples else nn.Identity())
        self.norm = GroupNorm(config.temporal_groups, width, config.temporal_eps)
        self.conv_out = CausalConv3d(width, latent, 3)
        per_channel = (1, -1, 1, 1, 1)
        self.register_buffer("scale", torch.tensor(config.scale).view(per_channel), persistent=False)
        self.register_buffer("shift", torch.tensor(config.shift).view(per_channel), persistent=False)

    def forward(self, z: Tensor) -> Tensor:
        x = z * self.scale.to(z.dtype) + self.shift.to(z.dtype)
        x = self.conv1(self.post_quant_conv(x))
        for block in self.res_blocks:
            x = block(x)
        for blocks, upsampler in zip(self.levels, self.upsamplers, strict=True):
            for block in blocks:
                x = block(x)
            if isinstance(upsampler, CausalConv3d):
                x = depth_to_time(upsampler(x), 2)
        x = self.conv_out(F.silu(self.norm(x)))
        return x[:, :, self.config.time_padding:]


class SpatialResBlock(nn.Module):
    """diffusers' ResnetBlock2D without a time embedding: GroupNorm, SiLU, 3x3 convolution,
    twice; a 1x1 convolution on the shortcut when the width changes; the sum divided by the
    output scale factor (1.0: still a kernel in PyTorch)."""

    def __init__(self, in_channels: int, out_channels: int, config: VAEConfig) -> None:
        super().__init__()
        groups, eps = config.spatial_groups, config.spatial_eps
        self.norm1 = GroupNorm(groups, in_channels, eps)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = GroupNorm(groups, out_channels, eps)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = (nn.Conv2d(in_channels, out_channels, 1)
                              if in_channels != out_channels else None)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        shortcut = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        return (shortcut + h) / 1.0


class SpatialAttention(nn.Module):
    """The mid block's self-attention over the H*W pixels of each frame (diffusers' Attention
    with a GroupNorm, one head of all channels), plus the residual."""

    def __init__(self, channels: int, config: VAEConfig) -> None:
        super().__init__()
        self.heads = channels // config.spatial_attention_head_dim
        self.group_norm = GroupNorm(config.spatial_groups, channels, config.spatial_eps)
        self.to_q, self.to_k, self.to_v = (Linear(channels, channels) for _ in range(3))
        self.to_out = Linear(channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        tokens = self.group_norm(x.reshape(b, c, h * w)).transpose(1, 2)  # (B, HW, C)
        head_dim = c // self.heads

        def split(t: Tensor) -> Tensor:
            return t.reshape(b, h * w, self.heads, head_dim).transpose(1, 2)

        q, k, v = split(self.to_q(tokens)), split(self.to_k(tokens)), split(self.to_v(tokens))
        scores = (q @ k.transpose(-2, -1)) * head_dim ** -0.5
        out = scores.softmax(dim=-1) @ v
        out = self.to_out(out.transpose(1, 2).reshape(b, h * w, c))
        return out.transpose(1, 2).reshape(b, c, h, w) + x


class SpatialDecoder(nn.Module):
    """One spatial decode call: (F, 4, h, w) latent frames -> (F, 3, 8h, 8w) images, the latent
    first divided by the SDXL VAE's scaling factor."""

    def __init__(self, config: VAEConfig = FULL_VAE) -> None:
        super().__init__()
        self.config = config
        widths = list(reversed(config.spatial_block_channels))
        latent = config.latent_channels
        self.post_quant_conv = nn.Conv2d(latent, latent, 1)
        self.conv_in = nn.Conv2d(latent, widths[0], 3, padding=1)
        self.mid = nn.ModuleList([SpatialResBlock(widths[0], widths[0], config),
                                  SpatialAttention(widths[0], config),
                                  SpatialResBlock(widths[0], widths[0], config)])
        self.up_blocks = nn.ModuleList()
        self.upsamplers = nn.ModuleList()
        width = widths[0]
        for index, out_width in enumerate(widths):
            blocks = nn.ModuleList()
            for _ in range(config.spatial_layers_per_block + 1):
                blocks.append(SpatialResBlock(width, out_width, config))
                width = out_width
            self.up_blocks.append(blocks)
            last = index == len(widths) - 1
            self.upsamplers.append(nn.Identity() if last else nn.Conv2d(width, width, 3, padding=1))
        self.norm_out = GroupNorm(config.spatial_groups, width, config.spatial_eps)
        self.conv_out = nn.Conv2d(width, config.image_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        x = self.conv_in(self.post_quant_conv(z / self.config.scaling_factor))
        for module in self.mid:
            x = module(x)
        for blocks, upsampler in zip(self.up_blocks, self.upsamplers, strict=True):
            for block in blocks:
                x = block(x)
            if isinstance(upsampler, nn.Conv2d):
                x = upsampler(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(x)))
