"""OpenSora v1.2's own sequence parallelism (``enable_sequence_parallelism``), as its code runs it.

What the official code does (read from hpcaitech/Open-Sora v1.2.0, ``models/stdit/stdit3.py`` and
``models/layers/blocks.py``): after the embedding, x (B, T, S, C) is cut along the spatial tokens
S over the sequence-parallel group (a local slice, no communication) and gathered back before the
final layer.  Only the *spatial* blocks use the sequence-parallel layers:

* spatial self-attention (``SeqParallelAttention``): the fused qkv output (B*T, S/p, 3, heads,
  hd) goes from the token split to a head split in **one** all-to-all (q, k and v together), and
  the attention output comes back in one all-to-all before ``proj``;
* spatial cross-attention (``SeqParallelMultiHeadCrossAttention``): the queries go tokens ->
  heads (all-to-all) and the output heads -> tokens (all-to-all); the caption K/V are projected
  for **all** heads on every device and the local heads sliced out (no communication);
* temporal blocks keep the plain ``Attention`` and ``MultiHeadCrossAttention``: each device holds
  every frame of its S/p spatial positions, so the temporal attention and its cross-attention are
  local (all heads, the whole caption K/V projection on every device).

Layout here, mesh (X, Y): the guidance batch on x (OpenSora runs the group over all devices: a
1 x n mesh), S over y, so the tokens are space-major (token s*T + t: each device holds whole
time series of S/Y spatial positions); S must divide by Y and the heads by Y.  The residual
stream (B, N, h) is ``("x", "y", None)``.  Per device the rearranges differ from the official
ones only in which attention copies x (the spatial one here, the temporal one there: the same
bytes).  The local attention and cross-attention keep the batch apart (``batch_apart``), so
nothing is resharded when B/X > 1.

Per block pair, with A = bytes of the whole (B, N, h) activation and n = X*Y, each collective an
all-to-all over Y of the device's buffer: the spatial qkv (3*A/n), the spatial attention output
(A/n), the spatial cross queries (A/n) and output (A/n): 4 all-to-alls moving 6*A/n * (Y-1)/Y
bytes per device, nothing else (ds_ulysses: 8 all-to-alls, 8*A/n * (Y-1)/Y).  The caption K/V
projection (4*B*TOKEN*h^2 FLOPs per block) runs unsplit on every device, as in the official code.
Once per model, the final layer's input x is all-gathered over Y (q*B/X*N*h bytes in all) and
the final layer runs on every token on each device, as OpenSora gathers S before it.  (Where
OpenSora embeds every patch on each device and then slices, the traced embedding is split.)
"""

from __future__ import annotations

from tracing.strategies.base import Reshard, Spec, register
from tracing.strategies.ds_ulysses import SequenceParallel
from tracing.strategies.kernels import einsum_attention


@register
class OpenSoraSequenceParallel(SequenceParallel):
    name = "opensora_sp"
    summary = ("OpenSora v1.2's sequence parallelism: S split over y (batch on x); all-to-all to "
               "heads around the spatial self- and cross-attention, temporal blocks local")
    batch_apart = True

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | Reshard | None:
        if point == "final_in":  # gather_forward_split_backward(x, dim=2): S gathered before it
            return ("x", None, None)
        spec = (self.temporal_spec(point, shape) if temporal
                else self.spatial_spec(point, shape))
        return spec if spec is not None else self.token_spec(point, shape, temporal)

    def spatial_spec(self, point: str, shape: tuple[int, ...]) -> Spec | Reshard | None:
        """SeqParallelAttention and SeqParallelMultiHeadCrossAttention."""
        if point == "qkv":  # (B*T, S, 3h), head-major rows: one all-to-all for q, k and v
            return Reshard(before=self.x_seq, after=("x", None, "y"))
        if point in ("q", "k", "v", "attn_kernel_out"):  # (B*T, heads, S, hd)
            return ("x", "y", None, None)
        if point == "cross_kv":  # every device projects the captions for all heads
            return (None, None, None)
        return self.per_sample_cross_specs(point, "y")

    def temporal_spec(self, point: str, shape: tuple[int, ...]) -> Spec | None:
        """Plain Attention and MultiHeadCrossAttention on the local S/Y positions, all heads."""
        if point in ("q", "k", "v", "attn_kernel_out"):  # (B, S, heads, T, hd)
            return ("x", "y", None, None, None)
        if point == "cross_q_tokens":  # (B, N, heads, hd)
            return ("x", "y", None, None)
        if point in ("cross_q", "cross_kernel_out"):  # (B, heads, N, hd)
            return ("x", None, "y", None)
        if point in ("cross_cond", "cross_kv"):
            return (None, None, None)
        if point in ("cross_k", "cross_v"):  # (1, heads, B*TOKEN, hd)
            return (None, None, None, None)
        if point == "cross_out":  # (B, N, h)
            return self.x_seq
        return None

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention

    def cross_attention_fn(self, mesh):
        return einsum_attention
