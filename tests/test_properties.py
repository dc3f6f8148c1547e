"""The error promise as a property (issue 24): whatever shapes, meshes, batch sizes, steps and
hardware TOML values a user gives, across their full numeric range, every command (trace-stage,
analyze-hlo, analyze-pipeline) exits 0 or 2 with at most one line on stderr (exactly one
``Error: ...`` line for 2), within 1 GiB, and never hangs.

Hypothesis draws ``QUICK_EXAMPLES`` examples per command in the default run and
``PROPERTY_EXAMPLES`` in CI's slow leg (``-m slow``; 500, or the environment variable
``HLO_TRACE_PROPERTY_EXAMPLES``). Each example runs in this process, through the
commands' own ``run_click`` path (analyze-hlo still forks its analysis child, as it always does):

* hangs: an alarm ends a call still running after ``ALARM_S`` (no test asserts a speed: how
  long the commands take is the benchmarks', and a loaded machine would fail such a bound);
* memory: the peak resident size of this process (``ru_maxrss``, in-process commands) and of
  its children (analyze-hlo's analysis children), which must stay within ``MEMORY_BYTES`` of
  what this process held before the first example (a forked child starts with the parent's
  pages resident, so the parent's size is its baseline too).

trace-stage examples never trace: the command is given an output path that is a regular file,
which it refuses after every check of the configuration (mesh, shape, sizes, stages,
strategy), so a configuration that would trace ends in that one line instead (real traces are
tests/test_tracing_strategies.py's). The seeded mutations of whole files are benchmarks/fuzz.py's
(tests/test_fuzz.py); the regression tests of single cases tests/test_robustness.py's and
tests/test_hardening.py's.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from hlo_trace.cli import run_click

REPO_ROOT = Path(__file__).resolve().parent.parent
PROPERTY_EXAMPLES = int(os.environ.get("HLO_TRACE_PROPERTY_EXAMPLES", "500"))
#: Examples per command in the default run (the thorough PROPERTY_EXAMPLES run under -m slow).
QUICK_EXAMPLES = 25
MEMORY_BYTES = 1 << 30
#: A call still running after this long is ended (a hang fails the test, it does not stall it).
ALARM_S = 30

EXAMPLE = REPO_ROOT / "hlo_trace" / "examples" / "example_mlp_megatron_2x2.stablehlo.mlir"
DUMPS = [EXAMPLE,
         REPO_ROOT / "hlo_trace" / "examples" / "example_mlp_megatron_2x2.hlo.txt",
         REPO_ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir",
         REPO_ROOT / "dumps" / "mhlo" / "tiny_28_64_64_ds_ulysses_2x2_stage1_pairs1-1.mlir"]
PIPELINE = REPO_ROOT / "dumps" / "pipeline"
STAGE_DUMPS = [PIPELINE / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
               PIPELINE / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"]
TX8 = (REPO_ROOT / "hardware" / "data" / "tx8.toml").read_text()
TX8_16 = (REPO_ROOT / "hardware" / "data" / "tx8-16.toml").read_text()

SETTINGS = settings(max_examples=PROPERTY_EXAMPLES, deadline=None, database=None,
                    derandomize=True, print_blob=True,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])

# -- values across their full range -----------------------------------------------------------------

#: Integers of every magnitude: the small ones a user means, the edges of int32/int64, and far
#: beyond; negative and zero too.
integers = st.one_of(st.integers(-3, 70), st.integers(-2**70, 2**70),
                     st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, 10**400]))
#: Numbers as a user types them: integers, floats of any exponent, NaN and infinities.
numbers = st.one_of(integers.map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["1e300", "1e-320", "5e-324", "nan", "-inf", "0", "0.0"]))
#: Text that is not a number (unicode digits, blanks, empty).
junk = st.one_of(st.text(max_size=12), st.sampled_from(["", " ", "\u0662\u0668", "1_000", "0x10"]))


def count_text() -> st.SearchStrategy[str]:
    return st.one_of(integers.map(str), junk)


def mostly(valid: st.SearchStrategy, anything: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` three times in four: an example with several values still often gets through
    to the end (a report), the rest of the time any value of the whole range."""
    return st.integers(0, 3).flatmap(lambda pick: valid if pick else anything)


