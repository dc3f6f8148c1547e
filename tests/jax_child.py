"""JAX run in a fresh interpreter, for the tests that need it to compile or export something.

A JAX backend started in the test process (``jax.jit(...).compile()``, ``jax.devices()``,
``jax.export``) stays there with its thread pools, and every later fork of the process (the
analysis child of ``analyze-hlo``, ``hlo_trace.isolate``) would fork a multithreaded process:
JAX warns that this "will likely lead to a deadlock", once per fork. So no test starts a backend
in its own process (``tests/conftest.py`` checks it after each test); they get JAX's answer from a
child instead, as ``tests/jax_programs.py`` does for whole programs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest


def run_jax(code: str, *, timeout_s: int = 300, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` (with ``jax`` and ``jnp`` imported) in a child interpreter on the CPU
    platform; it must ``emit(value)`` one JSON-able value, which is returned. ``env`` adds to
    the child's environment (e.g. ``XLA_FLAGS``, read when its backend starts). Skips the test
    where jax is not installed."""
    pytest.importorskip("jax")
    program = ("import json, sys\nimport jax\nimport jax.numpy as jnp\n"
               "def emit(value):\n    print('\\n' + json.dumps(value))\n"
               + textwrap.dedent(code))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
                          timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
