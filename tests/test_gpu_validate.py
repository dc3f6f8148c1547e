"""benchmarks/gpu_validate.py without a GPU: the error arithmetic on synthetic timings, the
ATen-op -> tool-op translation, and the one-line exit without CUDA."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from pinned_cards import PINNED_H100

from hardware import OpType, load_chip

SPEC = importlib.util.spec_from_file_location("gpu_validate", Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_validate.py")
gpu_validate = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_validate"] = gpu_validate  # dataclasses look their module up by name
SPEC.loader.exec_module(gpu_validate)
KernelTiming = gpu_validate.KernelTiming


def test_errors_per_kind_and_pair_by_hand():
    timings = [
        KernelTiming("s1", "fc1", "gemm", 1.0e-3, 1.1e-3),
        KernelTiming("s1", "fc2", "gemm", 3.0e-3, 2.7e-3),
        KernelTiming("s1", "attn", "flash_attention", 2.0e-3, 2.5e-3),
        KernelTiming("s1", "ln", "layer_norm", 0.5e-3, 0.4e-3),
        KernelTiming("s2", "fc1", "gemm", 2.0e-3, 2.0e-3),
    ]
    rows = gpu_validate.summarize(timings)
    by = {(r.shape, r.kind): r for r in rows}
    # GEMM s1: measured 4.0 ms, predicted 3.8 ms -> 3.8/4.0 - 1 = -5%.
    assert by["s1", "gemm"].ops == 2 and by["s1", "gemm"].error == pytest.approx(-0.05)
    # Flash attention: 2.5/2.0 - 1 = +25%; vector 0.4/0.5 - 1 = -20%.
    assert by["s1", "flash_attention"].error == pytest.approx(0.25)
    assert by["s1", "layer_norm"].error == pytest.approx(-0.20)
    # Pair s1: measured 1+3+2+0.5 = 6.5 ms, predicted 1.1+2.7+2.5+0.4 = 6.7 ms -> +3.08%.
    assert by["s1", "pair"].measured_s == pytest.approx(6.5e-3)
    assert by["s1", "pair"].error == pytest.approx(6.7 / 6.5 - 1)
    assert by["s2", "pair"].error == pytest.approx(0.0)
    assert [r.kind for r in rows if r.shape == "s1"] == ["gemm", "flash_attention", "layer_norm", "pair"]
    text = gpu_validate.render_markdown(rows, ["device: synthetic"])
    assert "| s1 | pair | 4 | 6.500 | 6.700 | +3.1% |" in text and "- device: synthetic" in text
    assert gpu_validate.render_csv(rows).splitlines()[0] == "shape,kind,ops,measured_s,predicted_s,error"
    assert math.isnan(gpu_validate.ErrorRow("s", "gemm", 0, 0.0, 1.0).error)


def test_aten_ops_become_tool_ops():
    # nn.Linear(1152 -> 4608) on (2, 100, 1152): aten::linear(input, weight (N, K), bias).
    linear = gpu_validate.op_from_aten("aten::linear", 3, [[2, 100, 1152], [4608, 1152], [4608]])
    assert linear.op_type is OpType.GEMM and linear.weight_shape == (1152, 4608) and linear.flops == 2 * 200 * 1152 * 4608
    sdpa = gpu_validate.op_from_aten("aten::scaled_dot_product_attention", 4, [[1, 16, 600, 72], [1, 16, 300, 72], [1, 16, 300, 72]])
    assert sdpa.op_type is OpType.FLASH_ATTENTION and sdpa.flops == 4 * 16 * 600 * 300 * 72
    add = gpu_validate.op_from_aten("aten::add", 5, [[2, 100, 1152], [2, 100, 1152]])
    assert add.op_type is OpType.VECTOR and add.output_shape == (200, 1152) and len(add.input_shapes) == 2
    assert gpu_validate.op_from_aten("aten::view", 6, [[2, 100, 1152], []]) is None
    # A reshape that had to copy (a permuted input) is a copy kernel; LayerNorm and softmax are
    # named after their class, which picks their in-model efficiency (h100-sxm: 0.41, 0.55,
    # pinned: tests/data/h100-sxm-pinned.toml).
    copy = gpu_validate.op_from_aten("aten::reshape", 7, [[2, 100, 1152], []], launched=True)
    assert gpu_validate.kernel_class(copy) == "copy"
    norm = gpu_validate.op_from_aten("aten::layer_norm", 8, [[2, 100, 1152], []])
    assert gpu_validate.kernel_class(norm) == "layer_norm" and gpu_validate.kernel_class(linear) == "gemm"
    chip = load_chip(PINNED_H100)
    # both move 2 x 2*100*1152*2 bytes: the LayerNorm at 0.55 of 3.35 TB/s, the copy at 0.41
    assert gpu_validate.predict(norm, chip) - 3e-6 == pytest.approx(921600 / (3.35e12 * 0.55))
    assert gpu_validate.predict(copy, chip) - 3e-6 == pytest.approx(921600 / (3.35e12 * 0.41))
    # The eager model: one kernel with its overhead: a tiny add costs at least the 3 us overhead.
    assert gpu_validate.predict(add, chip) >= 3e-6


def test_without_cuda_one_line_and_exit_0(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the harness would measure")
    assert gpu_validate.main([]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and "no CUDA device" in out