def shapes() -> st.SearchStrategy[str]:
    triple = st.tuples(integers, integers, integers).map(lambda t: "_".join(map(str, t)))
    small = st.tuples(st.integers(1, 120), st.integers(1, 700), st.integers(1, 700)).map(
        lambda t: "_".join(map(str, t)))
    good = st.sampled_from(["28_64_64", "28_128_128", "51_64_64", "204_640_360", "102_1280_720"])
    return mostly(good, st.one_of(small, triple, junk,
                                  st.sampled_from([" 28_64_64 ", "1000000000_64_64"])))


def meshes() -> st.SearchStrategy[str]:
    pair = st.tuples(integers, integers).map(lambda t: f"{t[0]}x{t[1]}")
    small = st.tuples(st.integers(1, 8), st.integers(1, 8)).map(lambda t: f"{t[0]}x{t[1]}")
    good = st.sampled_from(["2x2", "1x4", "2x4", "1x1", "4x1", "1x2"])
    return mostly(good, st.one_of(small, pair, junk, st.sampled_from(["2X2", "2x2 ", "1000x1000"])))


#: Chip fields and the kind of value each holds (quantities are strings with a unit).
CHIP_FIELDS = {
    "tile_count": "int", "sram_buffering_stages": "int", "gemm_granule": "int",
    "sram_per_tile": "MiB", "noc_link_bandwidth": "GB/s", "hop_latency": "us",
    "dram_bandwidth": "GB/s", "dram_latency": "us", "dram_capacity": "GiB",
    "gemm_throughput_per_tile": "TFLOPS", "vector_throughput_per_tile": "TOPS",
}


@st.composite
def chip_toml(draw) -> str:
    """tx8.toml with one to three fields replaced by values across their range (a tile count
    comes with a grid that holds it, most of the time)."""
    text = TX8
    for field in draw(st.lists(st.sampled_from(sorted(CHIP_FIELDS)), min_size=1, max_size=3,
                               unique=True)):
        unit = CHIP_FIELDS[field]
        if unit == "int":
            value = draw(st.one_of(integers, st.integers(1, 2**20), st.integers(1, 4096)))
            literal = str(value)
        else:
            literal = draw(st.one_of(
                numbers.map(lambda n, u=unit: f'"{n} {u}"'),
                st.floats(1e-3, 1e6).map(lambda f, u=unit: f'"{f:g} {u}"'),
                numbers, junk.map(repr)))
        text = "\n".join(f"{field} = {literal}" if line.startswith(f"{field} =") else line
                         for line in text.splitlines()) + "\n"
        if field == "tile_count" and isinstance(value, int) and 0 < value < 2**40 and draw(st.booleans()):
            text = text.replace('tile_grid = "4x4"', f'tile_grid = "1x{value}"')
    return text


def hardware(tmp_path: Path, draw_toml: str | None, system: bool) -> str:
    """A bundled name, or the drawn chip TOML as a file (alone, or as the chip of tx8-16)."""
    if draw_toml is None:
        return "tx8-16" if system else "tx8"
    chip = tmp_path / "chip.toml"
    chip.write_text(draw_toml)
    if not system:
        return str(chip)
    path = tmp_path / "system.toml"
    path.write_text(TX8_16.replace('chip = "tx8"', f'chip = "{chip}"'))
    return str(path)


# -- running one example --------------------------------------------------------------------------


def _peak_bytes(who: int) -> int:
    return resource.getrusage(who).ru_maxrss * 1024  # KiB on Linux


@pytest.fixture(scope="module")
def baseline() -> int:
    return _peak_bytes(resource.RUSAGE_SELF)


