"""A calibration request: the one-pair stage the plan search's estimates trace, as JSON.

The plan search (``planning.plan_estimate``, ``planning.train_estimate``) writes requests;
``python -m tracing.calibrate`` traces them. Both read a request through this module, so the
tracer's process never imports the search that started it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plans.config import build_config

__all__ = ["FAILURE_FILE", "SERVED", "dump_names", "failure_file", "request_config"]


#: ``python -m tracing.calibrate --serve``'s answer once a line's requests are traced.
SERVED = "done"
#: ``tracing.calibrate``'s record of a request the tracer refused (its one line).
FAILURE_FILE = "failed.txt"


def request_config(request: dict[str, Any]):
    """The tracer's configuration of a calibration request (``tracing.calibrate`` traces it);
    a request ``{"pipeline": FILE, "stages": [...], "out": DIR}`` names a pipeline file instead
    (a plan search's confirmation: the stages of a plan at its full size, as ``trace-stage
    --pipeline FILE --stage k`` traces each, in one process)."""
    if "pipeline" in request:
        from plans.config import load_config_file

        return load_config_file(request["pipeline"])
    ring, mesh = request["ring"], tuple(request["mesh"])
    extra = {"batch": request["batch"]} if "batch" in request else {}
    return build_config(config=request["config"], shape=request["shape"], strategy=request["strategy"],
                        mesh=mesh, stage_ids=request["stage_ids"], patches=request["patches"], ring_degree=ring,
                        ulysses_degree=None if ring is None else mesh[1] // ring,
                        self_attention_flash=None if request.get("flash") is None else tuple(request["flash"]),
                        **extra)


def failure_file(request: dict[str, Any]) -> Path:
    """Where ``tracing.calibrate`` records that the tracer refused ``request``: in its
    ``"failures"`` directory when it names one (a confirmation's dumps share a directory with
    other plans'), else in its ``out`` directory."""
    return Path(request.get("failures", request["out"])) / FAILURE_FILE


def dump_names(request: dict[str, Any]) -> list[str]:
    """The file names of the dumps a request traces, one per stage."""
    config = request_config(request)
    suffix = f"_{request['train']['label']}" if "train" in request else ""
    return [f"{config.dump_name(stage)}{suffix}.mlir" for stage in request["stages"]]
