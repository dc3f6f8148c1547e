"""NormMarkerVisitor: where the normalisations are (rsqrt and batch_norm_* ops).

LayerNorm and RMSNorm written out both lower to an ``rsqrt`` of the mean square (plus epsilon),
and ``torch.nn.LayerNorm`` lowers to ``batch_norm_training``; either marks a norm. The shape of
the marker tells which norm it is: the reduced dimension becomes 1, so a q/k RMSNorm over the
head dim of ``(B', heads, L, head_dim)`` gives an rsqrt of shape ``(B', heads, L, 1)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hlo_analyzer.tensors import TypeTable
from hlo_analyzer.visitor import IRVisitor


class NormMarker(NamedTuple):
    position: int
    op: str
    location: str
    shape: tuple[int, ...]


class NormMarkerVisitor(IRVisitor):
    skip_scalar_bodies = True

    def __init__(self) -> None:
        super().__init__()
        self.markers: list[NormMarker] = []
        self.types = TypeTable()

    def _mark(self, op: Any) -> None:
        operation = op.operation
        self.markers.append(NormMarker(self.position, operation.name, self.types.location(op),
                                       self.types.shape(operation.results[0], op)))

    visit_rsqrt = _mark
    visit_batch_norm_training = _mark
    visit_batch_norm_inference = _mark
