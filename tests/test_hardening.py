"""Hardening (issue 24): one regression test per example of each class found by trying the
tools as a new user would: mapping searches that ran for minutes, sizes allocated before they
were checked, internal errors, orphaned analysis processes, silently accepted input and
messages that lost their reason."""

from __future__ import annotations

import itertools
import math
import sys
import time
from pathlib import Path

import pytest
from pinned_cards import tx8_bound_toml
from test_robustness import analyze_cli, assert_one_line
from waiting import wait_until

from benchmarks.fuzz import group_members
from hardware import gemm_mapper
from hardware.gemm_mapper import (
    MAX_PLACEMENTS,
    GemmPreset,
    _placements,
    _problem,
    gemm_auto_opt_mapper,
)
from hardware.ops import Op, OpType
from hardware.spec import load_chip
from hardware.tiling import small_divisors, tile_factors
from hlo_analyzer import Report, analyze, load_module, load_module_text
from hlo_analyzer.mapping.apply import add_hardware_sections
from hlo_trace.cli import run_click
from hlo_trace.errors import InputFileError

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY = REPO_ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
TX8 = REPO_ROOT / "hardware" / "data" / "tx8.toml"


# -- 1. bounded mapping searches ------------------------------------------------------------------


def attention_module(batch_heads: int, seq: int = 16, head_dim: int = 16) -> str:
    """A batched attention (scores, exp, values) whose batch x heads dimension is ``batch_heads``."""
    t = f"tensor<{batch_heads}x{seq}x{head_dim}xbf16>"
    s = f"tensor<{batch_heads}x{seq}x{seq}xbf16>"
    return f"""module attributes {{mhlo.num_partitions = 1 : i32}} {{
  func.func @main(%q: {t}, %k: {t}, %v: {t}) -> {t} {{
    %s = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : ({t}, {t}) -> {s}
    %p = stablehlo.exponential %s : {s}
    %o = stablehlo.dot_general %p, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : ({s}, {t}) -> {t}
    return %o : {t}
  }}
}}
"""


def brute_divisors(n: int) -> set[int]:
    return {d for d in range(1, n + 1) if n % d == 0}


def test_small_divisors_are_every_divisor_up_to_2_20_and_bounded_beyond():
    for n in [*range(1, 400), 720, 1024, 4096, 65536 * 3]:
        assert set(small_divisors(n)) == brute_divisors(n), n
    big = small_divisors(2**31)
    assert big == sorted({2**i for i in range(11)} | {2**31 >> i for i in range(11)})
    assert len(small_divisors(720720 * 720720)) <= 2 * 1024


def test_tile_factors_of_every_count_up_to_1024_are_the_powers_of_two_and_all_divisors():
    for count in range(1, 1025):
        powers = {1 << i for i in range(11) if 1 << i <= count}
        assert tile_factors(count) == sorted(powers | brute_divisors(count)), count
    assert len(tile_factors(720720)) < 100 and len(tile_factors(10**9)) < 100


@pytest.mark.parametrize("tiles, batch", [(16, 1), (16, 6), (108, 1), (132, 4), (840, 3)])
def test_placements_are_every_factor_tuple_within_the_tiles_and_limits(tiles, batch):
    # the pruned loops must enumerate exactly what the plain filter over factors**4 keeps
    chip = load_chip(TX8)
    chip = type(chip)(**{**chip.__dict__, "tile_count": tiles, "tile_grid_rows": 1, "tile_grid_cols": tiles})
    m, k, n = 100, 64, 1000
    op = Op("g", OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * batch * m * k * n, batch=batch)
    problem = _problem(op, None)
    factors = tile_factors(tiles)
    limits = [math.ceil(m / 16), math.ceil(n / 16), math.ceil(k / 16), batch]
    expected = [(pm, pn, pk, pb) for pb, pm, pn, pk in itertools.product(factors, repeat=4)
                if pm * pn * pk * pb <= tiles
                and all(p <= limit for p, limit in zip((pm, pn, pk, pb), limits))]
    assert len(expected) <= MAX_PLACEMENTS
    assert _placements(chip, problem, GemmPreset()) == expected
    forced = _placements(chip, problem, GemmPreset(pm=2, pk=1))
    assert forced == [p for p in expected if p[0] == 2 and p[2] == 1]


