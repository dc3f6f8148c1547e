"""scripts/calibrate_gpu.py and hardware/calibration.py: every GPU description's [kernel_model]
equals what its calibration data give, and each fit recovers constants from points made by hand."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from hardware import load_chip
from hardware.calibration import (
    Point,
    fit_efficiency,
    fit_fixed_cost,
    fit_gemm,
    fit_group_norm,
    gemm_time_s,
)
from hlo_trace.cli import run_click

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("calibrate_gpu", ROOT / "scripts" / "calibrate_gpu.py")
calibrate_gpu = importlib.util.module_from_spec(spec)
sys.modules["calibrate_gpu"] = calibrate_gpu
spec.loader.exec_module(calibrate_gpu)

BW = 3.35e12


def stream(kind, family, n_bytes, seconds, **params):
    return Point(kind, family, tuple(params.items()), n_bytes // 4, n_bytes, 0, seconds)


def test_every_gpu_file_equals_its_calibration(capsys):
    assert run_click(calibrate_gpu.main, ["--check"]) == 0
    assert "ok: 5 GPU descriptions" in capsys.readouterr().out


def test_a_hand_edited_constant_is_caught(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    shutil.copytree(ROOT / "hardware" / "data", data)
    path = data / "h200-sxm.toml"
    path.write_text(path.read_text().replace("\nstrided = ", "\nstrided = 0.5\n# was: strided = ", 1))
    monkeypatch.setattr(calibrate_gpu, "DATA", data)
    with pytest.raises(SystemExit) as stop:
        run_click(calibrate_gpu.main, ["--check"])
    assert stop.value.code == 1
    assert "stale: h200-sxm.toml" in capsys.readouterr().err


@pytest.mark.parametrize(("card", "source"), [("h100-pcie", "h100-sxm"), ("a100-sxm-40gb", "a100-sxm")])
def test_a_transferred_group_norm_names_the_clock_rule_its_row_rate_follows(card, source):
    """The row rate is scaled by the ratio of SM clocks (rule clock), not carried as a fraction."""
    chip, from_chip = load_chip(card), load_chip(source)
    model, from_model = chip.kernel_model, from_chip.kernel_model
    clocks = calibrate_gpu.SM_CLOCK_GHZ[card] / calibrate_gpu.SM_CLOCK_GHZ[source]
    assert model.group_norm_row_bandwidth_bytes_per_s == pytest.approx(
        from_model.group_norm_row_bandwidth_bytes_per_s * clocks, abs=0.005e9)
    assert "rule clock" in model.provenance_of("group_norm")
    assert "rule clock" not in model.provenance_of("layer_norm")


def test_fixed_cost_is_the_intercept_of_the_streams():
    """Two families made as 2.5 us + bytes / 3 TB/s and 3.5 us + bytes / 2.9 TB/s (above 16 MB):
    intercepts 2.5 and 3.5 us, median 3 us; the points below 16 MB (the L2's) do not count."""
    points = [stream("stream", "a", b, 2.5e-6 + b / 3e12) for b in (32e6, 128e6, 512e6)]
    points += [stream("stream", "b", b, 3.5e-6 + b / 2.9e12) for b in (32e6, 128e6, 512e6)]
    points += [stream("stream", "a", 1e6, 1e-6)]
    assert fit_fixed_cost(points) == pytest.approx(3e-6, rel=1e-9)


def test_efficiency_of_exact_points_is_recovered_and_short_points_are_left_out():
    """Points made as 3 us + bytes / (3.35 TB/s x 0.4) give 0.4 exactly; a 10 us point far off
    the line (the launch floor's) is shorter than MIN_FIT_SECONDS and changes nothing."""
    points = [stream("copy", "f", b, 3e-6 + b / (BW * 0.4)) for b in (64e6, 256e6, 1024e6)]
    assert fit_efficiency(points, BW, 3e-6) == pytest.approx(0.4, rel=1e-12)
    assert fit_efficiency([*points, stream("copy", "f", 1e6, 10e-6)], BW, 3e-6) == pytest.approx(0.4, rel=1e-12)


def test_group_norm_fit_separates_the_apply_pass_from_the_row_moments():
    """GroupNorm points made with an apply pass at 0.5 and rows streaming 2 GB/s each, at 32 and
    128 rows: t = 3 us + 4n / (3.35 TB/s x 0.5) + 2n / (rows x 2 GB/s) for n elements."""
    points = []
    for rows in (32, 128):
        for n in (2**24, 2**26):
            seconds = 3e-6 + 4 * n / (BW * 0.5) + 2 * n / (rows * 2e9)
            points.append(Point("group_norm", "g", (("rows", rows),), n, 4 * n, 0, seconds))
    apply_eff, row_bw = fit_group_norm(points, BW, 0.9, 3e-6)
    assert apply_eff == pytest.approx(0.5, rel=1e-9)
    assert row_bw == pytest.approx(2e9, rel=1e-9)


def test_gemm_fit_recovers_constants_that_made_its_points():
    """GEMM points timed by the kernel model itself at mma 0.7, K overhead 128 (both on the
    search grid): the fit finds them back (their error is then 0)."""
    chip = load_chip("h100-sxm")
    import dataclasses

    made = dataclasses.replace(chip, kernel_model=dataclasses.replace(
        chip.kernel_model, gemm_mma_efficiency=0.7, gemm_k_overhead_elements=128))
    points = []
    for m, k, n in ((8192, 4096, 4096), (16384, 1024, 12288), (4096, 8192, 1000), (65536, 256, 4096)):
        p = Point("gemm", "g", (("M", m), ("K", k), ("N", n)), m * n, 0, 2 * m * k * n, 1.0)
        points.append(dataclasses.replace(p, seconds=gemm_time_s(p, made)))
    assert fit_gemm(points, chip)[:2] == (0.7, 128)


def test_flash_efficiency_between_measured_head_dims_is_interpolated():
    """Measured 128 -> 0.3 and 256 -> 0.2: 160 is a quarter of the way, 0.275; 192 halfway,
    0.25; 32 below every measured one takes the nearest, 64's 0.24."""
    values = dict(zip(calibrate_gpu.FLASH_HEAD_DIMS, calibrate_gpu._flash_list({64: 0.24, 128: 0.3, 256: 0.2}),
                      strict=True))
    assert values[160] == pytest.approx(0.275) and values[192] == pytest.approx(0.25)
    assert values[32] == 0.24 and values[96] == pytest.approx(0.27)
