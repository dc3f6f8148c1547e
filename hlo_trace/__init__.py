"""hlo_trace: the lowest layer of the project, shared by every package above it.

It holds only what every package needs and imports nothing but the standard library (and
click for the command-line runner):

* ``hlo_trace.errors``: the typed exceptions that reach the user as one ``Error:`` line, exit 2;
* ``hlo_trace.atomic``: atomic output files that are never silently overwritten;
* ``hlo_trace.cli``: ``run_click``, the one way the project's commands turn errors into lines;
* ``hlo_trace.isolate``: ``call_in_child`` and ``start_in_child``, a forked child whose crash becomes a usage error.
* ``hlo_trace.examples``: ``example_dump``, the bundled example dump (package data), from any directory.

Dependency direction (docs/design.md): ``hlo_trace`` <- ``hardware`` <- ``hlo_analyzer``;
``hlo_trace`` <- ``models`` <- ``tracing``.
"""
