"""A GPT-2-style decoder: token + learned position embeddings, pre-norm blocks (LayerNorm,
causal self-attention with a fused QKV ``attn.c_attn``, ``attn.c_proj``; LayerNorm, GELU MLP
``mlp.c_fc``, ``mlp.c_proj``), a final LayerNorm and an untied ``lm_head``.

Input: token ids (B, S) int64; output: logits (B, S, vocab_size). Per block and token the GEMMs
are QKV d x 3d, output projection d x d, MLP d x 4d and 4d x d, and attention's two products
over S keys; the head d x vocab_size once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.zoo.layers import FusedSelfAttention, GeluMlp, LayerNorm


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(dim)
        self.attn = FusedSelfAttention(dim, heads, causal=True, qkv_name="c_attn",
                                       out_name="c_proj")
        self.ln_2 = LayerNorm(dim)
        self.mlp = GeluMlp(dim, 4 * dim, up_name="c_fc", down_name="c_proj")

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, layers: int, heads: int,
                 max_positions: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
        self.wte = nn.Embedding(vocab_size, hidden)
        self.wpe = nn.Embedding(max_positions, hidden)
        self.h = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)[None]
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2(vocab_size: int = 256, hidden: int = 64, layers: int = 2, heads: int = 4,
         max_positions: int = 128) -> GPT2:
    """A GPT-2-style decoder (tiny by default: 2 layers of width 64, 4 heads)."""
    return GPT2(vocab_size, hidden, layers, heads, max_positions)
