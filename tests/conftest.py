"""Checks every test of the suite shares."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _no_jax_backend_in_the_test_process(request):
    """A test that starts a JAX backend here (jit, devices, export) leaves its threads behind,
    and every later fork of this process (analyze-hlo's analysis child) warns that it will likely
    deadlock: such JAX work runs in a child (``tests/jax_child.py``)."""
    yield
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        bridge._backends.clear()  # one failure, not one per later test
        pytest.fail(f"{request.node.nodeid} started a JAX backend in the test process: run that "
                    "JAX work in a child (tests/jax_child.py)", pytrace=False)
