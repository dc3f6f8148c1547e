"""hardware/tiled_gemm.py and the Tenstorrent check: wave quantisation, SRAM blocking and the
default program derived by hand on small shapes; one GEMM's time summed by hand; the fit
recovering constants it made; scripts/calibrate_tiled.py --check; the predictions recomputed from
the committed tables."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from hardware import load_chip
from hardware.spec import tiled_model_constants
from hardware.tiled_calibration import (
    FITTED,
    PublishedGemm,
    agreement,
    fit_loss,
    load_published_gemms,
    pattern_search,
    predicted_seconds,
    with_constants,
)
from hardware.tiled_gemm import (
    cycles_per_tile_product,
    default_program,
    engine_subblock,
    output_blocks,
    sram_blocking,
    sram_footprint,
    tiled_gemm,
)
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError

ROOT = Path(__file__).resolve().parent.parent
BF16_TILE = 2048


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def round_numbers(chip):
    """``chip`` with fitted constants replaced by round numbers a hand sum can follow."""
    return with_constants(chip, [1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 10e-6, 30e-6])


# -- wave quantisation ---------------------------------------------------------------------------

def test_wave_quantisation_of_a_ragged_edge():
    # 17 x 8 output tiles in 3 x 1 blocks: ceil(17/3) = 6 block rows x 8 = 48 blocks, one wave on
    # 64 cores; the slots hold 64 * 3 = 192 tiles for 136 useful ones.
    blocks = output_blocks(17, 8, 3, 1, 64)
    assert (blocks.count, blocks.waves) == (48, 1)
    assert blocks.grid_share == pytest.approx(136 / 192)


def test_waves_beyond_the_core_count():
    # 17 x 16 single-tile blocks on 64 cores: 272 blocks, 5 waves (the last holds 16), share 272/320.
    blocks = output_blocks(17, 16, 1, 1, 64)
    assert (blocks.count, blocks.waves) == (272, 5)
    assert blocks.grid_share == pytest.approx(0.85)
    assert output_blocks(16, 16, 1, 1, 64).grid_share == 1.0


# -- SRAM blocking -------------------------------------------------------------------------------

def _fits(budget):
    return lambda m, n, k: sram_footprint(m, n, k, BF16_TILE, 2) <= budget


def test_sram_footprint_by_hand():
    # double-buffered (4 + 4) x 4 operand tiles and a 4 x 4 output block: (64 + 16) * 2048 B
    assert sram_footprint(4, 4, 4, BF16_TILE, 2) == 80 * BF16_TILE


def test_sram_blocking_cuts_the_block_closest_to_square():
    # 4x4 with K block 4 needs 163840 B; within 100000 B: area 8 (2x4) needs 114688, area 4 (2x2,
    # preferred to 4x1) needs 73728 B.
    assert sram_blocking(4, 4, 4, _fits(100_000), shrink_k=True) == (2, 2, 4)
    assert sram_blocking(4, 4, 4, _fits(200_000), shrink_k=True) == (4, 4, 4)


def test_sram_blocking_shrinks_k_only_when_allowed():
    # 1x1 with K block 4 needs 2 * 2 * 4 tiles + 1 = 34816 B, with K block 2 18432 B, with 1 10240 B.
    assert sram_blocking(4, 4, 4, _fits(40_000), shrink_k=False) == (1, 1, 4)
    assert sram_blocking(4, 4, 4, _fits(20_000), shrink_k=True) == (1, 1, 2)
    assert sram_blocking(4, 4, 4, _fits(15_000), shrink_k=True) == (1, 1, 1)
    # nothing fits without shrinking K: the last resort is one tile and one K tile
    assert sram_blocking(4, 4, 4, _fits(20_000), shrink_k=False) == (1, 1, 1)


def test_engine_subblock_takes_the_first_shape_that_divides():
    assert engine_subblock(8, 8, 8) == (4, 2)
    assert engine_subblock(16, 1, 8) == (8, 1)
    assert engine_subblock(3, 5, 8) == (1, 5)
    assert engine_subblock(2, 2, 8) == (2, 2)


# -- the default program -------------------------------------------------------------------------

def test_default_program_2d_large_square_on_n150():
    # 4096^3: 128 tiles a side; the 16x16 probe fits (786432 B), 8 x 8 blocks fill the grid: 2D,
    # 16 x 16 per core, K block 128 / 8 = 16. That needs 2.6 MB; the largest sub-block within
    # 1.3 MB is 8 x 8 (1.18 MB); 4 sub-blocks per core.
    n150 = load_chip("n150")
    program = default_program(n150, 128, 128, 128, BF16_TILE)
    assert program.kind == "2d"
    assert (program.blocks.block_m, program.blocks.block_n) == (16, 16)
    assert (program.out_block_m, program.out_block_n, program.k_block) == (8, 8, 16)
    assert program.out_blocks_per_core == 4
    assert program.subblock == (4, 2)


def test_default_program_1d_when_the_blocks_form_one_row():
    # 512 x 1024 x 1024: Mt = 16 is one 16-tile block row, Nt = 32 two: in0 multicast to all
    # cores, each with all 16 rows and ceil(32 / 64) = 1 column, K block 2.
    program = default_program(load_chip("n150"), 16, 32, 32, BF16_TILE)
    assert program.kind == "1d_in0"
    assert (program.blocks.block_m, program.blocks.block_n, program.k_block) == (16, 1, 2)
    assert program.subblock == (8, 1)
    tall = default_program(load_chip("n150"), 32, 32, 16, BF16_TILE)
    assert tall.kind == "1d_in1" and (tall.blocks.block_m, tall.blocks.block_n) == (1, 16)


def test_narrow_output_is_1d():
    # 32 x 300 tiles: 300 > 8 * 32, a narrow (wide) output
    assert default_program(load_chip("n150"), 32, 8, 300, BF16_TILE).kind == "1d_in0"


# -- one GEMM by hand ----------------------------------------------------------------------------

def test_cycles_per_tile_product_by_hand():
    model = round_numbers(load_chip("n150")).tiled_model
    # a 4x2 sub-block reads 6 tiles for 8 products: 1536 B at 1.0 x 32 B/cycle = 48 cycles > 32 (HiFi2)
    assert cycles_per_tile_product(model, "HiFi2", "bf16", (4, 2)) == pytest.approx(48)
    assert cycles_per_tile_product(model, "HiFi4", "bf16", (4, 2)) == pytest.approx(64)


def test_tiled_gemm_512_cubed_by_hand():
    # 2D, 2 x 2 tiles per core, K block 16 / 8 = 2: 8 K steps. A 2x2 sub-block reads 4 tiles for
    # 4 products: 2048 B / 32 B per cycle = 64 cycles each; a step computes 8 products: 512 ns.
    # A sender reads 2 x 2 tiles = 8192 B at 0.5 x 32 GB/s: 512 ns; all senders read
    # (8 x 2 + 8 x 2) x 2 tiles = 131072 B at 288 GB/s: 455 ns. Step 512 ns, 8 steps 4.096 us;
    # the 4-tile output block written at 16 GB/s: 512 ns: 4.608 us on the cores, less than the
    # 3 x 512^2 x 2 B the op moves through 288 GB/s (5.461 us); dispatch from a trace 10 us.
    estimate = tiled_gemm(round_numbers(load_chip("n150")), 512, 512, 512)
    assert estimate.program.kind == "2d" and estimate.fidelity == "HiFi2"
    assert estimate.compute_s == pytest.approx(8 * 512e-9)
    assert estimate.sender_read_s == pytest.approx(8 * 512e-9)
    assert estimate.dram_s == pytest.approx(8 * 131072 / 288e9)
    assert estimate.seconds == pytest.approx(3 * 512 ** 2 * 2 / 288e9 + 10e-6)
    assert estimate.compute_s + estimate.output_write_s == pytest.approx(4.608e-6)
    # the bound: 3 x 512^2 x 2 B through 288 GB/s (5.46 us) beats 2 x 512^3 FLOP at 64 cores x
    # 2048 FLOP/cycle (HiFi2) x 1 GHz (2.05 us)
    assert estimate.bound_s == pytest.approx(3 * 512 ** 2 * 2 / 288e9)
    # a GEMM with K = 32 is memory-bound: its device time is the DRAM bound
    thin = tiled_gemm(round_numbers(load_chip("n150")), 8192, 32, 8192)
    assert thin.seconds == pytest.approx(thin.bound_s + 10e-6)
    assert tiled_gemm(round_numbers(load_chip("n150")), 512, 512, 512, trace=False).seconds == pytest.approx(
        estimate.seconds + 20e-6)


def test_partial_reload_by_hand():
    # 1024^3 on n150: 2D, a 4 x 4 tile block per core, K block 32 / 8 = 4 tiles: 8 K blocks. Each
    # of the 16 output tiles is spilled and reloaded before K blocks 2..8: 7 x 16 reloads of 100
    # cycles at 1 GHz = 11.2 us more compute.
    plain = round_numbers(load_chip("n150"))
    reloading = dataclasses.replace(plain, tiled_model=dataclasses.replace(plain.tiled_model,
                                                                          partial_reload_cycles=100.0))
    before, after = tiled_gemm(plain, 1024, 1024, 1024), tiled_gemm(reloading, 1024, 1024, 1024)
    assert after.program.k_block == 4 and after.program.out_block_m * after.program.out_block_n == 16
    assert after.compute_s - before.compute_s == pytest.approx(7 * 16 * 100e-9)


def test_padding_a_block_of_prime_tiles():
    # 56 x 56 output tiles on n150's 8 x 8 grid: 7 x 7 tiles per core, 7 prime. Padded to a
    # multiple of 2 the block is 8 x 8: ceil(56 / 8)^2 = 49 blocks on 64 cores, one wave, and the
    # engine sub-block (4, 2) (8 tiles) instead of (7, 1).
    n150 = load_chip("n150")
    plain = default_program(n150, 56, 8, 56, BF16_TILE)
    padded = default_program(n150, 56, 8, 56, BF16_TILE, pad=2)
    assert (plain.blocks.block_m, plain.subblock) == (7, (7, 1))
    assert (padded.blocks.block_m, padded.blocks.block_n, padded.blocks.count, padded.blocks.waves) == (8, 8, 49, 1)
    assert padded.subblock == (4, 2)
    # TX8 (4 x 4 cores, blocking "best"), 211 tile rows: the vendor's block of 53 rows (prime)
    # runs in 1-wide sub-blocks at 1.58x the bound; padded to 54 rows it runs 27-row halves of
    # (3, 2) sub-blocks, within 1.25x of the bound.
    estimate = tiled_gemm(load_chip("tx8"), 211 * 32, 1152, 1152)
    assert estimate.program.blocks.block_m == 54 and estimate.program.subblock == (3, 2)
    assert estimate.seconds <= 1.25 * estimate.bound_s


def test_best_blocking_takes_a_deeper_k_block():
    # TX8, M = 216000 (6750 tiles), K = N = 1152 (36 tiles): one output side exceeds 8x the other,
    # so a 1D program, whose vendor K block is 2 tiles (partial sums reloaded after every 2 tile
    # products). The deepest K block up to 16 tiles that divides 36 is 12.
    tx8 = load_chip("tx8")
    vendor = dataclasses.replace(tx8, tiled_model=dataclasses.replace(tx8.tiled_model, blocking="vendor"))
    best, default = tiled_gemm(tx8, 216000, 1152, 1152), tiled_gemm(vendor, 216000, 1152, 1152)
    assert best.program.kind == default.program.kind == "1d_in1"
    assert (default.program.k_block, best.program.k_block) == (2, 12)
    assert best.seconds < default.seconds


def test_unknown_dtype_and_fidelity_are_refused():
    n150 = load_chip("n150")
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        tiled_gemm(n150, 64, 64, 64, "fp8")
    with pytest.raises(ValueError, match="fidelity 'HiFi9'"):
        tiled_gemm(n150, 64, 64, 64, fidelity="HiFi9")
    with pytest.raises(ValueError, match="no \\[tiled_model\\]"):
        tiled_gemm(load_chip("h100-sxm"), 64, 64, 64)


def test_tiled_model_table_refuses_an_unknown_key(tmp_path):
    text = (ROOT / "hardware" / "data" / "n150.toml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("narrow_ratio = 8", "narrow_ratio = 8\nwarp_size = 32"), encoding="utf-8")
    with pytest.raises(InputFileError, match="tiled_model.warp_size"):
        load_chip(bad)


# -- the fit and the check -----------------------------------------------------------------------

def test_fit_recovers_constants_it_made():
    n150 = load_chip("n150")
    truth = [0.9, 1.2, 4.0, 5.0, 40.0, 0.3, 12e-6, 35e-6]
    made = with_constants(n150, truth)
    shapes = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (512, 1024, 2048)]
    rows = [PublishedGemm("n150", "8x8", m, k, n, trace, dtype, "HiFi2" if dtype == "bf16" else "LoFi", 0.0)
            for m, k, n in shapes for trace in (True, False) for dtype in ("bf16", "bfp8")]
    rows = [dataclasses.replace(r, seconds=predicted_seconds(made, r)) for r in rows]
    fitted = pattern_search(fit_loss(n150, rows), [1.0, 1.0, 4.0, 5.0, 20.0, 0.3, 10e-6, 30e-6],
                            [0.1, 0.1, 0.1, 0.0, 0.0, 0.01, 0.0, 0.0], [20, 20, 20, 100, 1000, 1, 1e-4, 2e-4],
                            rounds=200)
    recovered = with_constants(n150, fitted)
    for row in rows:
        assert predicted_seconds(recovered, row) == pytest.approx(row.seconds, rel=0.01)
    assert len(FITTED) == len(truth)


def test_calibrate_tiled_check_passes(capsys):
    assert run_click(_script("calibrate_tiled").main, ["--check"]) == 0
    assert "ok: n150, p150 equal the fit on the n150 table" in capsys.readouterr().out


def test_predictions_recomputed_from_committed_tables():
    predictions = _script("tiled_predictions")
    pairs = predictions.prediction_rows()
    assert predictions.csv_text(pairs) == (ROOT / "results" / "tiled" / "predictions.csv").read_text(encoding="utf-8")
    assert predictions.summary_text(pairs) == (ROOT / "results" / "tiled" / "summary.md").read_text(encoding="utf-8")


def _bf16_trace(card: str, grid: str):
    chip = load_chip(card)
    rows = [r for r in load_published_gemms() if r.card == card and r.grid == grid and r.dtype == "bf16" and r.trace]
    assert len(rows) == 13
    return agreement([predicted_seconds(chip, r) / r.seconds for r in rows])


def test_n150_bf16_with_trace_median_within_ten_percent():
    result = _bf16_trace("n150", "8x8")
    assert result.median <= 0.10
    assert result.within_20 >= 0.9


def test_p150_never_fitted_bf16_with_trace():
    result = _bf16_trace("p150", "13x10")
    assert result.median <= 0.15
    assert result.within_25 >= 0.9


# -- analyze-hlo --hw n150 / p150 ----------------------------------------------------------------

GEMM_DUMP = """module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<512x1024xbf16>, %b: tensor<1024x2048xbf16>) -> tensor<512x2048xbf16> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<512x1024xbf16>, tensor<1024x2048xbf16>) -> tensor<512x2048xbf16>
    return %0 : tensor<512x2048xbf16>
  }
}
"""


def _analyze(tmp_path, capsys, *args):
    from hlo_analyzer.cli import analyze_command

    dump = tmp_path / "gemm.mlir"
    dump.write_text(GEMM_DUMP, encoding="utf-8")
    code = run_click(analyze_command, [str(dump), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("card", ["n150", "p150"])
def test_analyze_hlo_predicts_a_bf16_gemm_at_the_default_fidelity(tmp_path, capsys, card):
    code, out, _ = _analyze(tmp_path, capsys, "--hw", card, "--format", "json")
    assert code == 0
    mapping = json.loads(out)["mapping"]
    kernel, = mapping["kernels"]
    assert kernel["latency_s"] == pytest.approx(tiled_gemm(load_chip(card), 512, 1024, 2048).seconds)
    assert mapping["model"]["efficiencies"]["math_fidelity"]["bf16"] == "HiFi2"
    assert mapping["model"]["efficiencies"]["fidelity_chosen_by"] == "the vendor's default per dtype"


def test_analyze_hlo_fidelity_option_and_constant_sources(tmp_path, capsys):
    code, out, _ = _analyze(tmp_path, capsys, "--hw", "n150", "--fidelity", "HiFi4", "--by", "kernel")
    assert code == 0
    assert "math fidelity bf16 HiFi4" in out and "math fidelity HiFi4 for every dtype (--fidelity)" in out
    hifi4 = tiled_gemm(load_chip("n150"), 512, 1024, 2048, fidelity="HiFi4").seconds
    assert f"{hifi4 * 1e6:.3f} us" in out
    # every constant of the model is printed with its source
    for key in ("tile_edge", "fidelity_cycles", "unpack_bytes_per_noc_byte", "dispatch_trace"):
        assert any(line.split()[:1] == [key] for line in out.splitlines() if line.startswith("    "))
    assert "fitted on the n150 GEMM table by scripts/calibrate_tiled.py" in out


def test_analyze_hlo_fidelity_needs_a_tiled_model_that_has_it(tmp_path, capsys):
    code, _, err = _analyze(tmp_path, capsys, "--hw", "h100-sxm", "--fidelity", "HiFi4")
    assert code == 2
    assert "Error: --fidelity HiFi4 with --hw h100-sxm: h100-sxm has no [tiled_model] table" in err
    code, _, err = _analyze(tmp_path, capsys, "--hw", "tx8", "--fidelity", "HiFi4")
    assert code == 2 and "fidelity 'HiFi4' unknown to tx8 (known: full)" in err


def test_tx8_before_after_recomputed():
    predictions = _script("tiled_predictions")
    assert predictions.tx8_before_after_text() == (ROOT / "results" / "tiled" / "tx8_before_after.md").read_text(
        encoding="utf-8")


@pytest.mark.parametrize("card", ["n150", "p150", "tx8"])
def test_every_tiled_constant_names_its_source(card):
    model = load_chip(card).tiled_model
    rows = tiled_model_constants(model)
    assert len(rows) == 17 and all(source for _, _, source in rows), [key for key, _, source in rows if not source]


def test_analyze_hlo_tx8_predicts_gemms_beside_the_bound(tmp_path, capsys):
    code, out, _ = _analyze(tmp_path, capsys, "--hw", "tx8", "--format", "json")
    assert code == 0
    mapping = json.loads(out)["mapping"]
    kernel, = mapping["kernels"]
    assert kernel["latency_s"] == pytest.approx(tiled_gemm(load_chip("tx8"), 512, 1024, 2048).seconds)
    gemm, = [c for c in mapping["classes"] if c["class"] == "gemm"]
    assert gemm["bound_seconds"] < gemm["seconds"]
    assert gemm["provenance"].startswith("rule: n150's fitted bf16 unpack rate")
