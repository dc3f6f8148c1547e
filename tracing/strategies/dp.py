"""Data parallelism: the batch is split over the whole mesh, every weight is replicated.

The video tokens of a sample never leave their device, so the blocks need no collective. The
cross-attention flattens all samples' queries and captions into one sequence with a
block-diagonal mask; each device keeps every caption (y and the cross-attention k, v are
replicated) so its queries find their own caption locally.
"""

from __future__ import annotations

from tracing.strategies.base import ALL_DEVICES, Spec, Strategy, register

A = ALL_DEVICES


@register
class DataParallel(Strategy):
    name = "dp"
    summary = "data parallel: batch split over all devices, weights replicated; no collectives in the blocks"

    def validate(self) -> None:
        self.require_divisible("batch", self.layout.batch, self.layout.num_devices, "x*y")

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name in ("z", "t", "x", "t_mlp"):  # batch-major inputs
            return (A,) + (None,) * (len(shape) - 1)
        return None  # y (all captions), fps (one value)

    def output_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name in ("x", "t", "t_mlp", "out"):
            return (A,) + (None,) * (len(shape) - 1)
        return None

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("x", "attn_in", "attn_out", "proj_out", "mlp_hidden", "q", "k", "v"):
            return (A,) + (None,) * (len(shape) - 1)  # (batch-major, ...)
        if point in ("cross_q",):  # (1, heads, B*N, hd): samples are the major part of B*N
            return (None, None, A, None)
        if point == "cross_out":  # (1, B*N, h)
            return (None, A, None)
        if point in ("cross_k", "cross_v"):
            return (None, None, None, None)
        return None
