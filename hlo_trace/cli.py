"""``run_click``: the one way the project's commands turn errors into one line and an exit code."""

from __future__ import annotations

import os
from collections.abc import Sequence

import click

from hlo_trace.errors import UsageError


def run_click(command: click.Command, argv: Sequence[str] | None = None) -> int:
    """Run a click command so that every usage error is one line on stderr and exit code 2.

    Shared by the project's CLIs: click's own usage errors, the project's UsageError, and an
    interrupted run all end without a traceback.
    """
    try:
        result = command.main(args=list(argv) if argv is not None else None,
                              standalone_mode=False)
    except click.exceptions.UsageError as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        return 2
    except UsageError as exc:
        click.echo(f"Error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130
    except Exception as exc:  # a bug, not bad input: say what, keep the traceback for debugging
        if os.environ.get("HLO_TRACE_DEBUG"):
            raise
        click.echo(f"Error: internal error ({type(exc).__name__}: {exc}); "
                   "set HLO_TRACE_DEBUG=1 for the traceback", err=True)
        return 1
    return result if isinstance(result, int) else 0


def emit(text: str, output: str | None, *, force: bool = False) -> None:
    """A command's report: to ``output`` atomically (refusing to overwrite without ``force``),
    or to standard output."""
    if output:
        from hlo_trace.atomic import atomic_write

        atomic_write(output, text, force=force)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)
