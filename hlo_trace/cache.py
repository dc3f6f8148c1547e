"""Where hlo-trace keeps what outlives a run: the user's cache directory (the XDG base directory
rule), never a fixed path of one machine.

* the cache directory: ``$HLO_TRACE_CACHE`` if set, else ``$XDG_CACHE_HOME/hlo-trace`` (an
  absolute ``XDG_CACHE_HOME`` only, as the XDG specification says), else
  ``~/.cache/hlo-trace``; ``plan-search --cache-dir DIR`` sets it for one run. plan-search's
  work directory (calibrations, traced plans) defaults to ``plan-search/`` there.
* the trace lock: ``$HLO_TRACE_LOCK`` if set, else ``fulltrace.lock`` in the cache directory. A
  process holds it (``flock``) while it runs a trace of a full-size model, so that two such traces
  (a few GiB each) never run at once on one machine; a shell script takes the same lock with
  ``flock "$(python -m hlo_trace.cache --lock)" COMMAND``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CACHE_ENV", "LOCK_ENV", "cache_dir", "main", "trace_lock_path"]

#: The cache directory, when set (overrides the XDG default).
CACHE_ENV = "HLO_TRACE_CACHE"
#: The trace lock file, when set (default: ``fulltrace.lock`` in the cache directory).
LOCK_ENV = "HLO_TRACE_LOCK"
#: The directory's name under the XDG cache home.
APPLICATION = "hlo-trace"
#: The trace lock's file name in the cache directory.
LOCK_NAME = "fulltrace.lock"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's cache directory of hlo-trace (module doc); not created here."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path(environ.get("HOME") or Path.home()) / ".cache"
    return base / APPLICATION


def trace_lock_path(environ: Mapping[str, str] | None = None) -> Path:
    """The trace lock file (module doc); not created here."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(LOCK_ENV)
    return Path(chosen).expanduser() if chosen else cache_dir(environ) / LOCK_NAME


def main(argv: list[str] | None = None) -> int:
    """``python -m hlo_trace.cache [--lock]``: print the cache directory (or the lock file),
    creating its directory, for shell scripts."""
    arguments = sys.argv[1:] if argv is None else argv
    if arguments not in ([], ["--lock"]):
        print("Error: usage: python -m hlo_trace.cache [--lock]", file=sys.stderr)
        return 2
    path = trace_lock_path() if arguments else cache_dir()
    (path.parent if arguments else path).mkdir(parents=True, exist_ok=True)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
