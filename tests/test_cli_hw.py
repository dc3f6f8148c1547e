"""analyze-hlo --hw: the errors a user meets before any mapping happens."""

import pytest

from hlo_analyzer.cli import analyze_command
from hlo_trace.cli import run_click
from hlo_trace.examples import example_dump

EXAMPLE = example_dump()


def run(args, capsys):
    code = run_click(analyze_command, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args, message", [
    (["--hw", "tx8-16", "--pairs", "28"], "--pairs needs an STDiT3 stage"),
    (["--hw", "no-such-chip"], "no such hardware file or bundled name"),
    (["--by", "block"], "--by block needs --hw"),
    (["--by", "kernel"], "--by kernel needs --hw"),
    (["--timeline", "t.json"], "--timeline needs --hw"),
    (["--hw", "tx8", "--timeline-pair", "0"], "--timeline-pair needs --timeline"),
    (["--hop-latency", "2"], "--hop-latency needs --link-bandwidth or --hw"),
    (["--hw", "tx8", "--bruck"], "--bruck applies to the plain ring estimate"),
    (["--hw", "tx8-16", "--steps", "0"], "'--steps'"),
    (["--hw", "tx8", "--exec", "lazy"], "'--exec'"),
    (["--hw", "tx8", "--dram-efficiency", "0"], "'--dram-efficiency'"),
    # a system smaller than the dump (4 devices) is an error
    (["--hw", "a100-sxm.toml-does-not-exist"], "no such hardware file"),
])
def test_hw_usage_errors_are_one_line(capsys, args, message):
    code, out, err = run([EXAMPLE, *args], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_by_block_without_blocks_times_the_whole_program(capsys):
    """The bundled example (an MLP and a convolution) has no transformer blocks: --by block
    gives the whole program's time as the one row outside the blocks."""
    code, out, err = run([EXAMPLE, "--hw", "h100-sxm", "--by", "block"], capsys)
    assert code == 0, err
    assert "Time per block: no blocks found" in out
    row = next(line for line in out.splitlines() if line.startswith("outside"))
    assert "outside the blocks" in row
