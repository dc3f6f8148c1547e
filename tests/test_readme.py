"""Every code block of the README runs as written.

Python blocks run in a directory that holds a ``dumps/`` folder, as ``trace-stage`` leaves one
(issue 26: a top-level ``dumps`` package was shadowed by it); the bundled example is reached
through ``hlo_trace.examples``, through the installed package itself where this checkout is the
installed one (CI). Command blocks run line by line: one that traces runs in an empty directory (its
dump lands in ./dumps/ there), the others in the repository root, where the quick start is run.
Lines that install, run this test suite, or trace the full-size model are left out (listed in
``NOT_RUN``). ``text`` blocks are not code.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"

#: Fragments of command lines the test does not run, with the reason.
NOT_RUN = {
    "pip install": "installs the project (CI does that in each leg)",
    "python3 -m pytest": "runs this very suite",
    "--config full": "a full-size trace: benchmarks/trace_full.py measures it",
}

#: The console scripts, run through their modules so that they resolve to this checkout.
COMMANDS = {"analyze-hlo": "hlo_analyzer.cli", "trace-stage": "tracing.cli",
            "plan-search": "planning.plan_search_cli", "trace-module": "tracing.module_cli"}
#: Commands that trace: they run in an empty directory (their outputs land there).
TRACING_COMMANDS = ("trace-stage", "plan-search", "trace-module")


def code_blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced block of the README."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def installed_distribution() -> importlib.metadata.Distribution | None:
    """The installed hlo-trace if pip installed it from this checkout (as CI's legs do), else
    None. A build's ``hlo_trace.egg-info`` in the checkout has no ``direct_url.json``: skipped."""
    for distribution in importlib.metadata.distributions(name="hlo-trace"):
        try:
            url = json.loads(distribution.read_text("direct_url.json") or "{}").get("url")
        except (json.JSONDecodeError, AttributeError):
            continue
        if url == REPO_ROOT.as_uri():
            return distribution
    return None


def installed_from_this_checkout() -> bool:
    return installed_distribution() is not None


def python_env() -> dict[str, str]:
    """The installed package as a user has it (CI), else this checkout on PYTHONPATH."""
    if installed_from_this_checkout():
        return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return _env()


def user_dumps_folder(directory: Path) -> None:
    """What ``trace-stage --stage 0 --strategy megatron`` leaves in ``directory``: ./dumps/."""
    dumps = directory / "dumps"
    dumps.mkdir()
    (dumps / "tiny_28_64_64_megatron_2x2_stage0_pairs0-1.mlir").write_text("module {}\n")
    (dumps / "tiny_28_64_64_megatron_2x2_stage0_pairs0-1.json").write_text("{}\n")


def test_the_readme_has_the_quick_start_and_the_visitor_example():
    languages = [language for language, _ in code_blocks()]
    assert languages.count("python") >= 1 and languages.count("") >= 2


@pytest.mark.parametrize("index", [i for i, (lang, _) in enumerate(code_blocks()) if lang == "python"])
def test_python_block_runs_from_a_directory_with_a_dumps_folder(index, tmp_path):
    _, body = code_blocks()[index]
    user_dumps_folder(tmp_path)
    completed = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=python_env(),
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    gemm_ops = re.search(r"GEMM ops: (\d+)", completed.stdout)
    if gemm_ops:
        # The bundled dump (hlo_trace/examples/example_mlp_megatron_2x2.json) holds one patch-embedding
        # convolution and the two dots of the MLP: 3 GEMMs; 2,048 + 4,096 + 4,096 FLOPs.
        assert int(gemm_ops.group(1)) == 3
        assert completed.stdout.splitlines()[1].startswith("10240 GEMM FLOPs")
    jax_mlp = re.search(r"(\d+) GEMM FLOPs and ([\d.]+) bytes sent per device", completed.stdout)
    if jax_mlp:
        # "Your own model": a 64x128 input through a 128x512 / 512x128 MLP, Megatron-split over 4
        # devices: each multiplies by its 128 columns and 128 rows, then all-reduces the
        # 64x128 float32 partial sums (2 (n-1)/n of 32 KiB sent on a ring of 4).
        assert int(jax_mlp.group(1)) == 2 * (2 * 64 * 128 * 512 // 4)
        assert float(jax_mlp.group(2)) == 2 * 3 / 4 * 64 * 128 * 4


@pytest.mark.parametrize("index", [i for i, (lang, _) in enumerate(code_blocks()) if lang == ""])
def test_command_block_runs(index, tmp_path):
    _, body = code_blocks()[index]
    lines = [line.split("#")[0].strip() for line in body.splitlines()]
    lines = [line for line in lines if line and not any(f in line for f in NOT_RUN)]
    traces = any(line.startswith(TRACING_COMMANDS) for line in lines)
    if traces and importlib.util.find_spec("torch_xla") is None:
        pytest.skip("the block traces: needs the trace extra")
    cwd = tmp_path if traces else REPO_ROOT
    for line in lines:
        words = shlex.split(line)
        assert words[0] in COMMANDS, f"README command the test does not know: {line}"
        completed = subprocess.run([sys.executable, "-m", COMMANDS[words[0]], *words[1:]],
                                   cwd=cwd, env=_env(), capture_output=True, text=True,
                                   timeout=600)
        if "--hw tx8 " in line and completed.returncode:
            pytest.xfail("--hw tx8 on an N-device dump: N chips (in progress, issue 10)")
        assert completed.returncode == 0, f"{line}\n{completed.stderr}"
        assert completed.stdout or "wrote" in completed.stderr
