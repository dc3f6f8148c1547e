"""Building blocks of the zoo's transformers, written with plain tensor ops (torch only).

``nn.LayerNorm`` lowers to XLA's ``batch-norm-training``, which hides the norm's ``rsqrt`` and
makes GSPMD gather a batch-split input (docs/tracing.md); these norms are written out instead.
Attention is ``softmax(q k^T * scale + mask) v`` on (batch, heads, L, head_dim), no fused kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, with affine weight and bias, written out."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        variance = centred.pow(2).mean(-1, keepdim=True)
        return centred * torch.rsqrt(variance + self.eps) * self.weight + self.bias


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension (Llama's), written out."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(head_dim) [+ causal mask]) v on (batch, heads, L, head_dim)."""
    # einsum keeps (batch, heads) apart: ``@`` on 4-D tensors merges them into one batch
    # dimension, which is no tile of a head-split layout (GSPMD would gather the heads).
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        length = q.shape[-2]
        rows = torch.arange(length, device=q.device)
        future = rows[None, :] > rows[:, None]  # key index after the query's
        scores = scores.masked_fill(future, float("-inf"))
    probs = scores.float().softmax(dim=-1).to(v.dtype)
    return torch.einsum("bhqk,bhkd->bhqd", probs, v)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, L, heads * head_dim) -> (B, heads, L, head_dim)."""
    batch, length, features = x.shape
    return x.view(batch, length, heads, features // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, heads, L, head_dim) -> (B, L, heads * head_dim)."""
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


class FusedSelfAttention(nn.Module):
    """Self-attention with one fused QKV projection (GPT-2's ``c_attn``, ViT's ``qkv``).

    The fused output is head-major, (heads, 3, head_dim) per token: a contiguous split of its
    features over devices gives each device whole heads of q, k and v (tensor parallelism with
    no re-layout; OpenSora's (3, heads, head_dim) order would make GSPMD exchange them)."""

    def __init__(self, dim: int, heads: int, *, causal: bool, qkv_name: str = "qkv",
                 out_name: str = "proj") -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv_name, self.out_name = qkv_name, out_name
        self.add_module(qkv_name, nn.Linear(dim, 3 * dim))
        self.add_module(out_name, nn.Linear(dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, dim = x.shape
        qkv = getattr(self, self.qkv_name)(x)
        qkv = qkv.view(batch, length, self.heads, 3, dim // self.heads).permute(3, 0, 2, 1, 4)
        out = attention(qkv[0], qkv[1], qkv[2], causal=self.causal)
        return getattr(self, self.out_name)(merge_heads(out))


class GeluMlp(nn.Module):
    """Linear -> GELU (tanh) -> Linear."""

    def __init__(self, dim: int, hidden: int, *, up_name: str = "fc1",
                 down_name: str = "fc2") -> None:
        super().__init__()
        self.up_name, self.down_name = up_name, down_name
        self.add_module(up_name, nn.Linear(dim, hidden))
        self.add_module(down_name, nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.gelu(getattr(self, self.up_name)(x), approximate="tanh")
        return getattr(self, self.down_name)(hidden)
