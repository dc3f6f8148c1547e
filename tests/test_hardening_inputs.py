"""Hardening (issue 34): sidecars, configurations and bytecode are input too. One regression test
per case found by trying the five commands as a user (and an attacker) would: every bad input
is one ``Error:`` line naming the file, option or field, exit code 2, never a traceback, a
hang or an internal error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from test_robustness import analyze_cli, assert_one_line

from hlo_trace.cli import run_click

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY = REPO_ROOT / "dumps" / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"
PIPELINE = REPO_ROOT / "dumps" / "pipeline"
PIPELINE_TOML = PIPELINE / "tiny_2x2_stages.toml"
STAGES = [PIPELINE / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
          PIPELINE / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"]
HW = REPO_ROOT / "hardware" / "data" / "tx8.toml"

DEEP = 2000


def deep_toml(path: Path, prefix: str = "") -> Path:
    path.write_text(f"{prefix}x = {'[' * DEEP}{']' * DEEP}\n")
    return path


def deep_json(path: Path) -> Path:
    path.write_text("[" * DEEP + "]" * DEEP)
    return path


def trace_stage(*args) -> tuple[int, str]:
    from tracing.cli import main

    result = CliRunner().invoke(main, [str(arg) for arg in args])
    return result.exit_code, result.output


def analyze_pipeline(capsys, *args) -> tuple[int, str]:
    from hlo_analyzer.pipeline_cli import pipeline_command

    code = run_click(pipeline_command, [str(arg) for arg in args])
    return code, capsys.readouterr().err


# -- 3. endless or huge sidecars are refused like the dump ----------------------------------------


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_sidecar_is_refused_at_once(capsys, path):
    if not Path(path).exists():
        pytest.skip(f"no {path}")
    code, _, err = analyze_cli(capsys, TINY, "--sidecar", path)
    assert_one_line(code, err, path, "not a regular file", "sidecar")


def test_a_sidecar_beyond_the_size_limit_is_refused_unread(tmp_path, capsys, monkeypatch):
    import hlo_trace.documents as documents

    monkeypatch.setattr(documents, "MAX_DOCUMENT_BYTES", 1000)
    sidecar = tmp_path / "big.json"
    sidecar.write_text(json.dumps({"pad": "x" * 2000}))
    code, _, err = analyze_cli(capsys, TINY, "--sidecar", sidecar)
    assert_one_line(code, err, "big.json", "more than")


def test_a_fifo_as_a_hardware_or_pipeline_file_does_not_block(tmp_path, capsys):
    import os

    fifo = tmp_path / "hw.toml"
    os.mkfifo(fifo)
    code, _, err = analyze_cli(capsys, TINY, "--hw", fifo)
    assert_one_line(code, err, "hw.toml", "not a regular file")
    code, err = analyze_pipeline(capsys, fifo, *STAGES)
    assert_one_line(code, err, "hw.toml", "not a regular file")


# -- 4. deeply nested TOML and JSON, in every command that reads them -----------------------------


def test_deep_hardware_toml_is_one_line(tmp_path, capsys):
    code, _, err = analyze_cli(capsys, TINY, "--hw", deep_toml(tmp_path / "hw.toml", 'kind = "chip"\n'))
    assert_one_line(code, err, "hw.toml", "nested more than")


def test_deep_sidecar_is_one_line(tmp_path, capsys):
    code, _, err = analyze_cli(capsys, TINY, "--sidecar", deep_json(tmp_path / "side.json"))
    assert_one_line(code, err, "side.json", "nested more than")


def test_deep_implicit_sidecar_is_one_line(tmp_path, capsys):
    dump = tmp_path / "stage.mlir"
    shutil.copy(TINY, dump)
    deep_json(tmp_path / "stage.json")
    code, _, err = analyze_cli(capsys, dump, "--hw", "tx8")
    assert_one_line(code, err, "stage.json", "nested more than")


@pytest.mark.parametrize("option", ["--config", "--pipeline"])
def test_deep_trace_stage_toml_is_one_line(tmp_path, option):
    code, output = trace_stage(option, deep_toml(tmp_path / "deep.toml"), "-o", tmp_path / "out")
    assert_one_line(code, output, "deep.toml", "nested more than")


def test_deep_shape_cache_is_recomputed_not_a_crash(tmp_path):
    from plans.config import build_config
    from tracing.stages import _cache_entries

    cache = deep_json(tmp_path / "cache.json")
    assert _cache_entries(cache) == []
    build_config(config="tiny")  # the cache is only read once a config is valid


def test_deep_pipeline_toml_and_stage_sidecars_are_one_line(tmp_path, capsys):
    code, err = analyze_pipeline(capsys, deep_toml(tmp_path / "p.toml"), *STAGES)
    assert_one_line(code, err, "p.toml", "nested more than")
    stages = copy_stages(tmp_path)
    deep_json(stages[1].with_suffix(".json"))
    code, err = analyze_pipeline(capsys, PIPELINE_TOML, *stages)
    assert_one_line(code, err, stages[1].with_suffix(".json").name, "nested more than")


@pytest.mark.parametrize("text, fragment", [
    ('{"inputs": NaN}', "NaN is not finite"),
    ('{"inputs": 1e400}', "beyond the range"),
    ('{"inputs": ' + "9" * 5000 + "}", "more than 4300 digits"),
    ("[1, 2", "not valid JSON"),
    ('"\udcff"', None),
])
def test_json_numbers_a_command_cannot_compute_with_are_refused(tmp_path, text, fragment):
    from hlo_trace.documents import load_json
    from hlo_trace.errors import InputFileError

    path = tmp_path / "doc.json"
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    with pytest.raises(InputFileError) as caught:
        load_json(path, "a test document")
    assert "doc.json" in str(caught.value) and "\n" not in str(caught.value)
    if fragment:
        assert fragment in str(caught.value)


def test_toml_integer_beyond_the_digit_limit_is_one_line(tmp_path, capsys):
    hw = tmp_path / "hw.toml"
    hw.write_text(HW.read_text() + f"\nextra = {'9' * 5000}\n")
    code, _, err = analyze_cli(capsys, TINY, "--hw", hw)
    assert_one_line(code, err, "hw.toml", "4300 digits")


# -- 5. sidecar contents are checked ----------------------------------------------------------------


def copy_stages(tmp_path: Path) -> list[Path]:
    copies = []
    for stage in STAGES:
        for suffix in (".mlir", ".json"):
            shutil.copy(stage.with_suffix(suffix), tmp_path / stage.with_suffix(suffix).name)
        copies.append(tmp_path / stage.name)
    return copies


def edit_sidecar(path: Path, edit) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.__setitem__("outputs", None), "outputs"),
    (lambda d: d.__setitem__("outputs", "x"), "outputs"),
    (lambda d: d.__setitem__("outputs", 5), "outputs"),
    (lambda d: d.__setitem__("outputs", {"out": None}), "outputs.out"),
    (lambda d: d["outputs"]["x"].__setitem__("shape", "x"), "outputs.x.shape"),
    (lambda d: d["outputs"]["x"].__setitem__("shape", [-1, 8]), "outputs.x.shape"),
    (lambda d: d["outputs"]["x"].__setitem__("shape", [2.5, 8]), "outputs.x.shape"),
    (lambda d: d["outputs"]["x"].__setitem__("dtype", "nope"), "outputs.x.dtype"),
    (lambda d: d.__setitem__("inputs", None), "inputs"),
    (lambda d: d.__setitem__("inputs", 5), "inputs"),
    (lambda d: d["mesh"].__setitem__("global_device_ids", "x"), "mesh.global_device_ids"),
    (lambda d: d["mesh"].__setitem__("global_device_ids", [[-1]]), "mesh.global_device_ids"),
    (lambda d: d.__delitem__("mesh"), "mesh.global_device_ids"),
    (lambda d: d.__setitem__("blocks", None), "blocks"),
    (lambda d: d.__setitem__("blocks", [1, 0]), "blocks"),
    (lambda d: d.__setitem__("pipefusion", {"patches": 0}), "pipefusion.patches"),
    (lambda d: d.__setitem__("strategy", "megatron"), "strategy"),
])
def test_malformed_stage_sidecar_fields_are_named(tmp_path, capsys, edit, field):
    stages = copy_stages(tmp_path)
    edit_sidecar(stages[0].with_suffix(".json"), edit)
    code, err = analyze_pipeline(capsys, PIPELINE_TOML, *stages, "--format", "json")
    assert_one_line(code, err, stages[0].with_suffix(".json").name, field)


def test_a_shape_of_1e400_is_refused(tmp_path, capsys):
    sidecar = tmp_path / "side.json"
    sidecar.write_text('{"inputs": {"x": {"shape": [1e400], "dtype": "bfloat16"}}}')
    code, _, err = analyze_cli(capsys, TINY, "--sidecar", sidecar)
    assert_one_line(code, err, "side.json", "beyond the range")


def test_a_sidecar_that_is_not_an_object_is_refused(tmp_path, capsys):
    sidecar = tmp_path / "side.json"
    sidecar.write_text("[1, 2]")
    code, _, err = analyze_cli(capsys, TINY, "--sidecar", sidecar)
    assert_one_line(code, err, "side.json", "expected a tracer sidecar")


def test_the_bundled_sidecars_pass_the_checks():
    from hlo_analyzer.sidecar import read_sidecar

    for sidecar in sorted((REPO_ROOT / "dumps").glob("*/*.json")):
        if sidecar.name != "stage_shapes.json":
            assert read_sidecar(sidecar) is not None


def test_an_int64_output_is_counted_not_a_key_error(tmp_path, capsys):
    stages = copy_stages(tmp_path)
    edit_sidecar(stages[0].with_suffix(".json"),
                 lambda d: d["outputs"]["x"].__setitem__("dtype", "int64"))
    code, err = analyze_pipeline(capsys, PIPELINE_TOML, *stages, "--format", "json")
    assert code == 0, err


# -- 1. non-UTF-8 strings in MLIR bytecode ----------------------------------------------------------

SMALL_MODULE = """module @"mod.name" attributes {mhlo.num_partitions = 2 : i32} {
  func.func @main(%arg0: tensor<4x8xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}) -> tensor<4x8xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<4x8xf32> loc("aten__add"("model.py":7:1))
    return %0 : tensor<4x8xf32>
  }
}
"""


def bytecode(text: str) -> bytes:
    """``text`` written as MLIR bytecode by jaxlib's bindings."""
    import io

    from hlo_analyzer import load_module_text

    buffer = io.BytesIO()
    load_module_text(text).operation.write_bytecode(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("string, patched", [
    (b"main", b"ma\xffn"),  # a function name (visitor.symbol_name)
    (b"{devices=[2,1]0,1}", b"{devices=[2,1]0,\xff}"),  # mhlo.sharding (memory.py)
    (b"aten__add", b"aten__a\xffd"),  # a location's name
    (b"model.py", b"model.p\xff"),  # a location's file
    (b"mod.name", b"mod.nam\xc3"),  # the module's name
])
@pytest.mark.parametrize("options", [(), ("--hw", "tx8")])
def test_non_utf8_strings_in_bytecode_are_one_line(tmp_path, capsys, string, patched, options):
    raw = bytecode(SMALL_MODULE)
    assert raw.count(b"\0" + string + b"\0") == 1  # one entry of the string section
    dump = tmp_path / "bad.mlirbc"
    dump.write_bytes(raw.replace(b"\0" + string + b"\0", b"\0" + patched + b"\0"))
    code, _, err = analyze_cli(capsys, dump, *options)
    assert_one_line(code, err, "bad.mlirbc", "not UTF-8")


def test_the_unpatched_bytecode_still_parses(tmp_path, capsys):
    dump = tmp_path / "good.mlirbc"
    dump.write_bytes(bytecode(SMALL_MODULE))
    code, out, err = analyze_cli(capsys, dump, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["totals"]


@pytest.mark.parametrize("lines", ["\n", "\r\n", "\r"])
def test_ascii_text_is_read_as_its_bytes_and_utf8_text_decoded_alike(tmp_path, capsys, lines):
    """An ASCII dump is parsed from its bytes (no decoded copy), any other from its decoded text:
    the same module either way, whatever ends its lines, and a byte that is not UTF-8 is one line."""
    from hlo_analyzer.mlir import load_module, load_module_text

    ascii_text = ("// a comment first\n" + SMALL_MODULE).replace("\n", lines)
    utf8_text = ascii_text.replace("model.py", "mod\u00e8le.py")
    for name, text in (("ascii.mlir", ascii_text), ("utf8.mlir", utf8_text)):
        dump = tmp_path / name
        dump.write_bytes(text.encode("utf-8"))
        assert str(load_module(dump)) == str(load_module_text(text))
    asm = load_module(tmp_path / "utf8.mlir").operation.get_asm(enable_debug_info=True)
    assert '"mod\\C3\\A8le.py":7:1' in asm  # the location's two UTF-8 bytes, as MLIR prints them
    (tmp_path / "latin1.mlir").write_bytes(utf8_text.encode("latin-1"))
    code, _, err = analyze_cli(capsys, tmp_path / "latin1.mlir")
    assert_one_line(code, err, "latin1.mlir", "not UTF-8")


# -- 2. malformed bytecode whose parse does not end is bounded -------------------------------------


def dense_string_bytecode(elements: int, old: bytes, new: bytes) -> bytes:
    """The bytecode of a module whose attribute is a splat dense string of ``elements``
    elements, patched: ``old`` (which must occur once) becomes ``new``."""
    raw = bytecode('module attributes {mhlo.x = dense<"a"> : '
                   f'tensor<{elements}x!stablehlo.token>}} {{}}')
    assert raw.count(old) == 1, raw
    return raw.replace(old, new)


def looping_bytecode() -> bytes:
    """The tensor type's element type (type 1, the token) made type 0, the tensor type
    itself: jaxlib's bytecode reader loops without end on the cycle (found by fuzzing)."""
    value = 2 * 10**5  # the dimension as a signed (zig-zag) prefix varint: 3 bytes
    dimension = ((value << 3) | 0b100).to_bytes(3, "little")
    return dense_string_bytecode(10**5, dimension + b"\x03", dimension + b"\x01")


def huge_bytecode() -> bytes:
    """The dense string attribute's splat flag cleared (its entry: kind 19, type 0, splat 1,
    string 4): the reader makes room for its 10**9 strings (16 GB) before reading any."""
    return dense_string_bytecode(10**9, b"'\x01\x03\t", b"'\x01\x01\t")


def analyze_bytecode(capsys, dump: Path, content: bytes) -> tuple[int, str]:
    """analyze-hlo on ``dump`` written with ``content`` (its parse is bounded by the child's
    limits, which the error line names)."""
    dump.write_bytes(content)
    code, _, err = analyze_cli(capsys, dump)
    return code, err


def test_bytecode_whose_parse_loops_is_one_line_within_the_time_limit(tmp_path, capsys,
                                                                       monkeypatch):
    import hlo_analyzer.mlir as mlir

    monkeypatch.setattr(mlir, "BYTECODE_PARSE_S", 2.0)
    code, err = analyze_bytecode(capsys, tmp_path / "loop.mlirbc", looping_bytecode())
    assert_one_line(code, err, "loop.mlirbc", "does not parse", "after 2 s")


def test_bytecode_past_the_memory_limit_is_one_line(tmp_path, capsys):
    code, err = analyze_bytecode(capsys, tmp_path / "huge.mlirbc", huge_bytecode())
    assert_one_line(code, err, "huge.mlirbc", "does not parse", "needs more than 2 GiB of memory")


def test_a_child_past_its_memory_limit_says_so():
    from hlo_trace.isolate import ChildLimitExceeded, call_in_child

    with pytest.raises(ChildLimitExceeded, match="x.bin: needed more than 64 MiB of memory while"):
        call_in_child(bytearray, 512 << 20, origin="x.bin", memory_bytes=64 << 20)
    assert len(call_in_child(bytearray, 1 << 20, origin="x.bin", memory_bytes=64 << 20)) == 1 << 20


# -- 6. numbers: one option type for counts and one for finite quantities --------------------------

DIGITS_5000 = "9" * 5000


@pytest.mark.parametrize("args, fragments", [
    (("--hw", "tx8", "--dram-efficiency", "nan"), ("--dram-efficiency", "not a finite number")),
    (("--hw", "tx8", "--dram-efficiency", "1.5"), ("--dram-efficiency", "at most 1")),
    (("--branch", DIGITS_5000), ("--branch", "(5002 chars)", "from 0 to")),
    (("--branch", "\u0663"), ("--branch", "ASCII digits")),
    (("--hw", "tx8", "--steps", "\u0663"), ("--steps", "ASCII digits")),
    (("--hw", "tx8", "--steps", DIGITS_5000), ("--steps", "must be at most 1000000")),
    (("--link-bandwidth", "\u0661\u0660\u0660"), ("--link-bandwidth", "not a number")),
    (("--link-bandwidth", "1_000"), ("--link-bandwidth", "not a number")),
])
def test_analyze_hlo_numbers_are_one_line(capsys, args, fragments):
    code, _, err = analyze_cli(capsys, TINY, *args)
    assert_one_line(code, err, *fragments)
    assert len(err) < 300, err  # a 5,000-digit value is cut in the message


@pytest.mark.parametrize("args, fragments", [
    (("--shape", f"28_64_{DIGITS_5000}"), ("bad video shape", "at most 2147483647")),
    (("--mesh", f"2x{DIGITS_5000}"), ("bad mesh", "from 1 to 1024")),
    (("--mesh", "\u0662x2"), ("bad mesh", "ASCII digits")),
    (("--stage-ids", f"0-{DIGITS_5000}"), ("bad stage ids",)),
    (("--stage", "\u0663"), ("--stage", "ASCII digits")),
    (("--batch", DIGITS_5000), ("--batch", "at most")),
    (("--ring-degree", "99999999999999999999"), ("--ring-degree", "at most 1024")),
    (("--ring-degree", "2"), ("ring_degree=2", "usp", "megatron has none")),
    (("--strategy", "dp", "--ulysses-degree", "2"), ("ulysses_degree=2", "dp has none")),
])
def test_trace_stage_numbers_are_one_line(tmp_path, args, fragments):
    code, output = trace_stage("--config", "tiny", "--mesh", "2x2", *args, "-o", tmp_path / "out")
    assert_one_line(code, output, *fragments)
    assert len(output) < 300, output
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("args, fragments", [
    (("--memory-limit", "nan"), ("--memory-limit", "not a finite number")),
    (("--memory-limit", "inf"), ("--memory-limit", "not a finite number")),
    (("--stages", "\u0662"), ("--stages", "ASCII digits")),
    (("--patches", DIGITS_5000), ("--patches", "from 1 to")),
    (("--budget", "\u0663"), ("--budget", "ASCII digits")),
])
def test_plan_search_numbers_are_one_line(tmp_path, capsys, args, fragments):
    from planning.plan_search_cli import plan_search_command

    code = run_click(plan_search_command, ["--config", "tiny", *args, "-o", str(tmp_path / "p.toml"),
                                           "--work-dir", str(tmp_path / "work")])
    assert_one_line(code, capsys.readouterr().err, *fragments)
    assert not (tmp_path / "p.toml").exists()


def test_an_hlo_header_with_a_5000_digit_partition_count_is_one_line(tmp_path, capsys):
    from hlo_trace.examples import example_dump

    text = example_dump("example_mlp_megatron_2x2.hlo.txt").read_text()
    dump = tmp_path / "module_0001.after_spmd-partitioning.txt"
    dump.write_text(text.replace("num_partitions=4", f"num_partitions={DIGITS_5000}", 1))
    code, _, err = analyze_cli(capsys, dump)
    assert_one_line(code, err, "num_partitions", "at most")


def test_count_and_quantity_types_take_what_a_user_types():
    from hlo_trace.cli import Count, PositiveFinite

    count, quantity = Count(0, 10), PositiveFinite()
    assert [count.convert(v, None, None) for v in ("0", "+7", "010", " 3 ", 5)] == [0, 7, 10, 3, 5]
    assert [quantity.convert(v, None, None) for v in ("1", "2.5", ".5", "1e-3", "3E2", 4)] == \
        [1.0, 2.5, 0.5, 1e-3, 300.0, 4.0]
    for bad in ("-1", "11", "1.5", "\u0663", "x", "", DIGITS_5000):
        with pytest.raises(click.BadParameter):
            count.convert(bad, None, None)
    for bad in ("0", "-1", "nan", "NaN", "inf", "-inf", "1e400", "\u0663", "1_0", "0x10"):
        with pytest.raises(click.BadParameter):
            quantity.convert(bad, None, None)


# -- 7. trace-vae-decode checks the shape before tracing ------------------------------------------


@pytest.mark.parametrize("shape, fragments", [
    ("17_7_7", ("--shape 17_7_7", "at least 8 pixels per side")),
    ("17_100000_100000", ("--shape 17_100000_100000", "GroupNorm", "2**31-1")),
])
@pytest.mark.parametrize("part", ["spatial", "temporal"])
def test_vae_shapes_that_cannot_trace_are_refused_before_tracing(tmp_path, monkeypatch, shape, fragments, part):
    import tracing.cli
    from tracing.vae_decode import main

    def no_trace(*_args, **_kwargs):
        raise AssertionError("the trace started")

    monkeypatch.setattr(tracing.cli, "require_trace_extra", no_trace)  # the first step of a trace after its checks
    result = CliRunner().invoke(main, ["--part", part, "--shape", shape, "--config", "tiny",
                                       "-o", str(tmp_path / "vae")])
    if part == "temporal" and shape == "17_100000_100000":  # 4 x 20 x 12500**2: also too big
        fragments = ("--shape 17_100000_100000", "temporal decoder's GroupNorm")
    assert_one_line(result.exit_code, result.output, *fragments)
    assert not (tmp_path / "vae").exists()


def test_the_largest_vae_dimension_is_the_one_xla_refused():
    from models.opensora.vae_config import decode_plan, get_vae_config, largest_dimension

    config = get_vae_config("tiny")
    # XLA's verifier, after a 5 s trace: "f32[1,16,2500000000], the 2th dimension exceeds the
    # INT_MAX limit" (a GroupNorm of 16 channels in 4 groups at 25000x25000)
    plan = decode_plan("17_100000_100000", config)
    assert largest_dimension(config, plan, "spatial")[1] == 2_500_000_000
    full = get_vae_config("full")
    for shape in ("204_640_360", "204_1280_720", "102_1280_720"):  # the traced reference shapes
        for part in ("spatial", "temporal"):
            assert largest_dimension(full, decode_plan(shape, full), part)[1] < 2**31 - 1


# -- 8. writing into /proc or /sys ------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("-o", "/proc/version", "--force"),
    ("-o", "/proc/hlo-trace-report.json"),
    ("--hw", "tx8", "--timeline", "/sys/kernel/hlo-trace-timeline.json"),
])
def test_outputs_in_proc_or_sys_are_one_line_before_the_work(capsys, args):
    if not Path(args[-2] if args[-1] == "--force" else args[-1]).parent.is_dir():
        pytest.skip("no /proc or /sys")
    code, _, err = analyze_cli(capsys, TINY, *args)
    assert_one_line(code, err, "cannot write there")


def test_a_child_that_fails_to_write_says_so_in_one_line(tmp_path):
    from hlo_trace.isolate import call_in_child

    def write_into_a_missing_directory() -> None:
        (tmp_path / "missing" / "x").write_text("x")

    with pytest.raises(FileNotFoundError):  # run_click says it in one line, exit code 2
        call_in_child(write_into_a_missing_directory, origin="x")
