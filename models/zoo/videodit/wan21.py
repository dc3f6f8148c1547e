"""Wan 2.1's text-to-video transformer (docs/videodit.md; configuration sources in
docs/sources.md): a 3-D patch convolution (1, 2, 2) over 16-channel latents, a T5 text embedding
(Linear 4096 -> h, GELU tanh, Linear h -> h), a timestep embedding (256 sinusoidal frequencies ->
Linear -> SiLU -> Linear) projected once to six modulation vectors (SiLU -> Linear h -> 6h) that
each block adds to its own learned table; blocks of

    x += gate1 * self_attn(modulate(norm1(x)))      q, k, v, o Linear h -> h; RMSNorm over all of
                                                    h on q and k; 3-D RoPE on q and k
    x += cross_attn(norm3(x), text)                 q from x, k and v from the 512 text tokens
    x += gate2 * ffn(modulate(norm2(x)))            Linear h -> ffn, GELU tanh, Linear ffn -> h

and a head (modulated LayerNorm, Linear h -> 16 * 1 * 2 * 2). The official sampler runs the
conditional and the unconditional branch of classifier-free guidance as two calls of batch one;
traced here as one batch of two (the same work; CFG parallel puts the two on two device groups).

Inputs: ``latents`` (B, 16, T, H, W), ``t`` (B,), ``text`` (B, 512, 4096) (the T5 encoder's
output, padded to the text length as the official code pads it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.zoo.videodit.layers import (
    AttentionCore,
    LayerNorm,
    Linear,
    Mark,
    Mlp,
    RMSNorm,
    StageShift,
    heads,
    install_stale,
    layer_norm,
    modulate,
    rope_3d,
    sinusoidal,
)

EPS = 1e-6
ROPE_THETA = 10000.0


def rope_dims(head_dim: int) -> tuple[int, int, int]:
    """Wan's cut of a head: rows and columns 2 * (D // 6) each, frames the rest."""
    side = 2 * (head_dim // 6)
    return head_dim - 2 * side, side, side


class Attention(nn.Module):
    def __init__(self, dim: int, count: int, *, rope: bool, ring: int = 1) -> None:
        super().__init__()
        self.heads, self.rope = count, rope
        self.q_proj, self.k_proj, self.v_proj = Linear(dim, dim), Linear(dim, dim), Linear(dim, dim)
        self.o_proj = Linear(dim, dim)
        self.norm_q, self.norm_k = RMSNorm(dim, EPS), RMSNorm(dim, EPS)
        self.core = AttentionCore(ring)

    def forward(self, x: Tensor, context: Tensor, grid: tuple[int, int, int]) -> Tensor:
        q = heads(self.norm_q(self.q_proj(x)), self.heads)
        k = heads(self.norm_k(self.k_proj(context)), self.heads)
        v = heads(self.v_proj(context), self.heads)
        if self.rope:
            dims = rope_dims(q.shape[-1])
            q, k = rope_3d(q, grid, dims, ROPE_THETA), rope_3d(k, grid, dims, ROPE_THETA)
        return self.o_proj(self.core(q, k, v).flatten(-2))


class Block(nn.Module):
    def __init__(self, dim: int, ffn: int, count: int, ring: int) -> None:
        super().__init__()
        self.self_attn = Attention(dim, count, rope=True, ring=ring)
        self.norm3 = LayerNorm(dim, EPS)
        self.cross_attn = Attention(dim, count, rope=False)
        self.mlp = Mlp(dim, ffn)
        self.modulation = nn.Parameter(torch.zeros(1, 6, dim))

    def forward(self, x: Tensor, e: Tensor, text: Tensor, grid: tuple[int, int, int]) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + e).unbind(dim=1)
        y = modulate(layer_norm(x, EPS), shift1, scale1)
        x = x + gate1[:, None] * self.self_attn(y, y, grid)
        x = x + self.cross_attn(self.norm3(x), text, grid)
        return x + gate2[:, None] * self.mlp(modulate(layer_norm(x, EPS), shift2, scale2))


class Wan21(nn.Module):
    def __init__(self, *, dim: int, ffn: int, heads_count: int, layers: int, in_channels: int,
                 text_dim: int, frequencies: int, patch: tuple[int, int, int],
                 ring: int, stages: int) -> None:
        super().__init__()
        if dim % heads_count:
            raise ValueError(f"dim {dim} must be a multiple of heads {heads_count}")
        self.frequencies = frequencies
        self.patch_embedding = nn.Conv3d(in_channels, dim, kernel_size=patch, stride=patch)
        self.text_embedding = Mlp(text_dim, dim, dim)
        self.time_embedding = Mlp(frequencies, dim, dim, activation="silu")
        self.time_projection = Linear(dim, 6 * dim)
        self.tokens = Mark()
        self.blocks = nn.ModuleList(Block(dim, ffn, heads_count, ring) for _ in range(layers))
        self.handoff = StageShift(stages)
        self.head_modulation = nn.Parameter(torch.zeros(1, 2, dim))
        self.head = Linear(dim, in_channels * patch[0] * patch[1] * patch[2])
        self.output = Mark()

    def forward(self, latents: Tensor, t: Tensor, text: Tensor, stale_k: Tensor | None = None,
                stale_v: Tensor | None = None) -> Tensor:
        x = self.patch_embedding(latents)
        grid = tuple(x.shape[2:])
        x = self.tokens(x.flatten(2).transpose(1, 2))
        install_stale([block.self_attn.core for block in self.blocks], stale_k, stale_v, x.shape[1])
        time = self.time_embedding(sinusoidal(t, self.frequencies).to(x.dtype))
        e = self.time_projection(nn.functional.silu(time)).unflatten(-1, (6, -1))
        context = self.text_embedding(text)
        for block in self.blocks:
            x = block(x, e, context, grid)
        x = self.handoff(x)
        shift, scale = (self.head_modulation + time[:, None]).unbind(dim=1)
        return self.output(self.head(modulate(layer_norm(x, EPS), shift, scale)))


def wan21(dim: int = 64, ffn: int = 160, heads: int = 4, layers: int = 2, in_channels: int = 4,
          text_dim: int = 32, frequencies: int = 32, patch: tuple[int, int, int] = (1, 2, 2), ring: int = 1,
          stages: int = 1) -> Wan21:
    """Wan 2.1 (tiny by default: width 64, 4 heads of 16, 2 blocks; ``configs.WAN21_14B`` and
    ``WAN21_1_3B`` are the released sizes). ``ring``: the self-attention as ring attention over
    that many sequence blocks (``layers.AttentionCore``). ``stages``: PipeFusion's tick
    (``layers.StageShift``; the forward's ``stale_k``/``stale_v``: the self-attentions' K/V
    buffers, ``layers.install_stale``)."""
    return Wan21(dim=dim, ffn=ffn, heads_count=heads, layers=layers, in_channels=in_channels,
                 text_dim=text_dim, frequencies=frequencies, patch=tuple(patch),
                 ring=ring, stages=stages)
