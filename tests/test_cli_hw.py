"""analyze-hlo --hw: the errors a user meets before any mapping happens."""

from pathlib import Path

import pytest

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click

EXAMPLE = Path(__file__).resolve().parent.parent / "dumps" / "example_mlp_megatron_2x2.stablehlo.mlir"


def run(args, capsys):
    code = run_click(analyze_command, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args, message", [
    (["--hw", "tx8-16"], "does not look like an STDiT3 stage"),
    (["--hw", "no-such-chip"], "no such hardware file or bundled name"),
    (["--by", "block"], "--by block needs --hw"),
    (["--hw", "tx8-16", "--steps", "0"], "'--steps'"),
])
def test_hw_usage_errors_are_one_line(capsys, args, message):
    code, out, err = run([EXAMPLE, *args], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err
