"""Megatron tensor parallelism with sequence parallelism (Megatron-SP) on an (X, Y) mesh.

The residual stream -- x, the norms, the modulation, the gates and residual adds -- is split on
tokens exactly as in the sequence-parallel strategies (batch on x, T or S on y, token order
chosen as in ds_ulysses).  Each attention and the MLP are Megatron tensor parallel over y:
column-split qkv / cross q / cross kv / fc1 (head-major fused rows, so every device holds whole
heads), row-split proj / fc2.  The input of each column-parallel linear is all-gathered over y
(``attn_in``, ``cross_in``, ``mlp_in`` pinned whole), and the partial sums of each row-parallel
linear are reduce-scattered back to the token split (``proj_out`` in the attention's own layout,
``cross_proj_out``, ``mlp_out``): Megatron's all-reduce becomes an all-gather + a
reduce-scatter.  Per block pair: 6 all-gathers and 6 reduce-scatters of the (B/X, N, h) activation
over y.  The caption K/V projection runs for the local heads on every x group (the one repeated
GEMM term, 4*B*TOKEN*h^2*(X-1)/n per block).
"""

from __future__ import annotations

from tracing.strategies.base import Spec, linear_spec, register
from tracing.strategies.ds_ulysses import SequenceParallel
from tracing.strategies.kernels import einsum_attention

GATHERED = ("x", None, None)  # (B, N, h) / (B', L, h): batch on x, whole on y


@register
class MegatronSP(SequenceParallel):
    name = "megatron_sp"
    summary = ("Megatron tensor parallel over y with the residual stream split on tokens: "
               "all-gather before, reduce-scatter after each attention / MLP")

    def block_parameter_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        return linear_spec(name, "y")

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("attn_in", "cross_in", "mlp_in"):
            return GATHERED
        if point in ("q", "k", "v", "attn_kernel_out"):
            return ("x", "y", None, None)
        if point in ("attn_out", "mlp_hidden"):
            return ("x", None, "y")
        if point in ("cross_q", "cross_kernel_out"):  # (1, heads, B*N, hd)
            return (None, "y", "x", None)
        if point == "cross_cond":
            return (None, None, None)
        if point in ("cross_k", "cross_v"):
            return (None, "y", None, None)
        if point == "cross_out":  # (1, B*N, h)
            return (None, "x", "y")
        return self.token_spec(point, shape, temporal)  # x, proj_out, cross/mlp outputs

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention

    def cross_attention_fn(self, mesh):
        return einsum_attention
