"""``tensors.SAME_SHAPE_OPS``: the analyzer writes these ops' operand shapes as their result's
without reading the operands, which is right only if the verifier guarantees it. For every op in
the list, a well-formed instance parses and an instance whose operands have another shape than
the result is refused by jaxlib's verifier; and the rows of such ops carry the shapes read."""

from __future__ import annotations

import pytest

from hlo_analyzer import load_module_text
from hlo_analyzer.report import analyze
from hlo_analyzer.tensors import SAME_SHAPE_OPS
from hlo_trace.errors import InputFileError

UNARY = {"negate", "abs", "sign", "not", "exponential", "exponential_minus_one", "log",
         "log_plus_one", "logistic", "rsqrt", "sqrt", "cbrt", "tanh", "sine", "cosine", "tan",
         "floor", "ceil", "round_nearest_even", "round_nearest_afz", "is_finite"}
INTEGER = {"and", "or", "xor", "not"}
PREDICATE_RESULT = {"is_finite", "compare"}


def _module(full_name: str, operand_shape: str, result_shape: str) -> str:
    dialect, name = full_name.split(".")
    element = "i32" if name in INTEGER else "f32"
    result_element = "i1" if name in PREDICATE_RESULT else element
    arity = 1 if name in UNARY else 2
    operand_type = f"tensor<{operand_shape}x{element}>"
    result_type = f"tensor<{result_shape}x{result_element}>"
    attributes = (f" {{comparison_direction = #{dialect}<comparison_direction LT>}}"
                  if name == "compare" else "")
    arguments = ", ".join(f"%a{i}" for i in range(arity))
    signature = ", ".join(f"%a{i}: {operand_type}" for i in range(arity))
    return (f"func.func @main({signature}) -> {result_type} {{\n"
            f'  %r = "{full_name}"({arguments}){attributes} : '
            f"({', '.join([operand_type] * arity)}) -> {result_type}\n"
            f"  return %r : {result_type}\n}}\n")


@pytest.mark.parametrize("full_name", sorted(SAME_SHAPE_OPS))
def test_the_verifier_refuses_operands_shaped_unlike_the_result(full_name):
    row = next(row for row in analyze(load_module_text(_module(full_name, "4x8", "4x8"))).rows
               if row.op == full_name)
    arity = 1 if full_name.split(".")[1] in UNARY else 2
    assert row.operand_shapes == ((4, 8),) * arity
    assert row.result_shapes == ((4, 8),)
    assert row.flops == 32  # one per result element: 4 x 8
    with pytest.raises(InputFileError, match="does not parse"):
        load_module_text(_module(full_name, "8x4", "4x8"))


def test_select_and_clamp_are_not_in_the_list():
    # A scalar predicate or bound is legal there: their operands are read.
    assert not {"stablehlo.select", "stablehlo.clamp", "chlo.erf"} & SAME_SHAPE_OPS
    text = """func.func @main(%p: tensor<i1>, %a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %r = stablehlo.select %p, %a, %a : (tensor<i1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""
    row = next(row for row in analyze(load_module_text(text)).rows if row.op == "stablehlo.select")
    assert row.operand_shapes == ((), (4, 8), (4, 8))
