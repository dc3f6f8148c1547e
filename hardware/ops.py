"""The operator description that the mappers consume.

An :class:`Op` is shape-level only: a name, a type (GEMM / Vector / FlashAttention), the shapes of
its activations, weight and output, its element size and its FLOPs. Conventions per type:

* ``GEMM``: ``input_shapes[0]`` is ``(..., K)`` (all leading dims are the GEMM's M),
  ``weight_shape`` is ``(K, N)``, ``output_shape`` is ``(..., N)``; ``flops = 2*batch*M*K*N``.
  A *batched* GEMM (``batch > 1``: the attention scores of many heads, ``dot_general`` with batch
  dims) is ``batch`` independent instances of those shapes, each with its own A and B, run as
  one kernel whose tiling spreads the instances over the tiles with M, N and K; the shapes are
  one instance's, ``flops`` and the ``*_elements`` counts cover all of them.
* ``Vector``: element-wise or row-reduction work; the output's leading dims are the rows that the
  mapper splits across tiles ("along the sequence"), its last dim is the row length; every
  activation in ``input_shapes`` is read once, the weight (scale/shift/gate vectors) once, the
  output written once. ``flops`` is the count of vector operations. ``fuse_into`` names a GEMM
  whose output this op consumes element-wise, so a block mapper may fuse it as that GEMM's epilogue.
* ``FlashAttention``: ``input_shapes`` are q ``(B, heads, S_Q, head_dim)``, k and v
  ``(B, heads, S_KV, head_dim)``; ``output_shape`` is ``(B, heads, S_Q, head_dim)``;
  ``flops = 4*B*heads*S_Q*S_KV*head_dim`` (the two GEMMs), ``vector_flops`` the softmax work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = ["Op", "OpType", "Shape", "attention_dims", "check_epilogue", "gemm_dims"]

Shape = tuple[int, ...]


class OpType(str, Enum):
    """Which mapper handles an op."""

    GEMM = "GEMM"
    VECTOR = "Vector"
    FLASH_ATTENTION = "FlashAttention"


@dataclass(frozen=True)
class Op:
    """One operator of a block, at shape level (see the module docstring for the conventions)."""

    name: str
    op_type: OpType
    input_shapes: tuple[Shape, ...]
    weight_shape: Shape | None
    output_shape: Shape
    flops: int
    bytes_per_element: int = 2
    vector_flops: int = 0
    fuse_into: str | None = None
    #: Independent instances of a batched GEMM (module docstring); 1 for every other op.
    batch: int = 1
    #: Elements one row of a row-wise Vector kernel spans (a LayerNorm's width, a row mean's
    #: length), where the kernel's efficiency depends on it; 0 when unknown or not row-wise.
    row_length: int = 0

    def __post_init__(self) -> None:
        if not self.input_shapes:
            raise ValueError(f"op {self.name}: needs at least one input shape")
        for shape in (*self.input_shapes, self.output_shape, *([self.weight_shape] if self.weight_shape else [])):
            if not shape or any(int(d) <= 0 for d in shape):
                raise ValueError(f"op {self.name}: shape {shape} must have positive dimensions")
        if self.flops < 0 or self.vector_flops < 0:
            raise ValueError(f"op {self.name}: FLOPs must not be negative")
        if self.bytes_per_element <= 0:
            raise ValueError(f"op {self.name}: bytes_per_element must be positive")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"op {self.name}: batch must be a positive integer, got {self.batch!r}")
        if self.batch > 1 and self.op_type is not OpType.GEMM:
            raise ValueError(f"op {self.name}: only a GEMM has a batch, not a {self.op_type.value} op")

    @property
    def input_shape(self) -> Shape:
        """The first (main) activation."""
        return self.input_shapes[0]

    @property
    def input_elements(self) -> int:
        """Elements of every activation, over all ``batch`` instances."""
        return self.batch * sum(math.prod(s) for s in self.input_shapes)

    @property
    def weight_elements(self) -> int:
        """Elements of the weight, over all ``batch`` instances (0 without one)."""
        return self.batch * math.prod(self.weight_shape) if self.weight_shape else 0

    @property
    def output_elements(self) -> int:
        """Elements of the output, over all ``batch`` instances."""
        return self.batch * math.prod(self.output_shape)


def gemm_dims(op: Op) -> tuple[int, int, int]:
    """``(M, K, N)`` of one instance of a GEMM op (``op.batch`` of them), checked against its shapes."""
    if op.op_type is not OpType.GEMM or op.weight_shape is None or len(op.weight_shape) != 2:
        raise ValueError(f"op {op.name}: not a GEMM with a (K, N) weight")
    k, n = op.weight_shape
    m = math.prod(op.input_shape[:-1])
    if op.input_shape[-1] != k or op.output_shape[-1] != n or math.prod(op.output_shape[:-1]) != m:
        raise ValueError(f"op {op.name}: shapes {op.input_shape} x {op.weight_shape} -> {op.output_shape} do not chain")
    return m, k, n


def check_epilogue(op: Op, epilogue: Op) -> None:
    """ValueError unless ``epilogue`` is a Vector op over the whole output of GEMM ``op`` (every
    instance's, for a batched GEMM), which a GEMM mapper may then fuse into it."""
    if epilogue.op_type is not OpType.VECTOR or epilogue.output_elements != op.output_elements:
        m, _, n = gemm_dims(op)
        over = f"{op.batch} x {m}x{n}" if op.batch > 1 else f"{m}x{n}"
        raise ValueError(f"op {epilogue.name}: a fused epilogue must be a Vector op over the {over} output of {op.name}")


def attention_dims(op: Op) -> tuple[int, int, int, int, int]:
    """``(batch, heads, S_Q, S_KV, head_dim)`` of a FlashAttention op, checked against its shapes."""
    if op.op_type is not OpType.FLASH_ATTENTION or len(op.input_shapes) != 3:
        raise ValueError(f"op {op.name}: not a FlashAttention op with q, k, v inputs")
    q, k, v = op.input_shapes
    if len(q) != 4 or len(k) != 4 or k != v or q[:2] != k[:2] or q[3] != k[3] or tuple(op.output_shape) != tuple(q):
        raise ValueError(f"op {op.name}: q {q}, k {k}, v {v} -> {op.output_shape} are not (B, heads, S, head_dim)")
    return q[0], q[1], q[2], k[2], q[3]
