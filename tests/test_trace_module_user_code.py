"""trace-module on models whose own code misbehaves (a forward that computes nothing, reads a value
back, or raises ``SystemExit``, ``BaseException`` or ``KeyboardInterrupt``; a factory or a module
import that does) and on an ``--input`` size of 5,000 digits: each is the user's error, one
``Error:`` line naming the cause, exit code 2; never an internal error (exit 1), a crash blamed
on jaxlib, a claim of running out of memory or a Ctrl-C that nobody pressed."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fuzz import FUZZ_MODELS

REPO_ROOT = Path(__file__).resolve().parent.parent
SLOW = pytest.mark.slow
needs_torch_xla = pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch_xla") is None, reason="needs the trace extra")

#: The misbehaving models the fuzz also traces (classes and factories by the names used below).
USER_MODULE = FUZZ_MODELS
#: A top-level module that ends the interpreter as it is imported.
EXITING_MODULE = "raise SystemExit(4)\n"


def trace_module(tmp_path: Path, factory: str, *args: str,
                 memory_bytes: int | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "user_models.py").write_text(USER_MODULE)
    (tmp_path / "exits_on_import.py").write_text(EXITING_MODULE)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(tmp_path)])}
    environment.pop("HLO_TRACE_PARENT_PID", None)

    def limit() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run([sys.executable, "-m", "tracing.module_cli", factory, *args,
                           "--strategy", "dp", "--mesh", "1x2", "-o", str(tmp_path / "out")],
                          cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=300, preexec_fn=limit)


def assert_one_error(completed: subprocess.CompletedProcess, *fragments: str) -> str:
    errors = [line for line in completed.stderr.splitlines() if line.startswith("Error:")]
    assert completed.returncode == 2 and len(errors) == 1, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr and "internal error" not in errors[0]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


X = ("--input", "x=4x8:float32")


@needs_torch_xla
@pytest.mark.parametrize("factory, args, fragments", [
    ("torch.nn:Identity", ("--input", "input=4x8:float32"), ("computes nothing",)),
    pytest.param("torch.nn:Identity", ("--input", "input=4x8:float32", "--mode", "train"),
                 ("--mode train", "no trainable parameter"), marks=SLOW),
    pytest.param("user_models:ReturnsNone", X, ("returned NoneType, no tensor",), marks=SLOW),
    pytest.param("user_models:ReturnsInt", X, ("returned int, no tensor",), marks=SLOW),
    ("user_models:ReadsItem", X, ("forward(x=[4, 8]) calls Tensor.item()",)),
    pytest.param("user_models:Branches", X, ("calls Tensor.__bool__()",), marks=SLOW),
    pytest.param("user_models:Exits", X, ("forward(x=[4, 8]) raised SystemExit: '3'",), marks=SLOW),
    pytest.param("user_models:RaisesBase", X, ("forward(x=[4, 8]) raised BaseException",),
                 marks=SLOW),
    ("user_models:RaisesInterrupt", X, ("raised KeyboardInterrupt itself",)),
    pytest.param("user_models:factory_exits", X, ("the factory raised SystemExit",), marks=SLOW),
    pytest.param("user_models:factory_raises_base", X, ("the factory raised BaseException",),
                 marks=SLOW),
    pytest.param("exits_on_import:anything", X, ("importing exits_on_import raised SystemExit",),
                 marks=SLOW),
])
def test_the_users_code_is_named_in_one_error_line(tmp_path, factory, args, fragments):
    completed = trace_module(tmp_path, factory, *args)
    assert_one_error(completed, *fragments)
    assert "Interrupted" not in completed.stderr and "jaxlib" not in completed.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@needs_torch_xla
@SLOW
def test_a_forward_that_computes_nothing_is_no_memory_shortage_under_a_memory_limit(tmp_path):
    """The fuzz's limit on a command's address space (torch and XLA map about 5 GB of it)."""
    completed = trace_module(tmp_path, "user_models:ReturnsNone", *X, memory_bytes=16 * 2**30)
    error = assert_one_error(completed, "no tensor")
    assert "out of memory" not in error


def test_a_5000_digit_input_size_is_one_error_line(tmp_path):
    completed = trace_module(tmp_path, "torch.nn:Identity", "--input", f"x={'9' * 5000}:float32")
    assert_one_error(completed, "--input", "sizes must be 1 to")
