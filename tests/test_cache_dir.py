"""The user's cache directory (``hlo_trace.cache``): XDG's rule, the environment variables, and
plan-search's ``--cache-dir``: nothing at a fixed path of one machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hlo_trace.cache import cache_dir, trace_lock_path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_cache_follows_xdg_and_the_variables():
    home = {"HOME": "/home/ann"}
    assert cache_dir(home) == Path("/home/ann/.cache/hlo-trace")
    assert cache_dir({**home, "XDG_CACHE_HOME": "/var/cache/ann"}) == Path("/var/cache/ann/hlo-trace")
    # the XDG specification: a relative XDG_CACHE_HOME is invalid and ignored
    assert cache_dir({**home, "XDG_CACHE_HOME": "rel/cache"}) == Path("/home/ann/.cache/hlo-trace")
    assert cache_dir({**home, "XDG_CACHE_HOME": "/x", "HLO_TRACE_CACHE": "/scratch/ht"}) == Path("/scratch/ht")
    assert trace_lock_path(home) == Path("/home/ann/.cache/hlo-trace/fulltrace.lock")
    assert trace_lock_path({**home, "HLO_TRACE_LOCK": "/tmp/shared.lock"}) == Path("/tmp/shared.lock")


def test_no_library_code_names_a_fixed_temporary_path():
    sources = [p for top in ("hlo_trace", "hlo_analyzer", "hlo_report", "tracing", "planning", "plans", "models",
                             "hardware", "scripts") for p in (REPO_ROOT / top).rglob("*.py")]
    assert sources
    offenders = [str(p.relative_to(REPO_ROOT)) for p in sources if '"/tmp/' in p.read_text()]
    assert offenders == []


def test_the_lock_for_a_shell_script(tmp_path):
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-m", "hlo_trace.cache", "--lock"], capture_output=True, text=True,
                            env=environment, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lock = Path(result.stdout.strip())
    assert lock == tmp_path / ".cache" / "hlo-trace" / "fulltrace.lock" and lock.parent.is_dir()
    wrong = subprocess.run([sys.executable, "-m", "hlo_trace.cache", "--what"], capture_output=True, text=True,
                           env=environment, cwd=tmp_path)
    assert wrong.returncode == 2 and wrong.stderr.startswith("Error:")


def test_plan_search_works_in_its_cache_dir(tmp_path, monkeypatch):
    """--cache-dir without --work-dir: the work directory is plan-search/ there, and the run's
    trace lock and children see the cache directory; --work-dir wins."""
    from hlo_trace.cache import CACHE_ENV
    from planning.plan_search_cli import _work_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_ENV, "/elsewhere")
    assert _work_dir(None, None) == "/elsewhere/plan-search"
    assert _work_dir(None, "cache") == str(tmp_path / "cache" / "plan-search")
    assert trace_lock_path() == tmp_path / "cache" / "fulltrace.lock"
    assert _work_dir("mine", "cache") == "mine"
