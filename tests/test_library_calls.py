"""Library calls from torch-xla locations (hlo_analyzer.mapping.library_calls), on hand-made graphs, and the
GPU descriptions' per-class efficiencies."""

from __future__ import annotations

import networkx as nx
import pytest

from hardware import load_chip
from hlo_analyzer.mapping.library_calls import (
    CallRegion,
    call_groups,
    folded_constants,
    sidecar_call_regions,
)


def _graph(*nodes: tuple[int, str, list[int | None], str]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for node, name, operands, location in nodes:
        graph.add_node(node, name=name, operands=operands, location=location,
                       result_shapes=((4, 8),), operand_shapes=((4, 8),) * len(operands))
        graph.add_edges_from((p, node) for p in operands if p is not None)
    return graph


def _calls(graph: nx.DiGraph, regions=()) -> list[tuple[str, tuple[int, ...]]]:
    return [(call.kind, call.nodes) for call in call_groups(graph, list(graph), regions)]


def test_one_torch_call_is_its_connected_ops_with_one_name_and_frame():
    # x.mean() lowers to reduce, divide, multiply (one call); a second mean on another line is
    # another call; an unnumbered name on the same line reached only through another call too.
    graph = _graph((0, "reduce", [None], "aten__mean @ m.py:3"),
                   (1, "divide", [0], "aten__mean @ m.py:3"),
                   (2, "subtract", [None, 1], "aten__sub.2/aten__sub @ m.py:3"),
                   (3, "reduce", [2], "aten__mean @ m.py:4"),
                   (4, "multiply", [3], "aten__mean @ m.py:4"),
                   (5, "reduce", [4], "aten__mean @ m.py:3"))
    assert _calls(graph) == [("mean", (0, 1)), ("sub", (2,)), ("mean", (3, 4)), ("mean", (5,))]


def test_a_promotion_cast_joins_the_call_on_its_line_and_an_explicit_cast_stays_a_kernel():
    graph = _graph((0, "convert", [None], "xla__cast @ m.py:7"),           # x.float() alone
                   (1, "convert", [0], "xla__cast @ m.py:8"),              # upcast for the mul
                   (2, "multiply", [1, None], "aten__mul.5/aten__mul @ m.py:8"),
                   (3, "convert", [2], "xla__cast @ m.py:8"))              # back to bfloat16
    assert _calls(graph) == [("cast", (0,)), ("mul", (1, 2, 3))]


def test_a_declared_region_is_one_call_whatever_torch_calls_made_it():
    regions = (CallRegion("layer_norm", "m.py", 10, 14),)
    graph = _graph((0, "convert", [None], "xla__cast @ m.py:11"),
                   (1, "reduce", [0], "aten__mean @ m.py:12"),
                   (2, "subtract", [0, 1], "aten__sub.3/aten__sub @ m.py:12"),
                   (3, "rsqrt", [2], "aten__rsqrt @ m.py:13"),
                   (4, "add", [3, None], "aten__add.4/aten__add @ m.py:15"),
                   (5, "constant", [], "prim__Constant @ m.py:12"))
    assert _calls(graph, regions) == [("layer_norm", (0, 1, 2, 3)), ("add", (4,))]


def test_an_ir_scope_before_the_torch_call_is_not_the_call():
    # A training step's forward is traced inside an IR scope: torch-xla prefixes each op's name
    # with it. `x + gate * y` on one line is two calls (mul, add) with or without the scope, and
    # the rerun of a checkpointed block (no scope) makes the same two.
    graph = _graph((0, "multiply", [None, None], "hlo_trace_forward.3/aten__mul.5/aten__mul @ m.py:9"),
                   (1, "add", [None, 0], "hlo_trace_forward.3/aten__add.6/aten__add @ m.py:9"),
                   (2, "multiply", [None, None], "aten__mul.7/aten__mul @ m.py:9"),
                   (3, "add", [None, 2], "aten__add.8/aten__add @ m.py:9"),
                   (4, "add", [None], "hlo_trace_optimizer.1 @ m.py:20"))
    assert _calls(graph) == [("mul", (0,)), ("add", (1,)), ("mul", (2,)), ("add", (3,)),
                             ("hlo_trace_optimizer", (4,))]


def test_ops_without_a_location_are_calls_of_their_own():
    graph = _graph((0, "multiply", [None], ""), (1, "add", [0], ""))
    assert _calls(graph) == [("multiply", (0,)), ("add", (1,))]


@pytest.mark.parametrize("document, expected", [
    ({"library_calls": [{"kind": "copy", "file": "m.py", "first_line": 3, "last_line": 5}]},
     (CallRegion("copy", "m.py", 3, 5),)),
    ({"library_calls": [{"kind": "copy", "file": "m.py"}]}, ()),   # malformed: ignored whole
    ({"library_calls": "nope"}, ()),
    ({}, ()),
    (None, ()),
])
def test_sidecar_regions(document, expected):
    assert sidecar_call_regions(document) == expected


def test_gpu_descriptions_carry_per_class_efficiencies_and_the_40gb_a100():
    a100 = load_chip("a100-sxm")
    table = dict(a100.kernel_model.vector_efficiency)
    assert a100.kernel_model.hbm_efficiency_for("layer_norm") == table["layer_norm"]
    assert a100.kernel_model.hbm_efficiency_for("softmax") == table["softmax"]
    assert a100.kernel_model.hbm_efficiency_for("fusion(add,multiply)") == a100.kernel_model.hbm_efficiency
    small = load_chip("a100-sxm-40gb")
    assert small.kernel_model.vector_efficiency == a100.kernel_model.vector_efficiency  # transferred: same fractions
    assert small.dram_bandwidth_bytes_per_s == 1555e9
    assert small.dram_capacity_bytes == 40e9
    assert small.gemm_flops_per_s == a100.gemm_flops_per_s
    assert load_chip("8xa100-40gb").name == "a100-sxm-40gb"


def test_arithmetic_on_scalars_alone_belongs_to_no_call():
    # eps * alpha of two Python numbers torch-xla passed as arguments: host arithmetic in PyTorch
    graph = _graph((0, "reduce", [None], "aten__mean @ m.py:3"),
                   (1, "multiply", [None, None], "aten__add.4/aten__add @ m.py:3"),
                   (2, "add", [0, 1], "aten__add.4/aten__add @ m.py:3"))
    graph.nodes[1]["result_shapes"], graph.nodes[1]["operand_shapes"] = ((),), ((), ())
    assert _calls(graph) == [("mean", (0,)), ("add", (2,))]


def test_an_op_on_a_one_element_tensor_is_a_kernel():
    # a device's (1, 1) slice of the timestep compared with a Python number: a tensor on the GPU,
    # as the (2, 1) timestep of both samples is on one device
    graph = _graph((0, "compare", [None, None], "aten__le @ m.py:3"))
    graph.nodes[0]["result_shapes"], graph.nodes[0]["operand_shapes"] = ((1, 1),), ((), (1, 1))
    assert _calls(graph) == [("le", (0,))]


def test_a_devices_offsets_computed_from_its_index_belong_to_no_call():
    # GSPMD: offset = table[partition_id]; x[offset:offset + 2] of an argument. The device knows
    # its offset on the host: the slice is the one call.
    graph = _graph((0, "constant", [], "aten__repeat @ m.py:3"),
                   (1, "partition_id", [], "aten__repeat @ m.py:3"),
                   (2, "dynamic_slice", [0, 1], "aten__repeat @ m.py:3"),
                   (3, "reshape", [2], "aten__repeat @ m.py:3"),
                   (4, "dynamic_slice", [None, 3], "aten__repeat @ m.py:3"))
    for node, shape in ((0, (8,)), (1, ()), (2, (1,)), (3, ())):
        graph.nodes[node]["result_shapes"] = (shape,)
    graph.nodes[2]["operand_shapes"] = ((8,), ())
    graph.nodes[3]["operand_shapes"] = ((1,),)
    graph.nodes[4]["operand_shapes"] = ((4, 8), ())
    assert folded_constants(graph) == {0, 1, 2, 3}
    assert _calls(graph) == [("repeat", (4,))]


def test_a_splat_of_a_scalar_that_two_calls_read_joins_neither():
    # torch-xla makes one splat of a layer norm's epsilon (a scalar argument) and every layer
    # norm of the shape reads it: two norms (lines 12-13 of the region, the second on another
    # tensor) are two kernels, not one through the splat
    regions = (CallRegion("layer_norm", "m.py", 10, 14),)
    graph = _graph((0, "broadcast_in_dim", [None], "aten__add.1/aten__add @ m.py:13"),
                   (1, "reduce", [None], "aten__mean @ m.py:12"),
                   (2, "add", [1, 0], "aten__add.1/aten__add @ m.py:13"),
                   (3, "reduce", [None], "aten__mean @ m.py:12"),
                   (4, "add", [3, 0], "aten__add.1/aten__add @ m.py:13"))
    graph.nodes[0]["operand_shapes"] = ((),)
    assert _calls(graph, regions) == [("layer_norm", (1, 2)), ("layer_norm", (3, 4))]


def test_a_norm_or_gelu_kernel_writes_its_result_alone():
    # tanh GELU's temporary t = tanh(x) (node 1) is read by the call's product (node 2) and, as
    # torch-xla's backward shares the node, by the backward (node 3): PyTorch's GELU kernel reads
    # x and writes its result (2 x 4*8 bf16 = 128 bytes); written, t would be 64 more
    from hlo_analyzer.mapping.fusion import group_io
    from hlo_analyzer.mapping.works import real_elements

    graph = _graph((0, "multiply", [None], "aten__tanh_gelu @ m.py:3"),
                   (1, "tanh", [0], "aten__tanh_gelu @ m.py:3"),
                   (2, "multiply", [1, None], "aten__tanh_gelu @ m.py:3"),
                   (3, "multiply", [1, None], "aten__tanh_gelu_backward @ m.py:3"))
    for node in graph:
        graph.nodes[node].update(arguments=[0 if p is None else None for p in graph.nodes[node]["operands"]],
                                 dtype="bf16", operand_dtypes=("bf16",) * len(graph.nodes[node]["operands"]))
    attributes_of = dict(graph.nodes(data=True))
    real = real_elements(attributes_of, sorted(graph))
    written = [group_io(graph, attributes_of, [0, 1, 2], set(), real, results_only=only) for only in (False, True)]
    assert [sum(io.entering_bytes) + io.out_bytes for io in written] == [64 + 128, 128]
