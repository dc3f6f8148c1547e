"""Data parallelism: the batch is split over the whole mesh, every weight is replicated.

The video tokens of a sample never leave their device, so the blocks need no collective. The
cross-attention flattens all samples' queries and captions into one sequence with a
block-diagonal mask; each device keeps every caption (y and the cross-attention k, v are
replicated) so its queries find their own caption locally.

A training step (``Layout.training``) lays the captions out otherwise: each device holds its
own samples' captions (y split on its sample-major rows) and projects only those; the caption K
and V are all-gathered for the flattened attention and their gradients reduce-scattered back.
Replicated, every device would repeat the caption K/V projection for all B captions in the
forward and in both products of the backward, and the backward would all-reduce the K/V
gradients: the same bytes as the all-gather plus the reduce-scatter.  Inference keeps the
replicated captions (a forward without collectives).
"""

from __future__ import annotations

from tracing.strategies.base import (
    ALL_DEVICES,
    Reshard,
    Spec,
    Strategy,
    register,
)

A = ALL_DEVICES


@register
class DataParallel(Strategy):
    name = "dp"
    summary = "data parallel: batch split over all devices, weights replicated; no collectives in the blocks"

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name in ("z", "t", "x", "t_mlp"):  # batch-major inputs
            return (A,) + (None,) * (len(shape) - 1)
        if name == "y" and self.layout.training:
            return self.caption_spec(shape)
        return None  # y (all captions), fps (one value)

    def output_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name in ("x", "t", "t_mlp", "out"):
            return (A,) + (None,) * (len(shape) - 1)
        if name == "y" and self.layout.training:
            return self.caption_spec(shape)
        return None

    @staticmethod
    def caption_spec(shape: tuple[int, ...]) -> Spec:
        """Training: each device holds its own samples' captions, (B, 1, TOKEN, C) split on B
        or the embedded (1, B*TOKEN, h) on its sample-major rows."""
        return (A, None, None, None) if len(shape) == 4 else (None, A, None)

    def activation_spec(self, point: str, shape: tuple[int, ...],
                        temporal: bool) -> Spec | Reshard | None:
        if point in ("x", "attn_in", "attn_out", "proj_out", "mlp_hidden", "q", "k", "v"):
            return (A,) + (None,) * (len(shape) - 1)  # (batch-major, ...)
        if point in ("cross_q",):  # (1, heads, B*N, hd): samples are the major part of B*N
            return (None, None, A, None)
        if point == "cross_out":  # (1, B*N, h)
            return (None, A, None)
        if self.layout.training and point in ("cross_cond", "cross_kv"):  # (1, B*TOKEN, h | 2h)
            return (None, A, None)
        if point in ("cross_k", "cross_v"):  # (1, heads, B*TOKEN, hd)
            if self.layout.training:  # gathered from the local rows; gradients summed back
                return Reshard(before=(None, None, A, None), after=(None, None, None, None))
            return (None, None, None, None)
        return None
