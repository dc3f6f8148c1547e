"""Every script under ``benchmarks/`` runs in its quick mode (issue 26): seconds, small inputs.

Nothing else runs the benchmarks, so without this a rename (a module, a dump's name) broke them
silently until the next reader. Each script is run as a user runs it, ``python3
benchmarks/NAME.py --quick``, in a fresh process; full runs stay manual. The ones that need the
trace extra are skipped without it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((REPO_ROOT / "benchmarks").glob("*.py"))

#: Scripts whose quick mode needs these modules (absent: skipped). gpu_validate needs torch too,
#: but says so in one line and exits 0 without it, which is run.
NEEDS = {"trace_full": ("torch", "torch_xla"), "plan_search": ("torch", "torch_xla")}

#: Seconds a quick run may take on the shared 2-core development machine (they take 1-10 s).
TIMEOUT_S = 120


def test_the_benchmarks_are_found():
    assert len(BENCHMARKS) >= 6  # every *.py of benchmarks/ is run below, new ones included


#: Quick modes that still trace for a minute (plan_search: a search on the tiny model): CI's slow
#: leg runs them.
SLOW_QUICK_MODES = frozenset({"plan_search"})


@pytest.mark.parametrize("script", [pytest.param(path, id=path.stem, marks=pytest.mark.slow)
                                    if path.stem in SLOW_QUICK_MODES else pytest.param(path, id=path.stem)
                                    for path in BENCHMARKS])
def test_quick_mode_runs(script, tmp_path):
    missing = [name for name in NEEDS.get(script.stem, ()) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{script.name} --quick needs {', '.join(missing)} (the trace extra)")
    completed = subprocess.run(
        [sys.executable, str(script), "--quick"], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=TIMEOUT_S)
    assert completed.returncode == 0, f"{script.name} --quick:\n{completed.stderr[-3000:]}"
    assert completed.stdout.strip(), f"{script.name} --quick printed nothing"
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
