"""What the project installs: no top-level ``dumps`` package (issue 26), and the bundled example
as package data of ``hlo_trace.examples``.

A user's ``./dumps/`` folder (``trace-stage`` writes there) would shadow an installed top-level
``dumps`` package as a namespace package, and ``example_dump()`` would find nothing.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from test_readme import installed_distribution, installed_from_this_checkout

REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _is_dumps(name: str) -> bool:
    return name == "dumps" or name.startswith(("dumps.", "dumps/"))


def test_the_repository_dumps_folder_is_not_a_package():
    assert not (REPO_ROOT / "dumps" / "__init__.py").exists()
    assert (REPO_ROOT / "hlo_trace" / "examples" / "__init__.py").is_file()


def test_package_discovery_finds_no_dumps_and_ships_the_examples():
    setuptools = pytest.importorskip("setuptools")
    # [tool.setuptools.packages.find] discovers namespace packages too (its default).
    packages = setuptools.find_namespace_packages(
        where=str(REPO_ROOT), include=SETUPTOOLS["packages"]["find"]["include"])
    assert "hlo_trace.examples" in packages
    assert not [name for name in packages if _is_dumps(name)]
    data = SETUPTOOLS["package-data"]
    assert not [key for key in data if _is_dumps(key)]
    examples = REPO_ROOT / "hlo_trace" / "examples"
    files = sorted(path.name for path in examples.iterdir() if path.suffix != ".py"
                   and path.is_file())
    shipped = [name for name in files
               if any(fnmatch.fnmatch(name, pattern) for pattern in data["hlo_trace.examples"])]
    assert shipped == files and "example_mlp_megatron_2x2.stablehlo.mlir" in files


@pytest.mark.skipif(not installed_from_this_checkout(),
                    reason="the installed hlo-trace is not this checkout (CI installs it)")
def test_the_installed_distribution_has_no_top_level_dumps():
    """``pip show -f hlo-trace``'s file list and the top-level names of the install."""
    distribution = installed_distribution()
    top_level = (distribution.read_text("top_level.txt") or "").split()
    assert "hlo_trace" in top_level and "dumps" not in top_level
    assert not [str(path) for path in distribution.files or () if _is_dumps(str(path))]


def _defaults(command) -> dict:
    return {param.name: param.default for param in command.params}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)


def test_what_the_commands_write_by_default_is_ignored_by_git_and_nothing_tracked_is():
    if shutil.which("git") is None or _git("rev-parse", "--is-inside-work-tree").returncode:
        pytest.skip("not a git work tree")
    from planning.plan_search_cli import plan_search_command as plan_search
    from scripts.sweep import main as sweep
    from tracing.cli import main as trace_stage
    from tracing.module_cli import main as trace_module

    dumps = _defaults(trace_stage)["out_dir"]
    search = _defaults(plan_search)
    outputs = [f"{dumps}/tiny_28_64_64_megatron_2x2_stage0_pairs0-1.mlir",  # a dump, its sidecar
               f"{dumps}/tiny_28_64_64_megatron_2x2_stage0_pairs0-1.json",
               f"{dumps}/stage_shapes.json",  # the shape cache (OUT/stage_shapes.json)
               search["plan_out"],
               f"{_defaults(sweep)['results_dir']}/summary.md",
               f"{_defaults(trace_module)['out_dir']}/gpt2_megatron_2x2.mlir",  # trace-module's
               f"{_defaults(trace_module)['out_dir']}/gpt2_megatron_2x2.json"]
    assert search["work_dir"] is None  # plan-search's cache: in the user's cache directory (hlo_trace.cache)
    for output in outputs:
        assert _git("check-ignore", "-q", output).returncode == 0, f"{output} is not ignored"
    # plan-search's cache of traces defaults to the user's cache directory, outside the tree
    assert search["work_dir"] is None
    # the bundled test dumps stay tracked: no pattern hides a tracked file
    assert _git("ls-files", "--cached", "--ignored", "--exclude-standard").stdout == ""
    assert _git("check-ignore", "-q", "dumps/stablehlo/new_test_dump.mlir").returncode == 1
