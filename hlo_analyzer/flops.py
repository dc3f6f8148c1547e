"""FlopsVisitor: floating-point work per device, split into GEMM and vector work.

Counting rules (per device, since a partitioned dump is one device's program):

* GEMM
  - ``dot``: ``2 * contract * prod(result)``, contract = the lhs's last dimension.
  - ``dot_general``: ``2 * prod(lhs contracting dims) * prod(result)``; batch dims are part of the
    result, so they multiply in once.
  - ``convolution``: ``2 * batch * out_features * kernel input features * taps``, where ``taps``
    counts only the (output position, kernel position) pairs that land on real input, per
    spatial dimension, multiplied over the dimensions: padding and the holes of ``lhs_dilation``
    are skipped, exactly as XLA's HloCostAnalysis does (a transposed convolution is mostly
    zeros). Without padding or dilation that is ``prod(output spatial) * prod(kernel spatial)``.
    The kernel's input-feature dimension already holds ``in_features / feature_group_count``; with
    ``batch_group_count`` each output element still sums over one kernel window, so the same
    formula holds for both kinds of groups.
* Vector, one FLOP per output element: the brief's add, subtract, multiply, divide, rsqrt,
  negate, exponential, and also (listed in ``VECTOR_ELEMENTWISE_OPS``) maximum, minimum, sqrt,
  tanh, logistic, log, power, abs, compare, select, clamp and the other element-wise math ops.
  ``batch_norm_training``: 7 per element, ``batch_norm_inference``: 4 (see their methods).
  ``reduce``: one FLOP per combined element, ``prod(input) - prod(output)`` per input; ``scatter``:
  one per update element; ``reduce_window``: one per window element of each output;
  ``select_and_scatter``: one per window element of each source element (``window - 1``
  selects pick the element, one scatter adds the source value to it; XLA counts the same).
* Other (no FLOPs, but handled so that they are not reported as unknown): data movement, constants,
  control flow and structure (``DATA_MOVEMENT_OPS``, ``STRUCTURE_OPS``).

* Neutral (no FLOPs, known): Shardy annotations (``sdy.*``), async wrappers, ``bitcast``,
  ``add_dependency``... (``NEUTRAL_OPS``). ``custom_call`` contributes nothing (its work is
  opaque) but is always listed with its target in ``custom_calls``. A ``composite`` is measured
  through its decomposition function (the walk treats it as a call).

Any other op lands in ``unhandled`` (name -> count): nothing is dropped silently.

Reconciling with XLA's ``compiled.cost_analysis()['flops']`` (per device): XLA counts dot and
convolution FLOPs as here, plus one per output element of element-wise ops *except* the
transcendental ones (``XLA_TRANSCENDENTAL_OPS``: exp, log, tanh, rsqrt, ... go to its
``transcendentals``), plus one per element of ``convert``, the additions inside
reductions/all-reduce, counts a ``while`` body once and takes the costliest branch. GEMM FLOPs
agree exactly; the difference in total is those conventions (see README, analyze-hlo).
"""

from __future__ import annotations

import math
from collections import Counter
from operator import attrgetter
from typing import Any

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import mhlo, stablehlo

from hlo_analyzer.rows import GEMM, OTHER, VECTOR, OpRow, compute_row
from hlo_analyzer.tensors import SHARDING_ATTRIBUTE, TypeTable, num_elements
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

STRUCTURE_OPS = ("func", "return", "while", "case", "if", "fusion", "manual_computation",
                 "named_computation", "async_start", "async_done", "async_update")

NEUTRAL_OPS = ("mesh", "sharding_constraint", "reshard", "sharding_group", "propagation_barrier",
               "bitcast", "add_dependency", "domain", "minimum_broadcast_shapes")

#: Element-wise ops whose work XLA's HloCostAnalysis reports as ``transcendentals``, not flops.
XLA_TRANSCENDENTAL_OPS = frozenset({
    "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "rsqrt",
    "sqrt", "cbrt", "power", "sine", "cosine", "tan", "atan2", "erf", "erf_inv"})