def _alarm(signum, frame):
    raise TimeoutError(f"still running after {ALARM_S} s")


def check_call(baseline: int, call) -> tuple[int, str]:
    """Run ``call()`` (returns an exit code) and check the promise; its code and stderr."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    elapsed = time.perf_counter() - start
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code in (0, 2), err.getvalue()[-2000:]
    assert len(lines) <= 1, err.getvalue()[-2000:]
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("Error: "), err.getvalue()
    assert "Traceback" not in err.getvalue()
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        assert _peak_bytes(who) <= baseline + MEMORY_BYTES, (who, _peak_bytes(who), baseline)
    # --hypothesis-show-statistics shows how the examples ended (both ends must be exercised)
    event(f"took {'<0.1' if elapsed < 0.1 else '<0.3' if elapsed < 0.3 else '<1' if elapsed < 1 else '>=1'} s")
    if code == 0:
        event("exit 0")
    elif "output path exists and is not a directory" in lines[0]:
        event("exit 2 at the output check (every other check passed)")
    else:
        event(f"exit 2: {lines[0].removeprefix('Error: ')[:40]}")
    return code, err.getvalue()


# -- trace-stage --------------------------------------------------------------------------------

STRATEGIES = ["megatron", "two_dimension", "ds_ulysses", "ring_attention", "usp", "megatron_sp",
              "dp", "none", "zigzag"]


@st.composite
def trace_arguments(draw) -> list[str]:
    args = ["--config", draw(st.sampled_from(["tiny", "full"])),
            "--strategy", draw(st.sampled_from(STRATEGIES)),
            "--shape", draw(shapes()), "--mesh", draw(meshes())]
    optional = {
        "--batch": mostly(st.integers(1, 8).map(str), count_text()),
        "--stage": mostly(st.integers(0, 1).map(str), count_text()),
        "--patches": mostly(st.integers(1, 4).map(str), count_text()),
        "--devices": mostly(st.sampled_from(["1", "2", "4", "8"]), count_text()),
        "--ring-degree": mostly(st.sampled_from(["1", "2"]), count_text()),
        "--ulysses-degree": mostly(st.sampled_from(["1", "2"]), count_text()),
        "--stage-ids": st.one_of(junk, st.tuples(integers, integers).map(lambda t: f"{t[0]}-{t[1]}"),
                                 st.sampled_from(["0-0,1-1", "0-13,14-27", "0-1"])),
        "--dtype": st.sampled_from(["bfloat16", "float32", "fp8", ""]),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        args += [name, draw(optional[name])]
    return args


def _trace_stage_property(baseline, tmp_path_factory, args):
    from click.testing import CliRunner

    from tracing.cli import main

    blocker = tmp_path_factory.mktemp("trace") / "not_a_directory"
    blocker.write_text("")

    def call() -> int:
        result = CliRunner().invoke(main, [*args, "-o", str(blocker)])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        print(result.output, end="", file=__import__("sys").stderr)
        return result.exit_code

    code, err = check_call(baseline, call)
    # a configuration that passes every check reaches the output check, and stops there
    assert code == 2
    assert blocker.read_text() == ""


# -- analyze-hlo --------------------------------------------------------------------------------


@st.composite
def analyze_arguments(draw, tmp_path: Path) -> list[str]:
    dump = draw(st.sampled_from(DUMPS))
    args = [str(dump), "--format", draw(st.sampled_from(["json", "table", "csv"]))]
    toml = draw(st.one_of(st.none(), chip_toml()))
    with_hw = draw(st.booleans())
    if with_hw:
        args += ["--hw", hardware(tmp_path, toml, system=draw(st.booleans()))]
    optional = {
        "--steps": count_text(), "--pairs": count_text(), "--exp-ops": count_text(),
        "--caption-tokens": count_text(), "--link-bandwidth": numbers, "--hop-latency": numbers,
        "--dram-efficiency": numbers, "--branch": st.one_of(count_text(), st.sampled_from(["max", "first"])),
        "--exec": st.sampled_from(["fused", "eager"]),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=3, unique=True)):
        args += [name, draw(optional[name])]
    return args


def _analyze_hlo_property(baseline, tmp_path_factory, data):
    from hlo_analyzer.cli import analyze_command

    args = data.draw(analyze_arguments(tmp_path_factory.mktemp("hlo")))
    check_call(baseline, lambda: run_click(analyze_command, args))


# -- analyze-pipeline ---------------------------------------------------------------------------


@st.composite
def pipeline_toml(draw) -> str:
    """The tiny two-stage pipeline's TOML, its counts drawn across their range."""
    patches = draw(mostly(st.integers(1, 4), integers))
    warmup = draw(mostly(st.integers(0, 3), integers))
    stage_ids = draw(mostly(st.just("[[0, 0], [1, 1]]"),
                            st.tuples(integers, integers).map(lambda t: f"[[0, {t[0]}], [{t[1]}, 1]]")))
    submeshes = draw(mostly(st.sampled_from(["[[2, 2, 0, 0], [2, 2, 0, 2]]", None]),
                            st.tuples(integers, integers).map(
                                lambda t: f"[[2, 2, 0, 0], [{t[0]}, 2, 0, {t[1]}]]")))
    schedule = draw(mostly(st.sampled_from(["overlapped", "per-step"]), st.text(max_size=8)))
    lines = ['config = "tiny"', 'shape = "28_64_64"', 'strategy = "megatron"', "mesh_shape = [2, 4]",
             f"stage_ids = {stage_ids}", f"patches = {patches}", f"warmup_steps = {warmup}",
             f'schedule = "{schedule}"']
    if submeshes is not None:
        lines.append(f"submeshes = {submeshes}")
    return "\n".join(lines) + "\n"


