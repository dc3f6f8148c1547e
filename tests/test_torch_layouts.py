"""hlo_analyzer.mapping.torch_layouts: which tensors an eager PyTorch run leaves non-contiguous, on
hand-built dataflow nodes (each a dict as the dataflow graph holds it), and the kernel model's
classes and fused-attention key overhead that price them (hardware/spec.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hardware import MEMORY_KERNEL_CLASSES, Op, OpType, load_chip, map_op
from hlo_trace.errors import InputFileError

ROOT = Path(__file__).resolve().parent.parent

from hlo_analyzer.mapping.torch_layouts import (
    PERMUTED,
    TRANSPOSED,
    layouts,
    mixes_transposed,
    transpose_kind,
)


def node(name, operands, operand_shapes, result_shape, op=None, arguments=None, **extra):
    """``operands``: producing nodes, None for a function argument (numbered by ``arguments``)."""
    return {"name": name, "op": op or f"stablehlo.{name}", "operands": list(operands),
            "arguments": list(arguments or [None] * len(operands)),
            "operand_shapes": tuple(map(tuple, operand_shapes)), "result_shapes": (tuple(result_shape),), **extra}


@pytest.mark.parametrize(("permutation", "feeds_gemms", "expected"), [
    ((0, 2, 1), False, TRANSPOSED),        # (B, C, N) -> (B, N, C): the last axis moved
    ((0, 2, 1), True, None),               # the same swap as a matmul operand: cuBLAS reads it so
    ((2, 0, 3, 1, 4), False, PERMUTED),    # the heads split off a fused qkv: rows intact
    ((0, 1, 2), False, None),              # the identity
    ((1, 0, 2), True, PERMUTED),           # batch axes swapped: a copy for torch.matmul
])
def test_transpose_kind(permutation, feeds_gemms, expected):
    assert transpose_kind(permutation, feeds_gemms) == expected


def residual_program():
    """0: argument view (B, C, N); 1: transpose to (B, N, C); 2: convert; 3: a contiguous update
    (a GEMM's result); 4: x + update; 5: update + x; 6: a broadcast vector; 7: x * vector;
    8: a reduction of x."""
    b, c, n = 2, 8, 16
    return {
        0: node("reshape", [None], [(b, c, n)], (b, c, n)),
        1: node("transpose", [0], [(b, c, n)], (b, n, c), permutation=(0, 2, 1)),
        2: node("convert", [1], [(b, n, c)], (b, n, c)),
        3: node("dot_general", [None, None], [(b, n, c), (c, c)], (b, n, c)),
        4: node("add", [2, 3], [(b, n, c)] * 2, (b, n, c)),
        5: node("add", [3, 2], [(b, n, c)] * 2, (b, n, c)),
        6: node("broadcast_in_dim", [None], [(c,)], (b, n, c)),
        7: node("multiply", [6, 4], [(b, n, c)] * 2, (b, n, c)),
        8: node("reduce", [4, None], [(b, n, c), ()], (b, n)),
    }


def test_an_element_wise_result_follows_its_first_full_size_input():
    program = residual_program()
    real = {k: (8 if k == 6 else 2 * 16 * 8) for k in program}  # the broadcast holds its 8 values
    layout = layouts(program, sorted(program), lambda n: n == 3, real, lambda n: False)
    assert layout == {1: TRANSPOSED, 2: TRANSPOSED, 4: TRANSPOSED, 7: TRANSPOSED}
    # node 5 starts with the contiguous update: PyTorch writes it contiguous; the reduction too
    assert 5 not in layout and 8 not in layout
    full = (2, 16, 8)
    assert mixes_transposed(program, [(2, full), (3, full)], 2 * 16 * 8, layout)
    assert not mixes_transposed(program, [(2, full), (6, (8,))], 2 * 16 * 8, layout)  # a vector is no input of its size


def test_a_stage_input_declared_channel_major_carries_its_layout():
    """A later stage reads the residual stream as argument 3: seeded TRANSPOSED, the add that
    starts with it is too, and mixing it with a contiguous update is strided."""
    shape = (2, 16, 8)
    program = {0: node("dot_general", [None, None], [shape, (8, 8)], shape, arguments=[0, 1]),
               1: node("add", [None, 0], [shape, shape], shape, arguments=[3, None])}
    layout = layouts(program, [0, 1], lambda n: n == 0, {0: 256, 1: 256}, lambda n: False,
                     {("argument", 3): TRANSPOSED})
    assert layout[1] == TRANSPOSED
    assert mixes_transposed(program, [(("argument", 3), shape), (0, shape)], 256, layout)


@pytest.mark.parametrize("card", ["h100-sxm", "h200-sxm", "h100-pcie", "a100-sxm", "a100-sxm-40gb"])
def test_every_gpu_card_describes_every_kernel_class_with_its_provenance(card):
    model = load_chip(card).kernel_model
    assert {name for name, _ in model.vector_efficiency} >= set(MEMORY_KERNEL_CLASSES)
    for name in (*MEMORY_KERNEL_CLASSES, "gemm", "flash_attention", "kernel_overhead"):
        assert model.provenance_of(name).startswith(("measured: ", "public: ", "transferred from ")), name


def test_a_card_without_a_class_is_refused_naming_it(tmp_path):
    text = (ROOT / "hardware" / "data" / "h100-sxm.toml").read_text()
    broken = tmp_path / "card.toml"
    broken.write_text("\n".join(line for line in text.splitlines() if not line.startswith("strided = ")))
    with pytest.raises(InputFileError, match="missing: strided"):
        load_chip(broken)


def test_row_efficiency_interpolates_in_log_row_length():
    """Points (16, 0.2) and (1024, 0.8): at 128 rows of length, log2 128 - log2 16 = 3 of the 6
    between them, so halfway: 0.5; held at both ends."""
    model = dataclasses.replace(load_chip("h100-sxm").kernel_model, row_efficiency=(("reduction", ((16, 0.2), (1024, 0.8))),))
    assert model.hbm_efficiency_for("reduction", 128) == pytest.approx(0.5)
    assert model.hbm_efficiency_for("reduction", 4) == 0.2
    assert model.hbm_efficiency_for("reduction", 10**6) == 0.8
    assert model.hbm_efficiency_for("reduction") == dict(model.vector_efficiency)["reduction"]


def test_flash_kv_overhead_slows_short_key_sequences():
    """The 96 kernel at 0.30 of 989.4 TFLOPS, times 300 / (300 + 112) over 300 keys; head dim 72
    runs padded to 96. One (2, 16, 1000, 72) x 300-key attention, plus 3 us."""
    chip = load_chip("h100-sxm")
    model = dataclasses.replace(chip.kernel_model, flash_efficiency=(0.30,) * len(chip.kernel_model.flash_head_dims),
                                flash_kv_overhead=112, kernel_overhead_s=3e-6, launch_floor_s=0.0)
    chip = dataclasses.replace(chip, kernel_model=model)
    q, k = (2, 16, 1000, 72), (2, 16, 300, 72)
    op = Op("attention", OpType.FLASH_ATTENTION, (q, k, k), None, q, 4 * 2 * 16 * 1000 * 300 * 72, 2,
            vector_flops=2 * 16 * 1000 * 300)
    padded = 4 * 2 * 16 * 1000 * 300 * 96
    expected = padded / (989.4e12 * 0.30 * 300 / (300 + 112)) + 3e-6
    assert map_op(op, chip).latency_s == pytest.approx(expected, rel=1e-3)


def test_gspmds_layout_of_a_collectives_result_is_contiguous():
    """ds_ulysses' exchange of the attention output: GSPMD reshapes, all-to-alls and transposes
    the received pieces next to the axis they join; the collective wrote a contiguous buffer
    (the official all-to-all returns ``torch.cat(...).contiguous()``), so nothing is permuted.
    The model's own permute of a collective's result still is."""
    b, length, h = 1, 32, 64
    program = {
        0: node("dot_general", [None, None], [(b, 4, length, 16), (b, 4, length, 16)], (b, 4, length, 16)),
        1: node("all_to_all", [0], [(b, 4, length, 16)], (b, 4, length, 16)),
        2: node("transpose", [1], [(b, 4, length, 16)], (b, length, 4, 16), permutation=(0, 2, 1, 3),
                location="xla__custom_sharding @ xla_sharding.py:659"),
        3: node("reshape", [2], [(b, length, 4, 16)], (b, length, h)),
        4: node("transpose", [1], [(b, 4, length, 16)], (b, length, 4, 16), permutation=(0, 2, 1, 3),
                location="aten__permute @ stdit3.py:170"),
    }
    real = {k: b * length * h for k in program}
    layout = layouts(program, sorted(program), lambda n: n == 0, real, lambda n: False)
    assert layout == {4: PERMUTED}
