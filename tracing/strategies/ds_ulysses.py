"""DeepSpeed-Ulysses sequence parallelism on an (X, Y) mesh: batch on X, sequence on Y.

Shared layout of the sequence-parallel strategies (``SequenceParallel``: ds_ulysses,
ring_attention, usp, megatron_sp).  Video tokens are split along the sequence (N = T*S) over Y,
the guidance batch over X; the residual stream x (B, N, h) is ``("x", Y, None)``.  A device holds
a contiguous range of the token axis, i.e. a range of its *major* factor, so the order of the
tokens is chosen per layout (``choose_token_order``):

* T % Y == 0: frame-major tokens (token t*S + s), split T: each device holds whole frames;
* else S % Y == 0: space-major tokens (token s*T + t), split S (as OpenSora's own sequence
  parallelism does);
* else: a StrategyError naming T, S and axis Y.

The self-attention over the split factor has its sequence split; the other one is local (its
batch B*major is split over (X, Y)).  The block linears are einsums (``BlockLinear``), so every
projection runs on the local tokens only.  A device holds B/X whole samples; when B/X > 1 (e.g.
a 1 x N mesh with the guidance batch B = 2) the merged B*major of the local attention and the
merged B*N of the cross-attention are no tiles of that layout (a contiguous chunk of B*major
is part of one sample's range, not a range of every sample), and GSPMD would reshuffle them with
all-gathers, all-to-alls and collective-permutes over pieces of Y.  So ds_ulysses and
opensora_sp keep the batch apart (``batch_apart``: the local attention runs on (B, major, minor,
h)) and attend from the cross-attention queries of each sample, (B, heads, N, hd), to the
caption keys of all samples under the block-diagonal mask (the same scores), which holds on any
X x Y mesh.

ds_ulysses, layout choices (each one pinned with a mark):
* split self-attention: q, k, v are computed sequence-split and resharded to a head split
  (``Reshard``: one all-to-all each over Y); the kernel output is pinned head-split and the
  output before ``proj`` sequence-split (one all-to-all back);
* cross-attention (OpenSora's sequence-parallel cross-attention): the queries (B, N, heads,
  hd) go from a token split to a head split (all-to-all), the caption K/V are projected
  head-split (every device projects the captions for its heads; weights replicated; a
  training step reads them through a copy of the local heads' rows, ``ReplicatedCopy``, so
  that its backward multiplies the K/V gradient by those rows only), the output (B, N, h) comes back
  (all-to-all).

Per block pair: 4 + 4 all-to-alls over Y, nothing else.  Each moves one (B/X, N/Y, h) buffer
of the device (q, k, v, the attention output, the cross queries, the cross output), so with
A = bytes of the whole (B, N, h) activation a pair moves 8 * A/(X*Y) * (Y-1)/Y per device.
"""

from __future__ import annotations

from models.opensora.token_order import major_axis_is_temporal
from tracing.strategies.base import (
    ReplicatedCopy,
    Reshard,
    Spec,
    Strategy,
    register,
)
from tracing.strategies.kernels import einsum_attention


