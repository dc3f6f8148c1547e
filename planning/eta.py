"""Progress lines that tell the truth: what the search is doing, how far it is, and when it
will be done at the pace so far (``calibrating 12 of 314 traces, 31 s, ETA 12 min 40 s``).

The estimate of the time left is the mean time of the items done so far in this run times the
items left (items a cache answered are not counted: they take no time). Nothing is printed
here: the lines go to a callback (the command echoes them to stderr).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["EtaReporter", "duration_text", "eta_line"]

#: Seconds in a minute and an hour (the line's units).
MINUTE_S, HOUR_S = 60, 3600


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``1 h 2 min``: whole seconds, two units at most."""
    whole = max(0, round(seconds))
    if whole < MINUTE_S:
        return f"{whole} s"
    if whole < HOUR_S:
        return f"{whole // MINUTE_S} min {whole % MINUTE_S} s"
    return f"{whole // HOUR_S} h {whole % HOUR_S // MINUTE_S} min"


def eta_line(what: str, done: int, total: int, elapsed_s: float, unit: str = "") -> str:
    """``WHAT DONE of TOTAL[ UNIT], ELAPSED, ETA LEFT``; before the first item ``ETA unknown``."""
    text = f"{what} {done} of {total}{' ' + unit if unit else ''}, {duration_text(elapsed_s)}"
    if done >= total:
        return text + ", done"
    if done == 0:
        return text + ", ETA unknown"
    return text + f", ETA {duration_text(elapsed_s / done * (total - done))}"


#: Seconds between two lines of one reporter (the first and the last line always come).
REPORT_INTERVAL_S = 5.0


class EtaReporter:
    """Calls ``echo`` with :func:`eta_line` when the count of items done changes, at most every
    ``interval_s`` seconds (the start and the end always), timing from its creation."""

    def __init__(self, what: str, total: int, echo: Callable[[str], None], *, unit: str = "",
                 interval_s: float = REPORT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.echo, self.unit, self.clock = what, total, echo, unit, clock
        self.interval_s = interval_s
        self.started = clock()
        self.done, self.shown_at = -1, -interval_s

    def __call__(self, done: int, total: int | None = None) -> None:
        """Report ``done`` items (of ``total``, when the caller knows better now: items a cache
        answered leave the count)."""
        if total is not None:
            self.total = total
        now = self.clock()
        due = done in (0, self.total) or now - self.started - self.shown_at >= self.interval_s
        if done != self.done and due:
            self.done, self.shown_at = done, now - self.started
            self.echo(eta_line(self.what, done, self.total, now - self.started, self.unit))
