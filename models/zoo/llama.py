"""A Llama-style decoder: token embedding, pre-norm blocks (RMSNorm; causal self-attention with
separate ``q_proj``, ``k_proj``, ``v_proj`` (grouped-query: ``kv_heads`` key/value heads shared
by ``heads / kv_heads`` query heads each), rotary position embedding on q and k, ``o_proj``;
RMSNorm; SwiGLU MLP ``down_proj(silu(gate_proj(x)) * up_proj(x))``), a final RMSNorm and
``lm_head``. No biases.

Input: token ids (B, S) int64; output: logits (B, S, vocab_size).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.zoo.layers import RMSNorm, attention, merge_heads, split_heads


def rotary(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding on (B, heads, L, head_dim), the half-split form (Llama's
    ``rotate_half``); the angles are computed from the positions on the fly (no buffer)."""
    length, head_dim = x.shape[-2], x.shape[-1]
    half = head_dim // 2
    inverse = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * inverse[None]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        head_dim = dim // heads
        self.heads, self.kv_heads = heads, kv_heads
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        q = rotary(split_heads(self.q_proj(x), self.heads))
        k = rotary(split_heads(self.k_proj(x), self.kv_heads))
        v = split_heads(self.v_proj(x), self.kv_heads)
        group = self.heads // self.kv_heads  # query heads per key/value head (repeat_kv)
        batch, _, length, head_dim = k.shape
        k = k[:, :, None].expand(batch, self.kv_heads, group, length, head_dim).reshape(
            batch, self.heads, length, head_dim)
        v = v[:, :, None].expand(batch, self.kv_heads, group, length, head_dim).reshape(
            batch, self.heads, length, head_dim)
        return self.o_proj(merge_heads(attention(q, k, v, causal=True)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = Mlp(dim, ffn)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int,
                 ffn: int) -> None:
        super().__init__()
        if hidden % heads or heads % kv_heads or (hidden // heads) % 2:
            raise ValueError(f"hidden {hidden}, heads {heads}, kv_heads {kv_heads}: heads must "
                             "divide hidden into an even head size, kv_heads divide heads")
        self.embed_tokens = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def llama(vocab_size: int = 256, hidden: int = 128, layers: int = 2, heads: int = 8,
          kv_heads: int = 4, ffn: int = 256) -> Llama:
    """A Llama-style decoder (tiny by default: 2 layers of width 128, 8 query and 4 key/value
    heads of 16, SwiGLU hidden 256)."""
    return Llama(vocab_size, hidden, layers, heads, kv_heads, ffn)
