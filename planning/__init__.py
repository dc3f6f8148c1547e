"""planning: the plan search, its estimates, sizing, the calibration traces it orders, the study
runner and their commands (``plan-search``). Above ``tracing/`` (which it drives through
``python -m tracing.calibrate`` and ``tracing.cli``) and ``hlo_analyzer/`` (``analyze_dump``)."""
