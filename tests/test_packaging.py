"""What the project installs: no top-level ``dumps`` package (issue 26), and the bundled example
as package data of ``hlo_trace.examples``.

A user's ``./dumps/`` folder (``trace-stage`` writes there) would shadow an installed top-level
``dumps`` package as a namespace package, and ``example_dump()`` would find nothing.
"""

from __future__ import annotations

import fnmatch
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