class LineBudget:
    """A deterministic bound on work: the Python lines run (``sys.settrace``) while the block
    runs, an error as soon as they pass ``budget`` (a walk over 2**31 integers stops at once)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.lines = budget, 0

    def _trace(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines > self.budget:
                raise AssertionError(f"more than {self.budget} Python lines run")
        return self._trace

    def __enter__(self) -> LineBudget:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(None)


class GemmSearches:
    """Counts each GEMM tiling search's evaluations (``hardware.gemm_mapper``): placements
    bounded, block pairs bounded, candidates costed; a search begins with its placements."""

    NAMES = ("_placement_bound", "_pair_bound", "_costed")

    def __init__(self, monkeypatch) -> None:
        self.searches: list[dict] = []
        monkeypatch.setattr(gemm_mapper, "_SEARCHED", {})  # every search runs (none known yet)
        original = gemm_mapper._placements

        def placements(chip, problem, preset):
            found = original(chip, problem, preset)
            # the most one step of the search adds past its limit: one placement's block pairs,
            # then one pair's tk and loop-order candidates
            sizes = [gemm_mapper._candidates_of_placement(problem, chip, p, preset) for p in found]
            overshoot = max((len(tms) * len(tns) for tms, _, tns, _ in sizes), default=0) + \
                max((len(tks) * len(orders) for _, tks, _, orders in sizes), default=0)
            self.searches.append({"overshoot": overshoot, **dict.fromkeys(self.NAMES, 0)})
            return found

        monkeypatch.setattr(gemm_mapper, "_placements", placements)
        for name in self.NAMES:
            monkeypatch.setattr(gemm_mapper, name, self._counted(name, getattr(gemm_mapper, name)))

    def _counted(self, name, function):
        def counted(*args, **kwargs):
            self.searches[-1][name] += 1
            return function(*args, **kwargs)
        return counted

    def assert_within_the_limits(self) -> None:
        assert self.searches
        for search in self.searches:
            assert search["_placement_bound"] <= gemm_mapper.MAX_PLACEMENTS, search
            assert search["_pair_bound"] + search["_costed"] <= \
                gemm_mapper.MAX_SEARCH_STEPS + search["overshoot"], search


def map_in_process(module_text_or_path, hardware) -> Report:
    module = load_module_text(module_text_or_path) if isinstance(module_text_or_path, str) \
        else load_module(module_text_or_path)
    report = analyze(module)
    add_hardware_sections(report, module, str(hardware))
    return report


def test_attention_of_2_31_heads_maps_on_tx8_within_a_line_budget():
    # batch x heads = 2**31: the head-fusion search walked every integer up to it (minutes); the
    # divisors are found in at most SMALL_DIVISOR_BOUND steps, the mapping runs ~12k lines
    module = attention_module(2**31)
    with LineBudget(200_000):
        report = map_in_process(module, "tx8")
    assert [op.kind for op in report.sections.mapping.program.ops] == ["flash_attention"]


def test_attention_of_2_31_heads_maps_through_the_command(tmp_path, capsys):
    dump = tmp_path / "attention.mlir"
    dump.write_text(attention_module(2**31))
    code, out, err = analyze_cli(capsys, dump, "--hw", "tx8", "--by", "kernel")
    assert code == 0, err
    assert "flash_attention" in out


def test_a_chip_of_720720_tiles_maps_the_tiny_stage_within_the_search_limits(tmp_path, monkeypatch):
    # 240 divisors: the placement loop over factors**4 took 22-24 s (31 s with cofactors)
    toml = tx8_bound_toml().replace("tile_count = 16", "tile_count = 720720").replace(
        'tile_grid = "4x4"', 'tile_grid = "720x1001"')
    chip = tmp_path / "big.toml"
    chip.write_text(toml)
    searches = GemmSearches(monkeypatch)
    report = map_in_process(TINY, chip)
    assert report.sections.mapping.totals.step_latency_s > 0
    searches.assert_within_the_limits()


def test_a_huge_batched_gemm_on_a_huge_chip_is_searched_within_the_limits(tmp_path, monkeypatch):
    # the limits scaled down (the real ones take seconds: benchmarks/mapper_speed.py times them):
    # the search must stop at them, so a GEMM of 2**20 instances on 720,720 tiles costs a bounded
    # number of evaluations and still gives a tiling within the tiles
    monkeypatch.setattr(gemm_mapper, "MAX_PLACEMENTS", 2_000)
    monkeypatch.setattr(gemm_mapper, "MAX_SEARCH_STEPS", 10_000)
    toml = tx8_bound_toml().replace("tile_count = 16", "tile_count = 720720").replace(
        'tile_grid = "4x4"', 'tile_grid = "720x1001"')
    (tmp_path / "big.toml").write_text(toml)
    chip = load_chip(tmp_path / "big.toml")
    batch, size = 2**20, 4096
    op = Op("g", OpType.GEMM, ((size, size),), (size, size), (size, size), 2 * batch * size**3,
            batch=batch)
    searches = GemmSearches(monkeypatch)
    mapping = gemm_auto_opt_mapper(op, chip)
    searches.assert_within_the_limits()
    [search] = searches.searches
    assert search["_placement_bound"] == 2_000  # the limit binds: there are more placements
    assert search["_costed"] == mapping.candidates_visited
    tiling = mapping.tiling
    assert tiling.pm * tiling.pn * tiling.pk * tiling.pb <= 720720
    assert mapping.latency_s > 0 and math.isfinite(mapping.latency_s)


# -- 2. sizes checked before allocation; strict ASCII shapes and meshes ---------------------------


def trace_stage(tmp_path, *args: str):
    from click.testing import CliRunner

    from tracing.cli import main as trace_main

    return CliRunner().invoke(trace_main, ["--config", "tiny", "-o", str(tmp_path / "out"), *args])


@pytest.mark.parametrize("args, fragments", [
    # 8-11 s and ~850 MB inside torch before an internal error
    (["--mesh", "2x2", "--shape", "1000000000_64_64"], ("--shape 1000000000_64_64", "temporal attention scores")),
    (["--mesh", "2x2", "--batch", "1000000000"], ("--batch 1000000000", "elements")),
    (["--mesh", "2x2", "--shape", "28_100000_100000"], ("--shape 28_100000_100000", "spatial attention scores")),
    # accepted before: int() reads Arabic-Indic digits, strip() removed the blanks, [xX]
    (["--shape", "\u0662\u0668_64_64"], ("bad video shape",)),
    (["--shape", " 28_64_64 "], ("bad video shape",)),
    (["--mesh", "2X2"], ("bad mesh '2X2'",)),
    (["--mesh", "\u0662x2"], ("bad mesh",)),
])
def test_trace_sizes_and_malformed_shapes_are_refused_at_once(tmp_path, monkeypatch, args, fragments):
    # refused from the options alone: the trace (torch, the model) is never started
    import tracing.cli

    def no_trace(*args, **kwargs):
        raise AssertionError("the trace started")

    monkeypatch.setattr(tracing.cli, "run_trace", no_trace)
    monkeypatch.setattr(tracing.cli, "require_trace_extra", no_trace)
    result = trace_stage(tmp_path, *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_trace_size_limits_are_derived_from_the_geometry():
    from plans.config import (
        MAX_TENSOR_ELEMENTS,
        build_config,
        check_trace_size,
        stage_tensor_elements,
    )

    # tiny (hidden 64, 4 heads, patch 1x2x2) at 28_64_64: latent 8x8x8, T = 8, S = 4*4 = 16, N = 128
    tensors = stage_tensor_elements(build_config(config="tiny").model, "28_64_64", 2)
    assert tensors["spatial attention scores (batch x T x heads x S x S)"] == 2 * 8 * 4 * 16 * 16
    assert tensors["temporal attention scores (batch x S x heads x T x T)"] == 2 * 16 * 4 * 8 * 8
    assert tensors["latent input z (batch x channels x latent frames x height x width)"] == 2 * 4 * 8 * 8 * 8
    # the reference full-size traces pass; a machine of 1 MB refuses even the tiny inputs
    for shape in ("204_640_360", "102_1280_720"):
        check_trace_size(build_config(config="full", shape=shape, mesh="2x2"))
    full = stage_tensor_elements(build_config(config="full").model, "102_1280_720", 2)
    # 2 x T 30 x 16 heads x (S = 45*80 = 3600)**2: the reference's largest tensor, ~90x below the limit
    assert max(full.values()) == 2 * 30 * 16 * 3600**2 < MAX_TENSOR_ELEMENTS / 80
    from plans.config import PipelineConfigError

    with pytest.raises(PipelineConfigError, match="--shape 28_64_64: the stage's inputs and weights need"):
        check_trace_size(build_config(config="tiny"), memory_bytes=10**6)
    with pytest.raises(PipelineConfigError, match="--batch 100000: .* host memory"):
        check_trace_size(build_config(config="tiny", batch=100_000), memory_bytes=2 * 10**8)


# -- 3. internal errors that were the input's fault -----------------------------------------------

EXAMPLE = REPO_ROOT / "hlo_trace" / "examples" / "example_mlp_megatron_2x2.stablehlo.mlir"
PIPELINE = REPO_ROOT / "dumps" / "pipeline"
PIPELINE_TOML = PIPELINE / "tiny_2x2_stages.toml"
STAGE_DUMPS = [PIPELINE / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
               PIPELINE / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"]


@pytest.mark.parametrize("entries", ["[1, \"x\", [2]]", "7", "[{\"key\": 1, \"stages\": 5}]"])
def test_shape_cache_entries_that_are_not_objects_are_recomputed(tmp_path, entries):
    pytest.importorskip("torch")
    from plans.config import build_config
    from tracing.stages import boundary_shapes

    cache = tmp_path / "stage_shapes.json"
    cache.write_text(f'{{"entries": {entries}}}')
    config = build_config(config="tiny", stage_ids="0-0,1-1")
    stages = boundary_shapes(config, cache)
    assert [s["blocks"] for s in stages] == [[0, 0], [1, 1]]
    # tiny at 28_64_64, batch 2: latent z (2, 4, 8, 8, 8); stage 0 hands x of (2, N = 128, 64) on
    assert stages[0]["inputs"]["z"]["shape"] == [2, 4, 8, 8, 8]
    assert stages[0]["outputs"]["x"]["shape"] == [2, 128, 64]
    assert boundary_shapes(config, cache) == stages  # the rewritten cache is read back


def test_the_shape_cache_tells_the_inference_paths_apart(tmp_path):
    """One cache for both paths (trace-stage's default OUT/stage_shapes.json): the clean path's
    stages take no t0 / x_mask, the official path's do; read from the other path's entry, a
    stage missed its inputs (an internal KeyError)."""
    pytest.importorskip("torch")
    from plans.config import build_config
    from tracing.stages import boundary_shapes

    cache = tmp_path / "stage_shapes.json"
    clean = boundary_shapes(build_config(config="tiny", stage_ids="0-0,1-1",
                                         inference_path="clean"), cache)
    official = boundary_shapes(build_config(config="tiny", stage_ids="0-0,1-1"), cache)
    assert "x_mask" not in clean[1]["inputs"]
    assert {"t0", "t0_mlp", "x_mask"} <= set(official[1]["inputs"])


def test_output_name_near_the_file_name_limit_is_written(tmp_path, capsys):
    # the temporary ".NAME.xxxxxxxx.tmp" of a 250-character name exceeded NAME_MAX (255)
    for name in ("a" * 246 + ".txt", "\u00e9" * 125 + ".txt"):  # 250 and 254 bytes
        output = tmp_path / name
        code, _, err = analyze_cli(capsys, EXAMPLE, "-o", output)
        assert code == 0, err
        assert "per category" in output.read_text().lower() or output.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a" * 246 + ".txt", "\u00e9" * 125 + ".txt"])


def test_closed_standard_output_is_one_line_and_o_still_works(tmp_path):
    import subprocess
    import sys

    for redirect, output in (("1>&-", None), ("1>&- 2>&-", None), ("1>&-", tmp_path / "r.txt")):
        extra = f" -o {output}" if output else ""
        completed = subprocess.run(f"{sys.executable} -m hlo_analyzer.cli {EXAMPLE}{extra} {redirect}",
                                   shell=True, cwd=REPO_ROOT, capture_output=False,
                                   stderr=None if "2>&-" in redirect else subprocess.PIPE, text=True)
        if output is not None:
            assert completed.returncode == 0 and output.stat().st_size > 0
        elif "2>&-" in redirect:
            assert completed.returncode == 2
        else:
            assert_one_line(completed.returncode, completed.stderr, "standard output is closed", "-o FILE")


def test_a_parser_value_error_is_the_inputs_fault(tmp_path, capsys, monkeypatch):
    # jaxlib raised ValueError("SmallVector unable to grow...") on a fuzzed bytecode file; the
    # file is not reproducible here, so the bindings' parse raises what it raised then.
    from hlo_analyzer import mlir

    dump = tmp_path / "module.mlirbc"
    dump.write_bytes(b"ML\xefR" + bytes(64))

    def parse(*args, **kwargs):
        raise ValueError("SmallVector unable to grow. Requested capacity (4294967296) is larger "
                         "than maximum value for size type (4294967295)")

    monkeypatch.setattr(mlir.ir.Module, "parse", parse)
    from hlo_trace.errors import InputFileError

    with pytest.raises(InputFileError, match="module.mlirbc: MLIR does not parse: SmallVector"):
        mlir.load_module(dump)


def test_analyze_pipeline_steps_are_bounded(capsys):
    from hlo_analyzer.pipeline_cli import pipeline_command

    code = run_click(pipeline_command, [str(PIPELINE_TOML), *map(str, STAGE_DUMPS), "--steps", "9" * 400])
    assert_one_line(code, capsys.readouterr().err, "--steps")


# -- 5. silently accepted input -------------------------------------------------------------------


def pipeline_cli(capsys, toml: Path, dumps: list[Path], *args: str) -> tuple[int, str, str]:
    from hlo_analyzer.pipeline_cli import pipeline_command

    code = run_click(pipeline_command, [str(toml), *map(str, dumps), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("old, new, fragments", [
    # stages swapped in the TOML: the dumps hold pairs 0 and 1, the TOML says 1 then 0
    ("stage_ids = [[0, 0], [1, 1]]", "stage_ids = [[1, 1], [0, 0]]", ("block pairs [0, 0]", "[1, 1]")),
    # overlapping submeshes: both stages on devices of columns 0-1
    ("submeshes = [[2, 2, 0, 0], [2, 2, 0, 2]]", "submeshes = [[2, 2, 0, 0], [2, 2, 0, 1]]", ("overlap",)),
    # disjoint, but not where the dumps were traced
    ("submeshes = [[2, 2, 0, 0], [2, 2, 0, 2]]", "submeshes = [[2, 2, 0, 2], [2, 2, 0, 0]]", ("traced on submeshes",)),
    ("stage_ids = [[0, 0], [1, 1]]", "stage_ids = [[0, 1], [1, 1]]", ("block pairs [0, 0]",)),
    ("stage_ids = [[0, 0], [1, 1]]", "stage_ids = [[0, 0], [1, -1]]", ("stage_ids",)),
])
def test_pipeline_toml_is_checked_against_the_sidecars(tmp_path, capsys, old, new, fragments):
    text = PIPELINE_TOML.read_text()
    assert old in text
    toml = tmp_path / "p.toml"
    toml.write_text(text.replace(old, new))
    code, out, err = pipeline_cli(capsys, toml, STAGE_DUMPS)
    assert_one_line(code, err, *fragments)
    assert out == ""


def test_the_right_pipeline_toml_still_passes(capsys):
    code, out, err = pipeline_cli(capsys, PIPELINE_TOML, STAGE_DUMPS, "--format", "json")
    assert code == 0, err
    assert '"stages"' in out


def test_dumps_given_in_the_wrong_order_are_refused(capsys):
    code, _, err = pipeline_cli(capsys, PIPELINE_TOML, STAGE_DUMPS[::-1])
    assert_one_line(code, err, "block pairs [1, 1]")


def test_output_and_timeline_on_one_file_are_refused(tmp_path, capsys):
    target = tmp_path / "x.json"
    code, _, err = analyze_cli(capsys, TINY, "--hw", "tx8", "-o", target, "--timeline", tmp_path / "." / "x.json")
    assert_one_line(code, err, "--timeline", "-o")
    assert not target.exists()


def test_output_on_a_dangling_symlink_needs_force(tmp_path, capsys):
    link = tmp_path / "report.txt"
    link.symlink_to(tmp_path / "missing" / "target.txt")
    code, _, err = analyze_cli(capsys, EXAMPLE, "-o", link)
    assert_one_line(code, err, "dangling symbolic link", "--force")
    assert link.is_symlink()
    code, _, err = analyze_cli(capsys, EXAMPLE, "-o", link, "--force")
    assert code == 0, err
    assert not link.is_symlink() and link.stat().st_size > 0  # the link replaced, not followed


def test_a_2_gb_non_dump_is_refused_from_its_first_bytes(tmp_path, capsys, monkeypatch):
    big = tmp_path / "big.bin"
    with open(big, "wb") as handle:  # sparse: 2 GB long, no disk used
        handle.truncate(2 * 2**30)
    # reading it whole took 12.9 s and 4.3 GB: only the first SNIFF_BYTES are read
    import hlo_analyzer.mlir as mlir

    read: list[int] = []

    class Counted:
        def __init__(self, handle):
            self.handle = handle

        def read(self, size=-1):
            data = self.handle.read(size)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(mlir, "open", lambda *a, **k: Counted(open(*a, **k)), raising=False)
    with pytest.raises(InputFileError, match="neither MLIR"):
        mlir.read_input_file(big)
    assert sum(read) <= mlir.SNIFF_BYTES, read
    monkeypatch.undo()
    code, _, err = analyze_cli(capsys, big)
    assert_one_line(code, err, str(big), "neither MLIR")


@pytest.mark.parametrize("head, refused", [
    (b"// comment\n" * 200 + b"module {}", False),  # comments past the sniffed KiB: undecided
    (b"HloModule m\n", False),
    (b"   \n\n  func.func @f() {\n", False),
    (b"ML\xefR", False),
    (b"\xff\xfe garbage", True),
    (b"PK\x03\x04 a zip file" + bytes(2000), True),
    (b"x" * 5000, True),
    (b"modul", True),  # a whole (short) file: decided at once
])
def test_sniffing_refuses_only_what_cannot_be_a_dump(head, refused):
    from hlo_analyzer.mlir import SNIFF_BYTES, sniff_kind
    from hlo_trace.errors import InputFileError

    if refused:
        with pytest.raises(InputFileError):
            sniff_kind(head[:SNIFF_BYTES], "f")
    else:
        sniff_kind(head[:SNIFF_BYTES], "f")


# -- 4. no orphans: the analysis children end with the command ------------------------------------


_group_members = group_members  # live processes of a process group, from /proc


@pytest.fixture(scope="module")
def big_dump(tmp_path_factory):
    """~150k ops (16 MB): analyze-hlo runs ~3 s, with its analysis child and memory grandchild."""
    from benchmarks.analyze_speed import synthetic_module

    path = tmp_path_factory.mktemp("big") / "big.mlir"
    path.write_text(synthetic_module(150_000))
    return path


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_killed_analyze_hlo_leaves_no_process_and_no_output(tmp_path, big_dump, signal_name):
    import os
    import signal
    import subprocess
    import sys

    output = tmp_path / "report.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "hlo_analyzer.cli", str(big_dump), "--format", "json", "-o", str(output)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own process group: every process of it is found by group
    try:
        wait_until(lambda: len(_group_members(process.pid)) >= 2, "analyze-hlo's analysis child",
                   still_running=lambda: process.poll() is None)
        time.sleep(0.3)
        assert process.poll() is None
        process.send_signal(getattr(signal, signal_name))
        process.wait(timeout=10)
        time.sleep(1.0)
        assert _group_members(process.pid) == []
        time.sleep(3.0)  # the analysis would have finished by now: nothing may write the report
        assert not output.exists()
        assert list(tmp_path.iterdir()) == []
    finally:
        for pid in _group_members(process.pid):
            os.kill(pid, signal.SIGKILL)


# -- 6. messages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--bogus"], "--bogus"),
    (["--devices", "x"], "--devices"),
    (["--jobs", "0"], "--jobs"),
])
def test_sweep_click_errors_are_one_line(args, fragment):
    from click.testing import CliRunner

    from scripts.sweep import main as sweep_main

    result = CliRunner().invoke(sweep_main, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], result.output


def test_a_missing_file_whose_name_holds_a_newline_keeps_the_reason(tmp_path, capsys):
    code, _, err = analyze_cli(capsys, tmp_path / "two\nlines.mlir")
    assert_one_line(code, err, "two\\nlines.mlir: no such file")
    code, _, err = analyze_cli(capsys, EXAMPLE, "--hw", "tab\there.toml")
    assert_one_line(code, err, "tab\\there.toml: no such hardware file")


@pytest.mark.parametrize("args", [
    ["--link-bandwidth", "1e300"],  # printed "inf GB/s" before
    ["--link-bandwidth", "100", "--hop-latency", "1e300"],
    ["--hw", "tx8", "--link-bandwidth", "1e300"],
])
def test_huge_physical_options_are_refused(capsys, args):
    code, _, err = analyze_cli(capsys, EXAMPLE, *args)
    assert_one_line(code, err, args[-2], "at most 1e+09")


def test_largest_link_bandwidth_prints_finitely(capsys):
    code, out, err = analyze_cli(capsys, EXAMPLE, "--link-bandwidth", "1e9", "--format", "json")
    assert code == 0, err
    assert "Infinity" not in out and "inf" not in out.lower().replace("info", "")


def test_sweep_on_four_devices_skips_the_patch_counts_the_shape_cannot_hold(caplog):
    from scripts.sweep import plan_pipelines

    # 28_64_64: latent 64/8 = 8 rows, patch 2 high -> 4 patch rows; M = 8 cannot be cut
    with caplog.at_level("WARNING"):
        cases = plan_pipelines("tiny", ["28_64_64"], 4, None, "2,4,8")
    assert sorted({case.patches for case in cases}) == [2, 4]
    assert cases and all(case.shape == "28_64_64" for case in cases)
    warnings = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1 and "M = 8 at 28_64_64" in warnings[0].getMessage()


# -- found by the property test (tests/test_properties.py) -------------------------------------------


def test_pipeline_recurrence_and_closed_form_agree():
    import random

    from hardware.pipeline import closed_form_steps_s, pipelined_steps_s

    rng = random.Random(24)
    for _ in range(3000):
        chain = [rng.choice([0.0, rng.random(), 10 * rng.random()]) for _ in range(rng.choice([1, 3, 5]))]
        back = rng.choice([0.0, rng.random(), 5 * rng.random()])
        patches, steps = rng.randint(1, 9), rng.randint(1, 9)
        schedule = rng.choice(["overlapped", "per-step"])
        walked = pipelined_steps_s(chain, back, patches=patches, steps=steps, schedule=schedule)
        closed = closed_form_steps_s(chain, back, patches=patches, steps=steps, schedule=schedule)
        assert closed == pytest.approx(walked, rel=1e-12, abs=1e-300)


def test_a_million_steps_of_34_patches_take_no_time():
    # analyze-pipeline --steps 960699 with patches = 34 walked 33 M patch jobs (40 s)
    from test_pipeline import closed_form_s

    from hardware.pipeline import pipelined_steps_s

    chain, back = [3.0, 1.0, 5.0], 2.0
    for schedule in ("overlapped", "per-step"):
        with LineBudget(10_000):  # not a walk over the 3.4 M patch jobs
            total = pipelined_steps_s(chain, back, patches=34, steps=100_000, schedule=schedule)
        assert total == pytest.approx(closed_form_s(chain, back, 34, 100_000, schedule), rel=1e-12)


def test_a_shape_beyond_int32_is_refused_before_any_arithmetic(tmp_path):
    # frames of 10**400: OverflowError (int too large for a float) in the strategy's layout
    result = trace_stage(tmp_path, "--mesh", "2x2", "--strategy", "usp", "--shape", "1" + "0" * 400 + "_39_64")
    assert result.exit_code == 2 and "at most 2147483647" in result.output, result.output
