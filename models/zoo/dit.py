"""A DiT (diffusion transformer) with adaLN-Zero blocks: a patch convolution and learned position
embeddings, a timestep embedding (sinusoidal -> Linear -> SiLU -> Linear), blocks whose
LayerNorms (no affine) are modulated by shift/scale and whose attention and MLP outputs are gated,
all six from ``adaLN_modulation`` (SiLU -> Linear d -> 6d of the timestep embedding); a final
modulated LayerNorm and a linear projection back to patches.

Inputs: latents (B, channels, image, image) float and timesteps t (B,) float; output: the
predicted noise per patch, (B, patches, patch * patch * channels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.zoo.layers import FusedSelfAttention, GeluMlp


def layer_norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """LayerNorm without affine parameters, written out."""
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.attn = FusedSelfAttention(dim, heads, causal=False)
        self.mlp = GeluMlp(dim, mlp_ratio * dim)
        self.adaLN_modulation = nn.Linear(dim, 6 * dim)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
            self.adaLN_modulation(F.silu(c)).chunk(6, dim=-1)
        x = x + gate_msa[:, None] * self.attn(modulate(layer_norm(x), shift_msa, scale_msa))
        return x + gate_mlp[:, None] * self.mlp(modulate(layer_norm(x), shift_mlp, scale_mlp))


class DiT(nn.Module):
    def __init__(self, image: int, patch: int, channels: int, hidden: int, layers: int,
                 heads: int, mlp_ratio: int, frequencies: int) -> None:
        super().__init__()
        if image % patch or hidden % heads or frequencies % 2:
            raise ValueError(f"image {image} must be a multiple of patch {patch}, hidden "
                             f"{hidden} of heads {heads}, frequencies {frequencies} even")
        self.frequencies = frequencies
        self.x_embedder = nn.Conv2d(channels, hidden, kernel_size=patch, stride=patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, (image // patch) ** 2, hidden))
        self.t_embedder = nn.Sequential(nn.Linear(frequencies, hidden), nn.SiLU(),
                                        nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, mlp_ratio) for _ in range(layers))
        self.final_modulation = nn.Linear(hidden, 2 * hidden)
        self.final_linear = nn.Linear(hidden, patch * patch * channels)

    def timestep_embedding(self, t: Tensor) -> Tensor:
        half = self.frequencies // 2
        inverse = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device,
                                                              dtype=torch.float32) / half)
        angles = t.float()[:, None] * inverse[None]
        return torch.cat([angles.cos(), angles.sin()], dim=-1).to(t.dtype)

    def forward(self, latents: Tensor, t: Tensor) -> Tensor:
        x = self.x_embedder(latents).flatten(2).transpose(1, 2) + self.pos_embed
        c = self.t_embedder(self.timestep_embedding(t))
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_modulation(F.silu(c)).chunk(2, dim=-1)
        return self.final_linear(modulate(layer_norm(x), shift, scale))


def dit(image: int = 16, patch: int = 2, channels: int = 4, hidden: int = 64, layers: int = 2,
        heads: int = 4, mlp_ratio: int = 4, frequencies: int = 64) -> DiT:
    """A DiT with adaLN-Zero blocks (tiny by default: 16x16x4 latents in 2x2 patches, 64
    tokens, 2 layers of width 64, 4 heads)."""
    return DiT(image, patch, channels, hidden, layers, heads, mlp_ratio, frequencies)