def _analyze_pipeline_property(baseline, tmp_path_factory, data):
    from hlo_analyzer.pipeline_cli import pipeline_command

    tmp_path = tmp_path_factory.mktemp("pipeline")
    toml = tmp_path / "pipeline.toml"
    toml.write_text(data.draw(pipeline_toml()))
    args = [str(toml), *map(str, STAGE_DUMPS),
            "--steps", data.draw(mostly(st.integers(1, 10**6).map(str), count_text())),
            "--format", data.draw(st.sampled_from(["json", "table"]))]
    if data.draw(st.booleans()):
        args += ["--hw", hardware(tmp_path, data.draw(st.one_of(st.none(), chip_toml())), system=True)]
    if data.draw(st.booleans()):
        args += ["--schedule", data.draw(st.sampled_from(["overlapped", "per-step", "x"]))]
    check_call(baseline, lambda: run_click(pipeline_command, args))


# -- the tests: each property quickly in the default run, thoroughly in CI's slow leg ---------------


def _quick(test):
    return settings(SETTINGS, max_examples=QUICK_EXAMPLES)(test)


def _thorough(test):
    return pytest.mark.slow(SETTINGS(test))


test_trace_stage_exits_0_or_2_with_one_line = _quick(given(args=trace_arguments())(_trace_stage_property))
test_trace_stage_exits_0_or_2_with_one_line_thoroughly = _thorough(
    given(args=trace_arguments())(_trace_stage_property))
test_analyze_hlo_exits_0_or_2_with_one_line = _quick(given(data=st.data())(_analyze_hlo_property))
test_analyze_hlo_exits_0_or_2_with_one_line_thoroughly = _thorough(
    given(data=st.data())(_analyze_hlo_property))
test_analyze_pipeline_exits_0_or_2_with_one_line = _quick(given(data=st.data())(_analyze_pipeline_property))
test_analyze_pipeline_exits_0_or_2_with_one_line_thoroughly = _thorough(
    given(data=st.data())(_analyze_pipeline_property))
