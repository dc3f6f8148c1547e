"""The --hw sections' JSON fast path: the same text as json's own encoder, and the number check."""

import dataclasses
import json
import math

import pytest

from hlo_analyzer.cli import check_numbers
from hlo_analyzer.mapping.apply import add_hardware_sections
from hlo_analyzer.mapping.render import indented_records_json
from hlo_analyzer.mlir import load_module
from hlo_analyzer.report import analyze
from hlo_trace.errors import UsageError
from hlo_trace.examples import example_dump

EXAMPLE = example_dump()

# Values that are equal but print differently (0.0 / -0.0, 1 / 1.0 / True), repeated values (the
# writer keeps their texts), non-finite floats, escapes, keys that need sorting or hold "%".
RECORDS = [
    {"z": 1.5, "a": 0.0, "m": "dram", "p": [3, 4, 5], "n": None, "b": True},
    {"z": 1.5, "a": -0.0, "m": "dram", "p": [], "n": 2, "b": 1},
    {"z": 1, "a": 1.0, "m": "é \"q\" \\ ✓", "p": [7], "n": None, "b": False},
    {"z": math.nan, "a": math.inf, "m": "", "p": [1.5, True, None], "n": -math.inf, "b": 0},
    {"%s": {"nested": [1, {"x": 2.5}]}, "100%": "a%b", "k": -3},
    {},
    {"only": 0},
]


@pytest.mark.parametrize("level", [0, 2, 5])
def test_records_are_written_as_json_writes_them(level):
    # json writes a value `level` spaces deep as its standalone text with every line break
    # followed by `level` more spaces: compare with json's own pure-Python (indented) encoder.
    expected = json.dumps(RECORDS, indent=1, sort_keys=True).replace("\n", "\n" + " " * level)
    assert indented_records_json(RECORDS, level) == expected
    assert indented_records_json([], level) == "[]"


def test_report_json_is_the_encoder_output_and_checks_kernels():
    module = load_module(EXAMPLE)
    report = analyze(module, name=str(EXAMPLE))
    add_hardware_sections(report, module, "tx8")
    mapping = report.sections.mapping
    assert mapping is not None and len(mapping.program.ops) > 1
    # Everything before the op rows is json.dumps of the whole document, kernels included.
    head = json.dumps(report.to_dict(with_ops=False), indent=1, sort_keys=True)
    text = report.to_json()
    assert text.startswith(head[:-2] + ",\n \"ops\": [")
    assert json.loads(text)["mapping"]["kernels"] == json.loads(head)["mapping"]["kernels"]

    check_numbers(report)  # the real report passes
    ops = mapping.program.ops
    for field, bad in (("latency_s", math.nan), ("flops", -1), ("positions", (0, -2))):
        broken = dataclasses.replace(ops[1], **{field: bad})
        program = dataclasses.replace(mapping.program, ops=(ops[0], broken, *ops[2:]))
        report.sections = dataclasses.replace(
            report.sections, mapping=dataclasses.replace(mapping, program=program))
        name = "hlo_positions" if field == "positions" else field
        with pytest.raises(UsageError, match=rf"mapping\.kernels\.{name} = .*out of range"):
            check_numbers(report)
    bad_pair = dataclasses.replace(mapping, pair_of=(-1, *mapping.pair_of[1:]))
    report.sections = dataclasses.replace(report.sections, mapping=bad_pair)
    with pytest.raises(UsageError, match=r"mapping\.kernels\.pair = -1"):
        check_numbers(report)
