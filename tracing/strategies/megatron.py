"""Megatron 1-D tensor parallelism over the whole mesh (both axes together, n devices).

qkv, cross-attention q/kv and fc1 are split by output features (columns), proj and fc2 by
input features (rows), so each attention works on heads/n heads and the MLP on 4h/n hidden units
locally; the row-split products are partial sums that need one all-reduce each: after the
self-attention, the cross-attention and the MLP (3 per block, 6 per block pair).  The residual
stream x, the caption y and the embeddings stay replicated.
"""

from __future__ import annotations

from tracing.strategies.base import ALL_DEVICES, Spec, Strategy, linear_spec, register
from tracing.strategies.kernels import einsum_attention

HEAD_SPLIT = (None, ALL_DEVICES, None, None)  # (batch, heads, L, head_dim)
FEATURE_SPLIT = (None, None, ALL_DEVICES)  # (batch, L, features)
REPLICATED_3D = (None, None, None)


@register
class Megatron(Strategy):
    name = "megatron"
    summary = "1-D tensor parallel: column-split qkv/q/kv/fc1, row-split proj/fc2; 6 all-reduces per block pair"

    def block_parameter_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        return linear_spec(name, ALL_DEVICES)

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("q", "k", "v", "cross_q", "cross_k", "cross_v"):
            return HEAD_SPLIT
        if point in ("attn_out", "cross_out", "mlp_hidden"):
            return FEATURE_SPLIT
        if point in ("x", "proj_out"):
            # Pin the sum right after each row-split projection: an all-reduce, not a
            # reduce-scatter whose all-gather GSPMD could move elsewhere.
            return REPLICATED_3D
        return None

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention  # heads split: keep (batch, heads) apart, see kernels.py

    def cross_attention_fn(self, mesh):
        return einsum_attention
