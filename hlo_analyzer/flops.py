"""FlopsVisitor: floating-point work per device, split into GEMM and vector work.

Counting rules (per device, since a partitioned dump is one device's program):

* GEMM
  - ``dot``: ``2 * contract * prod(result)``, contract = the lhs's last dimension.
  - ``dot_general``: ``2 * prod(lhs contracting dims) * prod(result)``; batch dims are part of the
    result, so they multiply in once.
  - ``convolution``: ``2 * prod(result) * prod(kernel spatial dims) * kernel input features``.
    The kernel's input-feature dimension already holds ``in_features / feature_group_count``; with
    ``batch_group_count`` each output element still sums over one kernel window, so the same
    formula holds for both kinds of groups.
* Vector, one FLOP per output element: the brief's add, subtract, multiply, divide, rsqrt,
  negate, exponential, and also (listed in ``VECTOR_ELEMENTWISE_OPS``) maximum, minimum, sqrt,
  tanh, logistic, log, power, abs, compare, select, clamp and the other element-wise math ops.
  ``batch_norm_training``: 7 per element, ``batch_norm_inference``: 4 (see their methods).
  ``reduce``: one FLOP per combined element, ``prod(input) - prod(output)`` per input; ``scatter``:
  one per update element; ``reduce_window``: one per window element of each output.
* Other (no FLOPs, but handled so that they are not reported as unknown): data movement, constants,
  control flow and structure (``DATA_MOVEMENT_OPS``, ``STRUCTURE_OPS``).

Any other op lands in ``unhandled`` (name -> count): nothing is dropped silently.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from jaxlib.mlir.dialects import mhlo, stablehlo

from hardware.collectives import COLLECTIVE_KINDS
from hlo_analyzer.rows import GEMM, OTHER, VECTOR, OpRow
from hlo_analyzer.tensors import TypeTable, num_elements
from hlo_analyzer.visitor import IRVisitor

BRIEF_VECTOR_OPS = ("add", "subtract", "multiply", "divide", "rsqrt", "negate", "exponential")

VECTOR_ELEMENTWISE_OPS = BRIEF_VECTOR_OPS + (
    "maximum", "minimum", "sqrt", "cbrt", "tanh", "logistic", "log", "log_plus_one",
    "exponential_minus_one", "power", "abs", "sign", "remainder", "atan2", "sine", "cosine",
    "tan", "erf", "erf_inv", "floor", "ceil", "round_nearest_even", "round_nearest_afz",
    "compare", "select", "clamp", "and", "or", "xor", "not", "is_finite", "square",
)

BATCH_NORM_TRAINING_FLOPS_PER_ELEMENT = 7
BATCH_NORM_INFERENCE_FLOPS_PER_ELEMENT = 4

DATA_MOVEMENT_OPS = (
    "constant", "iota", "broadcast", "broadcast_in_dim", "reshape", "transpose", "convert",
    "bitcast_convert", "slice", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad",
    "gather", "copy", "reverse", "reduce_precision", "tuple", "get_tuple_element",
    "optimization_barrier", "partition_id", "replica_id", "after_all", "create_token",
    "rng", "rng_bit_generator", "sort", "custom_call",
)

STRUCTURE_OPS = ("func", "return", "while", "case", "if", "fusion")

_DIALECT_ATTRIBUTES = {"stablehlo": stablehlo, "mhlo": mhlo}


class FlopsVisitor(IRVisitor):
    """Counts GEMM and vector FLOPs per op; see the module docstring for the rules."""

    skip_scalar_bodies = True

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[OpRow] = []
        self.unhandled: Counter[str] = Counter()
        self.op_counts: Counter[str] = Counter()
        self.types = TypeTable()

    @property
    def gemm_flops(self) -> int:
        return sum(row.flops for row in self.rows if row.category == GEMM)

    @property
    def vector_flops(self) -> int:
        return sum(row.flops for row in self.rows if row.category == VECTOR)

    def generic_visit(self, node: Any) -> None:
        if hasattr(node, "operation"):
            self.unhandled[node.operation.name] += 1
        super().generic_visit(node)

    # -- GEMM -----------------------------------------------------------------------------------
    def visit_dot(self, op: Any) -> None:
        operation = op.operation
        lhs = self.types.shape(operation.operands[0], op)
        result = self.types.shape(operation.results[0], op)
        contract = lhs[-1] if lhs else 1
        self._record(op, GEMM, 2 * contract * num_elements(result))

    def visit_dot_general(self, op: Any) -> None:
        operation = op.operation
        dims = _dialect(operation).DotDimensionNumbers(operation.attributes["dot_dimension_numbers"])
        lhs = self.types.shape(operation.operands[0], op)
        result = self.types.shape(operation.results[0], op)
        contract = math.prod(lhs[d] for d in dims.lhs_contracting_dimensions)
        self._record(op, GEMM, 2 * contract * num_elements(result))

    def visit_convolution(self, op: Any) -> None:
        operation = op.operation
        dims = _dialect(operation).ConvDimensionNumbers(operation.attributes["dimension_numbers"])
        kernel = self.types.shape(operation.operands[1], op)
        result = self.types.shape(operation.results[0], op)
        window = math.prod(kernel[d] for d in dims.kernel_spatial_dimensions)
        in_features_per_group = kernel[dims.kernel_input_feature_dimension]
        self._record(op, GEMM, 2 * num_elements(result) * window * in_features_per_group)

    # -- vector ---------------------------------------------------------------------------------
    def _visit_elementwise(self, op: Any) -> None:
        result = self.types.shape(op.operation.results[0], op)
        self._record(op, VECTOR, num_elements(result))

    def visit_reduce(self, op: Any) -> None:
        operation = op.operation
        inputs = len(operation.operands) // 2  # operands are (inputs..., init values...)
        flops = 0
        for index in range(inputs):
            in_elements = num_elements(self.types.shape(operation.operands[index], op))
            out_elements = num_elements(self.types.shape(operation.results[index], op))
            flops += in_elements - out_elements
        self._record(op, VECTOR, flops)

    def visit_reduce_window(self, op: Any) -> None:
        operation = op.operation
        window = math.prod(_int_array(operation.attributes["window_dimensions"]))
        inputs = len(operation.operands) // 2
        flops = sum(num_elements(self.types.shape(operation.results[i], op)) * window for i in range(inputs))
        self._record(op, VECTOR, flops)

    def visit_batch_norm_training(self, op: Any) -> None:
        """Per element: mean (1), variance (subtract, square-accumulate: 2), normalise
        (subtract, multiply by rsqrt: 2), scale and offset (2) = 7."""
        self._record(op, VECTOR, BATCH_NORM_TRAINING_FLOPS_PER_ELEMENT * num_elements(
            self.types.shape(op.operation.operands[0], op)))

    def visit_batch_norm_inference(self, op: Any) -> None:
        """Per element: subtract mean, multiply by rsqrt(var), scale, offset = 4."""
        self._record(op, VECTOR, BATCH_NORM_INFERENCE_FLOPS_PER_ELEMENT * num_elements(
            self.types.shape(op.operation.operands[0], op)))

    def visit_scatter(self, op: Any) -> None:
        operation = op.operation
        inputs = (len(operation.operands) - 1) // 2  # (inputs..., indices, updates...)
        updates = operation.operands[inputs + 1:]
        self._record(op, VECTOR, sum(num_elements(self.types.shape(u, op)) for u in updates))

    # -- no FLOPs -------------------------------------------------------------------------------
    def _visit_data_movement(self, op: Any) -> None:
        self.op_counts[op.operation.name] += 1
        if op.operation.name.endswith("custom_call"):
            self._record(op, OTHER, 0)

    def _visit_structure(self, op: Any) -> None:
        self.op_counts[op.operation.name] += 1
        super().generic_visit(op)

    def _visit_collective(self, op: Any) -> None:
        """Communication is CommVisitor's to measure; here it only must not count as unknown."""
        self.op_counts[op.operation.name] += 1

    # -- helpers --------------------------------------------------------------------------------
    def _record(self, op: Any, category: str, flops: int) -> None:
        self.op_counts[op.operation.name] += 1
        self.rows.append(self.types.op_row(op, self.position, category, flops=int(flops)))


def _dialect(operation: Any) -> Any:
    return _DIALECT_ATTRIBUTES[operation.name.split(".", 1)[0]]


def _int_array(attribute: Any) -> list[int]:
    import numpy as np

    return [int(x) for x in np.asarray(attribute).reshape(-1)] if hasattr(attribute, "__array__") \
        else [int(x) for x in attribute]


for _name in VECTOR_ELEMENTWISE_OPS:
    setattr(FlopsVisitor, f"visit_{_name}", FlopsVisitor._visit_elementwise)
for _name in DATA_MOVEMENT_OPS:
    setattr(FlopsVisitor, f"visit_{_name}", FlopsVisitor._visit_data_movement)
for _name in COLLECTIVE_KINDS:
    setattr(FlopsVisitor, f"visit_{_name}", FlopsVisitor._visit_collective)
for _name in STRUCTURE_OPS:
    setattr(FlopsVisitor, f"visit_{_name}", FlopsVisitor._visit_structure)
del _name
