"""Checks every test of the suite shares."""

from __future__ import annotations

import signal
import sys

import pytest


@pytest.fixture(autouse=True, scope="session")
def _children_start_with_sigint_at_its_default():
    """The commands the tests start get SIGINT at its default action, as a terminal's foreground
    command does. A shell without job control starts a background command (``pytest ... &`` in a
    script) with SIGINT ignored, an ignored signal stays ignored through fork and exec, and every
    test that sends Ctrl-C to a command would find it ignored (the command runs to its end). A
    handler set here is reset to the default action by exec."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


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


@pytest.fixture(autouse=True, scope="session")
def _the_cache_directory_is_the_test_runs(tmp_path_factory):
    """A command that a test runs without ``--work-dir`` caches in the user's cache directory
    (``hlo_trace.cache``): here a directory of the test run, never the user's own."""
    import os

    from hlo_trace.cache import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before