class SequenceParallel(Strategy):
    """Shared layout of the sequence-parallel strategies (batch on x, sequence on y)."""

    #: Mesh axes that split the sequence (usp views y as ring x ulysses).
    seq_axes: tuple[str, ...] = ("y",)

    @property
    def seq(self):
        """The sequence split as a spec entry: one axis name or a tuple of them."""
        return self.seq_axes[0] if len(self.seq_axes) == 1 else self.seq_axes

    @property
    def tokens(self) -> tuple[str, ...]:
        """A flattened batch-major token axis (B*N, or B*major): batch on x, the rest on seq."""
        return ("x",) + self.seq_axes

    @property
    def x_seq(self) -> Spec:
        """(B, N, h), and (B*minor, major, h) of the split attention."""
        return ("x", self.seq, None)

    def sequence_split(self, temporal: bool) -> bool:
        """Whether the self-attention of a temporal (else spatial) block has its sequence split
        over y: the attention over the major factor of the token axis (T frame-major, S
        space-major)."""
        return temporal == major_axis_is_temporal(self.token_order)

    def attention_layout(self, temporal: bool) -> Spec:
        """(B', L, h) of a self-attention in the residual split: the sequence over y when it is
        the split attention, else the batch B*major over (x, y)."""
        return self.x_seq if self.sequence_split(temporal) else (self.tokens, None, None)

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name == "x":
            return self.x_seq
        if name in ("z", "t", "t_mlp"):
            return ("x",) + (None,) * (len(shape) - 1)
        return None

    def output_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        return self.x_seq if name == "x" else None

    def token_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        """Specs of the residual-stream points, shared by the sequence-parallel strategies."""
        if point in ("x", "mlp_in", "mlp_hidden", "mlp_out", "cross_in", "cross_proj_out"):
            return self.x_seq
        if point in ("attn_in", "attn_out", "proj_out"):
            if len(shape) == 4:  # (B, major, L, h) of the local attention, batch kept apart
                return ("x", self.seq, None, None)
            return self.attention_layout(temporal)
        if point == "cross_out":  # (1, B*N, h)
            return (None, self.tokens, None)
        return None

    def ulysses_specs(self, point: str, shape: tuple[int, ...], temporal: bool, heads_axis,
                      rest=None) -> Spec | Reshard | None:
        """Ulysses exchange of the self- and cross-attention over ``heads_axis``: q, k, v of the
        split attention and the cross-attention queries move from the sequence split to a head
        split (``rest``: what still splits the sequence, e.g. usp's ring axis), the kernel
        outputs stay head-split; the local attention keeps its batch split.  Without ``rest``
        the cross-attention exchange is made per sample (see the module docstring)."""
        split = self.sequence_split(temporal)
        if point in ("q", "k", "v", "attn_kernel_out"):
            if not split:
                if len(shape) == 5:  # (B, major, heads, L, hd), batch kept apart
                    return ("x", self.seq, None, None, None)
                return (self.tokens, None, None, None)
            head_split = ("x", heads_axis, rest, None)
            if point == "attn_kernel_out":
                return head_split
            return Reshard(before=("x", None, self.seq, None), after=head_split)
        if rest is None:
            return self.per_sample_cross_specs(point, heads_axis)
        cross_rows = ("x", rest)
        if point == "cross_q":  # (1, heads, B*N, hd): tokens -> heads
            return Reshard(before=(None, None, self.tokens, None),
                           after=(None, heads_axis, cross_rows, None))
        if point == "cross_kernel_out":
            return (None, heads_axis, cross_rows, None)
        if point == "cross_cond":  # every caption on every device
            return (None, None, None)
        if point in ("cross_k", "cross_v"):  # projected for the local heads
            return (None, heads_axis, None, None)
        return None

    def per_sample_cross_specs(self, point: str, heads_axis) -> Spec | Reshard | None:
        """The cross-attention exchange with the batch kept apart (``batch_apart``): the
        queries (B, N, heads, hd) go tokens -> heads, the output (B, N, h) heads -> tokens, one
        all-to-all each; the attention runs on (B, heads, N, hd), a tile on any mesh."""
        if point == "cross_q_tokens":  # (B, N, heads, hd)
            return Reshard(before=("x", self.seq, None, None), after=("x", None, heads_axis, None))
        if point in ("cross_q", "cross_kernel_out"):  # (B, heads, N, hd)
            return ("x", heads_axis, None, None)
        if point == "cross_out":  # (B, N, h): heads -> tokens before proj
            return Reshard(before=("x", None, heads_axis), after=self.x_seq)
        if point == "cross_cond":  # every caption on every device
            return (None, None, None)
        if point in ("cross_k", "cross_v"):  # projected for the local heads
            return (None, heads_axis, None, None)
        return None


@register
class DeepSpeedUlysses(SequenceParallel):
    name = "ds_ulysses"
    summary = ("sequence parallel (batch on x, T or S on y); all-to-all to heads around the "
               "split self-attention and the cross-attention")
    batch_apart = True

    def activation_spec(self, point: str, shape: tuple[int, ...],
                        temporal: bool) -> Spec | Reshard | ReplicatedCopy | None:
        # Training: the caption K/V projection on the local heads' rows of the replicated
        # weight, its output and gradient pinned there; without it GSPMD multiplies the K/V
        # gradient, gathered to every head, by the whole weight in the backward.  (The forward
        # already projects the local heads: inference needs no pin.)
        if self.layout.training and point == "cross_kv":  # (1, B*TOKEN, 2h), head-major rows
            return (None, None, "y")
        if self.layout.training and point == "cross_kv_weight":  # (2h, h)
            return ReplicatedCopy(("y", None))
        spec = self.ulysses_specs(point, shape, temporal, "y")
        return spec if spec is not None else self.token_spec(point, shape, temporal)

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention  # heads split on y: keep (batch, heads) apart

    def cross_attention_fn(self, mesh):
        return einsum_attention
