"""plans: the vocabulary of parallel plans, torch-free, below the tracer and the plan search.

``config``: a pipeline's configuration (stages, strategy, mesh, submeshes, PipeFusion patches)
checked against the model; ``cases``: a plan as a case of the study (``PxC:STRATEGY``) and the
splits of the block pairs; ``module_plan``: trace-module's sharding plans of any model (TOML);
``calibration``: the one-pair calibration requests the plan search writes and ``python -m
tracing.calibrate`` traces.
"""

try:
    import hlo_trace  # noqa: F401 - first: Ctrl-C while the command imports is one line (quiet_interrupts)
except KeyboardInterrupt:  # Ctrl-C in the instant before hlo_trace's hook exists: the same line
    import os
    os.write(2, b"Interrupted.\n")
    os._exit(130)
