"""Unified sequence parallelism (USP): ring attention x DeepSpeed-Ulysses over the sequence axis.

Mesh axis y (Y devices) is viewed as ``ring x ulysses`` (ring major) on a 3-axis mesh
``("x", "ring", "ulysses")`` over the same device ids; the sequence is split over both (the
token order is chosen as in ds_ulysses, over all Y devices).  Around the split self-attention,
q, k and v go from the sequence split to a head split over ``ulysses`` (all-to-all inside each
Ulysses group), keeping the sequence split over ``ring``; the attention is then a ring over the
``ring`` axis with the local heads (2*(ring-1) collective-permutes), and its output comes back
with one all-to-all.  The cross-attention does the Ulysses exchange of ds_ulysses over
``ulysses`` (queries and output); the caption K/V are projected for the local heads and a
1/ring slice of the captions (``cross_kv`` split over both) and all-gathered over ``ring``, so
the caption projection is split over all of y as in the other strategies.  In a training
step the projection reads copies of the replicated captions and weight holding only those rows
(``ReplicatedCopy``), so that the backward's products stay on them too (else GSPMD gathers the
K/V gradient and multiplies it by the whole weight, or by every caption, on each device).  ring = 1 is
ds_ulysses' layout, ulysses = 1 ring_attention's self-attention.

Degrees: ``--ring-degree`` / ``--ulysses-degree`` (or ``ring_degree`` / ``ulysses_degree`` in
the pipeline TOML); given one, the other is Y / it; given none, ring = 2 when Y is even (else
Y).  Their product must be Y and ulysses must divide the heads.
"""

from __future__ import annotations

from models.opensora.theory import usp_degrees
from tracing.strategies.base import ReplicatedCopy, Reshard, Spec, register
from tracing.strategies.ds_ulysses import SequenceParallel
from tracing.strategies.kernels import einsum_attention
from tracing.strategies.ring_attention import make_ring_attention

USP_AXES = ("x", "ring", "ulysses")


@register
class UnifiedSequenceParallel(SequenceParallel):
    name = "usp"
    summary = ("sequence parallel over y = ring x ulysses: all-to-all to heads inside each Ulysses "
               "group, K/V ring over the ring groups")
    seq_axes = ("ring", "ulysses")

    def __init__(self, layout) -> None:
        super().__init__(layout)
        self.ring, self.ulysses = usp_degrees(layout.mesh_shape[1], layout.ring_degree,
                                              layout.ulysses_degree)

    def make_mesh(self):
        import numpy as np
        import torch_xla.distributed.spmd as xs

        x_devices, y_devices = self.layout.mesh_shape
        return xs.Mesh(np.arange(x_devices * y_devices), (x_devices, self.ring, self.ulysses),
                       USP_AXES)

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | Reshard | None:
        if point == "cross_kv":  # (1, B*TOKEN, 2h): caption rows over ring, heads over ulysses
            return (None, "ring", "ulysses")
        if self.layout.training and point == "cross_cond":
            # (1, B*TOKEN, h): the caption rows this ring rank projects (the forward already
            # projects only them: inference needs no pin)
            return ReplicatedCopy((None, "ring", None))
        if self.layout.training and point == "cross_kv_weight":
            # (2h, h): the local heads' rows of the replicated weight
            return ReplicatedCopy(("ulysses", None))
        spec = self.ulysses_specs(point, shape, temporal, "ulysses", rest="ring")
        return spec if spec is not None else self.token_spec(point, shape, temporal)

    def attention_fn(self, mesh, temporal: bool):
        if not self.sequence_split(temporal):
            return einsum_attention
        if self.ring == 1:
            return einsum_attention
        return make_ring_attention(mesh, "ring", "x", self.ring, heads_axis="ulysses")

    def cross_attention_fn(self, mesh):
        return einsum_attention
