"""``--exec fused`` on small JAX programs, each op written as a library writes it: how many
kernels XLA's own fusion makes of the same program (its compiled HLO, in a child interpreter:
tests/jax_child.py), and the bytes each kernel moves, derived by hand and checked against XLA's
HloCostAnalysis of the compiled (fused) program ("bytes accessed").

Every tensor is fp16 (2 bytes); 4096x8192 is 67,108,864 B, 4096x4096 and 8x1024x16x128 are
33,554,432 B each."""

from __future__ import annotations

import json

import pytest
from jax_child import run_jax

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click

FP16 = 2
WIDE = 4096 * 8192 * FP16     # one 4096x8192 tensor
HALF = 4096 * 4096 * FP16     # one 4096x4096 tensor
HEADS = 8 * 1024 * 16 * 128 * FP16  # one 8x1024x16x128 tensor

#: (kernels, bytes) of each program by hand:
EXPECTED = {
    # x[:, :4096] * x[:, :4096]: reads the 4096x4096 slice once, writes its product.
    "slice_square": (1, HALF + HALF),
    # (x.astype(f32) * 2).astype(f16): reads and writes fp16; the f32 lives in registers.
    "mixed_precision": (1, WIDE + WIDE),
    # jax.nn.silu(g) * u (silu is a func.call): reads g and u, writes the product.
    "silu_and_mul": (1, 3 * WIDE),
    # x * cos + rotate_half(x) * sin, rotate_half a concatenate of two halves of x: reads x,
    # cos and sin once each, writes the result.
    "rope_rotate_half": (1, 4 * HEADS),
    # optimization_barrier((x, w))[0] * 2 (a checkpoint's rerun reads its saved input so): reads
    # x alone, not every tensor the barrier hands on, and writes the product.
    "barrier_read": (1, WIDE + WIDE),
}

PROGRAMS = """
from jax import numpy as jnp
F16 = jnp.float16
wide = jax.ShapeDtypeStruct((4096, 8192), F16)
heads = jax.ShapeDtypeStruct((8, 1024, 16, 128), F16)

def rotate_half(x):
    return jnp.concatenate([-x[..., 64:], x[..., :64]], axis=-1)

programs = {
    "slice_square": (lambda x: x[:, :4096] * x[:, :4096], (wide,)),
    "mixed_precision": (lambda x: (x.astype(jnp.float32) * 2).astype(F16), (wide,)),
    "silu_and_mul": (lambda g, u: jax.nn.silu(g) * u, (wide, wide)),
    "rope_rotate_half": (lambda x, cos, sin: x * cos + rotate_half(x) * sin, (heads, heads, heads)),
    "barrier_read": (lambda x, w: jax.lax.optimization_barrier((x, w))[0] * 2, (wide, wide)),
}
NOT_KERNELS = {"kParameter", "kTuple", "kGetTupleElement", "kBitcast", "kConstant"}
out = {}
for name, (function, args) in programs.items():
    lowered = jax.jit(function).lower(*args)
    compiled = lowered.compile()
    module = compiled.runtime_executable().hlo_modules()[0]
    [entry] = [c for c in module.computations() if c.name.startswith("main")]
    kernels = [i.opcode.name for i in entry.instructions() if i.opcode.name not in NOT_KERNELS]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out[name] = {"mlir": lowered.as_text(), "xla_kernels": kernels, "xla_bytes": cost["bytes accessed"]}
emit(out)
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict:
    made = run_jax(PROGRAMS)
    folder = tmp_path_factory.mktemp("fused")
    for name, program in made.items():
        program["path"] = folder / f"{name}.mlir"
        program["path"].write_text(program["mlir"])
    return made


def fused_kernels(capsys, path, hardware: str) -> list[dict]:
    code = run_click(analyze_command, [str(path), "--hw", hardware, "--exec", "fused", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)["mapping"]["kernels"]


@pytest.mark.parametrize("hardware", ["h100-sxm", "tx8"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fused_kernels_and_their_bytes_by_hand(capsys, programs, name, hardware):
    kernels, moved = EXPECTED[name]
    found = fused_kernels(capsys, programs[name]["path"], hardware)
    assert len(found) == kernels, [k["name"] for k in found]
    assert sum(k["dram_bytes"] for k in found) == moved


@pytest.mark.parametrize("name", ["slice_square", "mixed_precision", "silu_and_mul"])
def test_as_many_kernels_and_bytes_as_xlas_own_fusion(capsys, programs, name):
    """XLA's CPU fusion makes one kernel of each of these programs, and its cost analysis of the
    fused program counts the bytes derived by hand above."""
    program = programs[name]
    found = fused_kernels(capsys, program["path"], "h100-sxm")
    assert program["xla_kernels"] == ["kFusion"]
    assert len(found) == len(program["xla_kernels"])
    assert sum(k["dram_bytes"] for k in found) == program["xla_bytes"] == EXPECTED[name][1]


def test_xlas_cpu_fusion_leaves_a_concatenate_alone(programs):
    """Why RoPE's reference is torch-inductor (the slow test below): XLA's CPU backend emits the
    concatenate as an op of its own, between three fusions, and counts its bytes (9 tensors of
    8x1024x16x128: two half-size fusions, the concatenate, the final fusion)."""
    program = programs["rope_rotate_half"]
    assert sorted(program["xla_kernels"]) == ["kConcatenate", "kFusion", "kFusion", "kFusion"]
    assert program["xla_bytes"] == 9 * HEADS


def test_the_slice_kernel_names_the_slice_it_reads(capsys, programs):
    [kernel] = fused_kernels(capsys, programs["slice_square"]["path"], "h100-sxm")
    assert kernel["shapes"] == "4096x4096->4096x4096"


INDUCTOR = """
import re
import torch
from torch._inductor.utils import run_and_get_code

def rotate_half(x):
    return torch.cat([-x[..., 64:], x[..., :64]], dim=-1)

def rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin

def silu_and_mul(g, u):
    return torch.nn.functional.silu(g) * u

counts = {}
for name, function, args in (("rope_rotate_half", rope, [torch.randn(2, 8, 4, 128) for _ in range(3)]),
                             ("silu_and_mul", silu_and_mul, [torch.randn(64, 256) for _ in range(2)])):
    _, [code] = run_and_get_code(torch.compile(function), *args)
    call = code[code.index("def call("):code.index("return (")]
    counts[name] = len(re.findall(r"^\\s+cpp_fused_\\w+\\(", call, re.MULTILINE))
emit(counts)
"""


@pytest.mark.slow
def test_as_many_kernels_as_torch_inductor(capsys, programs):
    """torch-inductor (CPU, C++ kernels) launches one kernel for RoPE's rotate_half form and one
    for SiLU-and-mul: as many as --exec fused maps."""
    pytest.importorskip("torch")
    counts = run_jax(INDUCTOR, timeout_s=600)
    for name, launches in counts.items():
        assert len(fused_kernels(capsys, programs[name]["path"], "h100-sxm")) == launches == 1
