"""A seeded fuzz run in CI: a few hundred mutations of the bundled dumps, hardware files and
trace-stage TOMLs (benchmarks/fuzz.py makes and runs them, each in a memory-capped forked child
with a time limit). The error promise: every outcome is a report (with no negative, NaN or
infinite number) or one ``Error:`` line with exit code 2; never a signal death, a hang, an
internal error or a traceback. ``python3 benchmarks/fuzz.py --cases 3000`` is the long run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fuzz import GOOD_CLASSES, make_cases

REPO_ROOT = Path(__file__).resolve().parent.parent

CASES = 240
SEED = 20261122


#: Runs the fuzz loop in a fresh interpreter: the fuzzer forks a child per case, and a pytest
#: process that earlier tests filled with jaxlib/MLIR thread pools does not fork safely.
_FUZZ_IN_A_FRESH_PROCESS = """
import json, sys
from benchmarks.fuzz import make_cases, run_cases
cases = list(make_cases(int(sys.argv[1]), int(sys.argv[2])))
tally = run_cases(cases, jobs=2, timeout_s=60.0, memory_bytes=4000 * 2**20)
print(json.dumps({
    "kinds": sorted({case.kind for case in cases}),
    "by_class": dict(tally.by_class),
    "failures": {klass: [(o.case.index, o.case.seed_name, o.case.mutator, o.stderr_tail[-200:])
                         for o in outcomes[:3]]
                 for klass, outcomes in tally.examples.items()},
}))
"""


@pytest.mark.slow
def test_seeded_mutations_end_in_a_report_or_one_error_line():
    completed = subprocess.run([sys.executable, "-c", _FUZZ_IN_A_FRESH_PROCESS, str(CASES),
                                str(SEED)], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=1200)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # The seed draws every input kind and most mutators (a regression in one shows up here).
    assert {"dump", "bytecode", "hardware", "model", "pipeline", "sidecar", "stage-sidecar",
            "nested", "option", "interrupt"} <= set(result["kinds"])
    by_class = result["by_class"]
    assert sum(by_class.values()) == CASES
    assert result["failures"] == {}, by_class
    assert set(by_class) <= set(GOOD_CLASSES)
    assert by_class["ok"] > 0 and by_class["usage"] > 0  # both paths exercised


def test_a_few_mutations_through_the_real_console_command(tmp_path):
    """The fuzzer runs the command in forked children; here a handful go through a fresh
    ``python3 -m hlo_analyzer.cli`` process each, as a user runs it."""
    for case in [c for c in make_cases(60, SEED) if c.kind == "dump"][:4]:
        dump = tmp_path / f"module_{case.index}.mlir"
        dump.write_bytes(case.content)
        completed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump),
                                    *case.options], cwd=REPO_ROOT, capture_output=True,
                                   text=True, timeout=60)
        assert completed.returncode in (0, 2), completed.stderr
        if completed.returncode == 2:
            lines = completed.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("Error: "), completed.stderr


def test_the_fuzz_draws_every_command_of_the_project():
    """Every console command of pyproject.toml gets cases (hlo-report, trace-module and
    plan-search included), each counted under its name."""
    import tomllib

    from benchmarks.fuzz import COMMAND_NAMES

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(COMMAND_NAMES) == set(scripts)
    cases = list(make_cases(600, SEED))
    assert {case.command for case in cases} == set(COMMAND_NAMES)
    assert {"report", "report-csv", "plan", "module", "terminate"} <= {case.kind for case in cases}
    heavy = [c for c in cases if c.kind in ("module", "terminate") or c.command.startswith("trace-")
             and c.kind == "interrupt"]
    assert len(heavy) < 0.08 * len(cases)  # torch-heavy cases stay a minority


def test_a_leaked_dump_folder_and_markup_in_a_figure_are_failing_classes(tmp_path):
    from benchmarks.fuzz import CLASSES, figure_markup, leaked_temp

    assert {"leaked-temp", "markup", "unwritten"} <= set(CLASSES) - set(GOOD_CLASSES)
    (tmp_path / "tmp" / "hlo_trace_xla_dump_abc").mkdir(parents=True)
    (tmp_path / "tmp" / "unrelated").mkdir()
    assert leaked_temp(tmp_path, within_s=0.1) == ["hlo_trace_xla_dump_abc"]
    spec = '<script type="application/json" class="figure-spec" data-for="f">{}</script>'
    assert figure_markup(spec.format(json.dumps({"data": [{"x": ["a", "<b>fuzz</b>"]}]})))
    assert not figure_markup(spec.format(json.dumps({"data": [{"x": ["&lt;b&gt;fuzz"]}]})))
