"""Waiting in a test for another process to reach a state (a step started, a child running)
before the test acts on it. How long that takes is no property of the project: the guard below
only turns a process that never gets there (a hang) into one failure line, and is generous
enough that a loaded 2-core machine never meets it. Speed is measured in benchmarks/."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

#: Seconds after which a state that never comes is taken for a hang.
HANG_GUARD_S = 300.0
POLL_S = 0.02


def wait_until(condition: Callable[[], bool], what: str, *,
               still_running: Callable[[], bool] | None = None) -> None:
    """Return once ``condition()`` holds; fail if ``still_running()`` turns false first (the
    process ended before it got there) or after :data:`HANG_GUARD_S` (it hangs)."""
    guard = time.monotonic() + HANG_GUARD_S
    while not condition():
        if still_running is not None and not still_running():
            pytest.fail(f"the process ended before {what}", pytrace=False)
        if time.monotonic() > guard:
            pytest.fail(f"{what} never came ({HANG_GUARD_S:.0f} s): a hang", pytrace=False)
        time.sleep(POLL_S)
