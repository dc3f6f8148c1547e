"""The packages depend on each other in one direction (docs/design.md), and the light ones
import without the heavy ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Which project packages each package may import (its own modules always).
ALLOWED = {
    "hlo_trace": set(),
    "hardware": {"hlo_trace"},
    # models.opensora.theory takes the ring volumes from their one home, hardware.collectives
    # (numpy + stdlib: no torch, no jaxlib).
    "models": {"hlo_trace", "hardware"},
    "hlo_analyzer": {"hlo_trace", "hardware"},
    "tracing": {"hlo_trace", "models", "hlo_analyzer"},
}


def _imported_packages(path: Path) -> set[str]:
    """Top-level names of every import in the file, at any depth (lazy imports count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(package):
    project = set(ALLOWED)
    offending = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        wrong = (_imported_packages(path) & project) - ALLOWED[package] - {package}
        if wrong:
            offending[str(path.relative_to(REPO_ROOT))] = sorted(wrong)
    assert offending == {}


def _import_with_blocked(modules: list[str], blocked: list[str]) -> subprocess.CompletedProcess:
    """Import ``modules`` in a fresh interpreter where importing any of ``blocked`` fails."""
    code = "\n".join([
        "import sys",
        *[f"sys.modules[{name!r}] = None" for name in blocked],  # None: import raises
        *[f"import {name}" for name in modules],
    ])
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True)


def test_hardware_imports_without_jax_jaxlib_or_torch():
    completed = _import_with_blocked(
        ["hardware", "hardware.spec", "hardware.collectives"],
        ["jax", "jaxlib", "torch", "torch_xla", "hlo_analyzer"])
    assert completed.returncode == 0, completed.stderr


def test_the_torch_free_model_modules_import_without_torch_or_the_analyzer():
    completed = _import_with_blocked(
        ["models.opensora.config", "models.opensora.inputs", "models.opensora.flops",
         "models.opensora.parallel", "models.opensora.theory"],
        ["torch", "torch_xla", "jax", "jaxlib", "hlo_analyzer"])
    assert completed.returncode == 0, completed.stderr


def test_the_blocking_is_real():
    completed = _import_with_blocked(["hlo_analyzer"], ["jaxlib"])
    assert completed.returncode != 0 and "jaxlib" in completed.stderr