_DIALECT_ATTRIBUTES = {"stablehlo": stablehlo, "mhlo": mhlo}



class FlopsVisitor(IRVisitor):
    """Counts GEMM and vector FLOPs per op; see the module docstring for the rules."""

    skip_scalar_bodies = True

    def __init__(self, types: TypeTable | None = None) -> None:
        super().__init__()
        self.rows: list[OpRow] = []
        self.unhandled: Counter[str] = Counter()
        self._counts_without_row: Counter[str] = Counter()  # ops with no row (op_counts)
        self._contracting: dict[ir.Attribute, tuple[int, ...]] = {}  # dot_dimension_numbers
        self.custom_calls: Counter[str] = Counter()
        #: Distinct ``mhlo.sharding`` strings on the measured ops: a partitioned program keeps
        #: shardings only on its arguments, a program not yet partitioned has them on its ops
        #: (XLA's ``before_spmd-partitioning`` dump: Shardy's, exported as HLO shardings).
        self.op_shardings: set[str] = set()
        self.types = types if types is not None else TypeTable()

    @property
    def op_counts(self) -> Counter[str]:
        """How many ops of each name the walk met and knows, with a row or without one (data
        movement, structure, calls, collectives)."""
        return Counter(map(attrgetter("op"), self.rows)) + self._counts_without_row

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
        lhs, result = self._operand_shape(op, 0), self._result_shape(op, 0)
        contract = lhs[-1] if lhs else 1
        self._record(op, GEMM, 2 * contract * num_elements(result))

    def visit_dot_general(self, op: Any) -> None:
        operation = op.operation
        attribute = operation.attributes["dot_dimension_numbers"]
        contracting = self._contracting.get(attribute)  # MLIR uniques attributes: a few per dump
        if contracting is None:
            dims = _dialect(operation).DotDimensionNumbers(attribute)
            contracting = self._contracting[attribute] = tuple(dims.lhs_contracting_dimensions)
        lhs, result = self._operand_shape(op, 0), self._result_shape(op, 0)
        contract = math.prod([lhs[d] for d in contracting])
        self._record(op, GEMM, 2 * contract * num_elements(result))

    def visit_convolution(self, op: Any) -> None:
        operation = op.operation
        dims = _dialect(operation).ConvDimensionNumbers(operation.attributes["dimension_numbers"])
        lhs, kernel = self._operand_shape(op, 0), self._operand_shape(op, 1)
        result = self._result_shape(op, 0)
        spatial = len(dims.kernel_spatial_dimensions)
        attributes = operation.attributes
        strides = _int_attribute(attributes, "window_strides", [1] * spatial)
        padding = _int_attribute(attributes, "padding", [0] * (2 * spatial))
        lhs_dilation = _int_attribute(attributes, "lhs_dilation", [1] * spatial)
        rhs_dilation = _int_attribute(attributes, "rhs_dilation", [1] * spatial)
        taps = 1
        for i in range(spatial):
            taps *= _valid_taps(
                lhs[dims.input_spatial_dimensions[i]], kernel[dims.kernel_spatial_dimensions[i]],
                result[dims.output_spatial_dimensions[i]], strides[i], padding[2 * i],
                lhs_dilation[i], rhs_dilation[i])
        out_spatial = math.prod(result[d] for d in dims.output_spatial_dimensions)
        batch_and_features = num_elements(result) // out_spatial if out_spatial else 0
        in_features_per_group = kernel[dims.kernel_input_feature_dimension]
        self._record(op, GEMM, 2 * batch_and_features * in_features_per_group * taps)

    # -- vector ---------------------------------------------------------------------------------
    def _visit_elementwise(self, op: Any) -> None:
        self._record(op, VECTOR, num_elements(self.types.row_shapes(op, self.op_name).results[0]))

    def visit_reduce(self, op: Any) -> None:
        inputs = len(self.types.value_types(op)[0]) // 2  # (inputs..., init values...)
        flops = 0
        for index in range(inputs):
            in_elements = num_elements(self._operand_shape(op, index))
            out_elements = num_elements(self._result_shape(op, index))
            flops += in_elements - out_elements
        self._record(op, VECTOR, flops)

    def visit_reduce_window(self, op: Any) -> None:
        operation = op.operation
        window = math.prod(_int_array(operation.attributes["window_dimensions"]))
        inputs = len(operation.operands) // 2
        flops = sum(num_elements(self._result_shape(op, i)) * window for i in range(inputs))
        self._record(op, VECTOR, flops)

    def visit_select_and_scatter(self, op: Any) -> None:
        """Per element of the source (operand 1), one window of the operand: ``window - 1``
        selects (compares) pick one element, one scatter combines the source value into it."""
        attributes = op.operation.attributes
        rank = len(self._operand_shape(op, 0))
        window = math.prod(_int_attribute(attributes, "window_dimensions", [1] * rank))
        self._record(op, VECTOR, num_elements(self._operand_shape(op, 1)) * window)

    def visit_batch_norm_training(self, op: Any) -> None:
        """Per element: mean (1), variance (subtract, square-accumulate: 2), normalise
        (subtract, multiply by rsqrt: 2), scale and offset (2) = 7."""
        self._record(op, VECTOR, BATCH_NORM_TRAINING_FLOPS_PER_ELEMENT * num_elements(
            self._operand_shape(op, 0)))

    def visit_batch_norm_inference(self, op: Any) -> None:
        """Per element: subtract mean, multiply by rsqrt(var), scale, offset = 4."""
        self._record(op, VECTOR, BATCH_NORM_INFERENCE_FLOPS_PER_ELEMENT * num_elements(
            self._operand_shape(op, 0)))

    def visit_scatter(self, op: Any) -> None:
        operand_types = self.types.value_types(op)[0]
        inputs = (len(operand_types) - 1) // 2  # (inputs..., indices, updates...)
        updates = operand_types[inputs + 1:]
        self._record(op, VECTOR, sum(num_elements(self.types.info(u, op)[0]) for u in updates))

    # -- no FLOPs -------------------------------------------------------------------------------
    def _visit_data_movement(self, op: Any) -> None:
        self._counts_without_row[self.op_name] += 1

    def visit_custom_call(self, op: Any) -> None:
        """No FLOPs counted (the target's work is opaque), but always listed with its target."""
        attributes = op.operation.attributes
        target = (ir.StringAttr(attributes["call_target_name"]).value
                  if "call_target_name" in attributes else "?")
        self.custom_calls[target] += 1
        self._record(op, OTHER, 0)

    def visit_composite(self, op: Any) -> None:
        """Measured through its decomposition (walked as a call)."""
        self._counts_without_row[self.op_name] += 1
        super().visit_composite(op)

    def visit_call(self, op: Any) -> None:
        self._counts_without_row[self.op_name] += 1
        super().visit_call(op)

    def _visit_neutral(self, op: Any) -> None:
        """Annotations and wrappers with no work of their own; regions (if any) are walked."""
        self._counts_without_row[self.op_name] += 1
        super().generic_visit(op)

    def _visit_structure(self, op: Any) -> None:
        self._counts_without_row[self.op_name] += 1
        super().generic_visit(op)

    def _visit_collective(self, op: Any) -> None:
        """Communication is CommVisitor's to measure; here it only must not count as unknown."""
        self._counts_without_row[self.op_name] += 1

    # -- element-wise (written out, delegating) --------------------------------------
    def visit_add(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_subtract(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_multiply(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_divide(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_rsqrt(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_negate(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_exponential(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_maximum(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_minimum(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_sqrt(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_cbrt(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_tanh(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_logistic(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_log(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_log_plus_one(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_exponential_minus_one(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_power(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_abs(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_sign(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_remainder(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_atan2(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_sine(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_cosine(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_tan(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_erf(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_erf_inv(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_floor(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_ceil(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_round_nearest_even(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_round_nearest_afz(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_compare(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_select(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_clamp(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_and(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_or(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_xor(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_not(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_is_finite(self, op: Any) -> None:
        self._visit_elementwise(op)

    def visit_square(self, op: Any) -> None:
        self._visit_elementwise(op)

    # -- data movement (written out, delegating) -------------------------------------
    def visit_constant(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_iota(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_broadcast(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_broadcast_in_dim(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_reshape(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_transpose(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_convert(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_bitcast_convert(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_slice(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_dynamic_slice(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_dynamic_update_slice(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_concatenate(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_pad(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_gather(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_copy(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_reverse(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_reduce_precision(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_tuple(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_get_tuple_element(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_optimization_barrier(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_partition_id(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_replica_id(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_after_all(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_create_token(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_rng(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_rng_bit_generator(self, op: Any) -> None:
        self._visit_data_movement(op)

    def visit_sort(self, op: Any) -> None:
        self._visit_data_movement(op)

    # -- collectives (written out, delegating) ---------------------------------------
    def visit_all_reduce(self, op: Any) -> None:
        self._visit_collective(op)

    def visit_all_gather(self, op: Any) -> None:
        self._visit_collective(op)

    def visit_reduce_scatter(self, op: Any) -> None:
        self._visit_collective(op)

    def visit_all_to_all(self, op: Any) -> None:
        self._visit_collective(op)

    def visit_collective_permute(self, op: Any) -> None:
        self._visit_collective(op)

    def visit_collective_broadcast(self, op: Any) -> None:
        self._visit_collective(op)

    # -- structure (written out, delegating) -----------------------------------------
    def visit_func(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_return(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_while(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_case(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_if(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_fusion(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_manual_computation(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_named_computation(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_async_start(self, op: Any) -> None:
        self._counts_without_row[self.op_name] += 1
        super().visit_async_start(op)

    def visit_async_done(self, op: Any) -> None:
        self._visit_structure(op)

    def visit_async_update(self, op: Any) -> None:
        self._visit_structure(op)

    # -- neutral (written out, delegating) -------------------------------------------
    def visit_mesh(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_sharding_constraint(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_reshard(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_sharding_group(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_propagation_barrier(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_bitcast(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_add_dependency(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_domain(self, op: Any) -> None:
        self._visit_neutral(op)

    def visit_minimum_broadcast_shapes(self, op: Any) -> None:
        self._visit_neutral(op)


    # -- helpers --------------------------------------------------------------------------------
    def _operand_shape(self, op: Any, index: int) -> tuple[int, ...]:
        return self.types.row_shapes(op, self.op_name).operands[index]

    def _result_shape(self, op: Any, index: int) -> tuple[int, ...]:
        return self.types.row_shapes(op, self.op_name).results[index]

    def _record(self, op: Any, category: str, flops: int) -> None:
        types, name = self.types, self.op_name
        attributes = op.operation.attributes
        if SHARDING_ATTRIBUTE in attributes:
            self.op_shardings.add(ir.StringAttr(attributes[SHARDING_ATTRIBUTE]).value)
        operands, results, dtype = types.row_shapes(op, name)
        self.rows.append(compute_row(self.position, name, types.location(op), category, operands,
                                     results, dtype, int(flops), self.scope))


def _dialect(operation: Any) -> Any:
    return _DIALECT_ATTRIBUTES[operation.name.split(".", 1)[0]]


def _int_array(attribute: Any) -> list[int]:
    if isinstance(attribute, ir.DenseElementsAttr):
        return [int(x) for x in np.asarray(attribute).reshape(-1)]
    return [int(x) for x in attribute]  # DenseI64ArrayAttr


def _int_attribute(attributes: Any, name: str, default: list[int]) -> list[int]:
    return _int_array(attributes[name]) if name in attributes else default


def _valid_taps(size: int, window: int, out: int, stride: int, pad_low: int,
                lhs_dilation: int, rhs_dilation: int) -> int:
    """(output position, kernel position) pairs of one spatial dimension that read a real input
    element: not padding, not a hole between dilated input elements."""
    dilated = (size - 1) * lhs_dilation + 1 if size else 0
    positions = (np.arange(out)[:, None] * stride + np.arange(window)[None, :] * rhs_dilation
                 - pad_low)
    real = (positions >= 0) & (positions < dilated) & (positions % lhs_dilation == 0)
    return int(np.count_nonzero(real))
