"""2-D tensor parallelism on the (X, Y) mesh: batch on X, hidden on Y.

The residual stream x (B, N, h) lives split by batch over X and by hidden features over Y.
Each column-split linear (qkv, cross q/kv, fc1; weights split by output features over Y,
replicated over X) first all-gathers its input's hidden features over Y; each row-split linear
(proj, fc2; split by input features over Y) yields partial sums that a reduce-scatter over Y
both adds up and splits by hidden features again.  So Megatron's all-reduce becomes an
all-gather before and a reduce-scatter after each attention and MLP.  Attention runs on the
local heads (heads over Y) of the local samples (batch over X).

Layout choices: head-major fused qkv / kv rows (whole heads per device), the gathered inputs
and the hidden-split outputs pinned at every linear, the caption K/V projected for the local
heads (repeated over X: the one GEMM term above the model's count).  A hidden-split residual
stream also needs the LayerNorm statistics (mean, variance) summed over y: small f32
all-reduces of (B/X, N, 1) that come with the layout.
"""

from __future__ import annotations

from tracing.strategies.base import Spec, Strategy, linear_spec, register
from tracing.strategies.kernels import einsum_attention

HIDDEN_SPLIT = ("x", None, "y")  # (B, N, h) and (B', L, h)
GATHERED = ("x", None, None)  # the input of a column-split linear


@register
class TwoDimension(Strategy):
    name = "two_dimension"
    summary = "2-D tensor parallel: batch on x, hidden on y; all-gather + reduce-scatter per attention/MLP"

    def block_parameter_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        return linear_spec(name, "y")

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name == "x":
            return HIDDEN_SPLIT
        if name in ("z", "t", "t_mlp"):
            return ("x",) + (None,) * (len(shape) - 1)
        return None

    def output_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        return HIDDEN_SPLIT if name == "x" else None

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("attn_in", "cross_in", "mlp_in"):
            return GATHERED  # the all-gather before each column-split linear, pinned
        if point in ("x", "attn_out", "proj_out", "mlp_hidden", "cross_proj_out", "mlp_out"):
            return HIDDEN_SPLIT  # after a row-split linear: the reduce-scatter, pinned
        if point in ("q", "k", "v", "attn_kernel_out"):
            return ("x", "y", None, None)
        if point in ("cross_q", "cross_kernel_out"):  # (1, heads, B*N, hd): samples major in B*N
            return (None, "y", "x", None)
        if point == "cross_cond":
            return (None, None, None)
        if point in ("cross_k", "cross_v"):  # every caption, local heads
            return (None, "y", None, None)
        if point == "cross_out":  # (1, B*N, h)
            return (None, "x", "y")
        return None

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention

    def cross_attention_fn(self, mesh):
        return einsum_attention
