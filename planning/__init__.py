"""planning: the plan search, its estimates, sizing, the calibration traces it orders, the study
runner and their commands (``plan-search``). Above ``hlo_analyzer/`` (``analyze_dump``) and the
plan vocabulary (``plans``); the tracer it starts in processes of its own, through one protocol
(``planning.trace_process``), and never imports."""

try:
    import hlo_trace  # noqa: F401 - first: Ctrl-C while the command imports is one line (quiet_interrupts)
except KeyboardInterrupt:  # Ctrl-C in the instant before hlo_trace's hook exists: the same line
    import os
    os.write(2, b"Interrupted.\n")
    os._exit(130)
