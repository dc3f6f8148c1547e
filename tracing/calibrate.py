"""``python -m tracing.calibrate REQUESTS.json``: trace the one-pair stages of the plan search's
estimate calibrations (``planning.plan_estimate``) in one process.

``REQUESTS.json`` lists ``{"config": MODEL_TOML, "shape", "strategy", "mesh": [nx, ny],
"ring": int|null, "patches", "stage_ids": "0-2", "stages": [0], "out": DIR}`` (a training step,
``planning.train_estimate``, adds ``"batch"``, ``"train": {"zero", "recompute", "label"}`` and
``"shape_cache"``: one file of stage shapes for all its requests, else ``out/stage_shapes.json``); every stage of
``stages`` whose dump is not in ``out`` yet is traced there; ``{"pipeline": FILE, "stages", "out",
"failures": DIR}`` traces stages of a pipeline file at its full size, as ``trace-stage --pipeline``
does (the plan search's confirmations, ``planning.plan_search.runner_tracer``). torch and torch-xla are imported once (op metadata on, as
``tracing.capture.prepare_process`` sets it);
each stage is traced in a forked child (the device count is fixed per process, and a child
starts from the loaded modules: about a second a stage instead of five for a fresh process).
``--serve``: the requests of each line of stdin, answering ``done`` on stdout after each line
(torch loaded once for all lines). A request the tracer refuses is recorded in its ``failures`` or ``out`` directory (``failed.txt``, the tracer's line)
and the others go on; exit code 2 and one ``Error:`` line on a malformed requests file.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hlo_trace.cli import native_imports
from hlo_trace.errors import UsageError
from hlo_trace.isolate import die_with_parent
from plans.calibration import SERVED, dump_names, failure_file, request_config
from plans.config import check_trace_size
from plans.train_options import TrainOptions
from tracing.capture import OP_METADATA_ENV
from tracing.cli import require_trace_extra, trace_to_dump

__all__ = ["load_tracer", "main", "trace_requests"]


def load_tracer() -> None:
    """Load torch, torch-xla (op metadata on) and the MLIR bindings once, in a process whose
    forked children then trace: each child starts from the loaded modules. What is loaded is
    then frozen (``gc.freeze``): a child's garbage collections leave its 450,000 objects alone
    instead of walking them and copying every page they touch (half the CPU of a one-pair
    training trace)."""
    require_trace_extra()
    os.environ[OP_METADATA_ENV] = "1"  # read when torch-xla is imported, here, before the forks
    with native_imports():
        import torch  # noqa: F401
        import torch_xla  # noqa: F401

        from hlo_analyzer.mlir import load_native_libraries

        load_native_libraries()
    gc.freeze()


def trace_requests(requests: Sequence[dict]) -> int:
    """Trace every missing stage of ``requests``; the number of stages traced."""
    load_tracer()
    traced = 0
    for request in requests:
        try:
            traced += _trace_request(request)
        except UsageError as error:  # recorded; the estimate of its plans says so
            failure = failure_file(request)
            failure.parent.mkdir(parents=True, exist_ok=True)
            failure.write_text(f"{error}\n")
    return traced


def _trace_request(request: dict) -> int:
    """Trace the missing stages of one request; how many."""
    config = request_config(request)
    train = None
    if "train" in request:
        train = TrainOptions(zero=request["train"]["zero"], recompute=request["train"]["recompute"])
    if "pipeline" in request:
        check_trace_size(config)  # a full-size stage: before torch allocates anything
    out = Path(request["out"])
    out.mkdir(parents=True, exist_ok=True)
    traced = 0
    for stage, name in zip(request["stages"], dump_names(request), strict=True):
        if (out / name).exists():
            continue
        shapes = Path(request["shape_cache"]) if "shape_cache" in request else out / "stage_shapes.json"
        trace_to_dump(config, stage, out, "stablehlo", True, shapes, train,
                      origin=config.dump_name(stage), what="tracing a calibration stage",
                      live_stderr=False)
        traced += 1
    return traced


def serve(lines, answer) -> None:
    """Trace the requests of each line of ``lines`` (a JSON list, as ``REQUESTS.json``), then
    ``answer(SERVED)``, or ``answer("Error: ...")`` for a malformed line; until ``lines``
    ends. torch is loaded once for every line: a plan search's confirmations, plan after plan
    (``planning.plan_search.runner_tracer``)."""
    for line in lines:
        try:
            requests = json.loads(line)
            if not isinstance(requests, list):
                raise UsageError("expected a JSON list of requests on one line")
            trace_requests(requests)
        except (UsageError, OSError, ValueError, KeyError) as error:
            answer(f"Error: {error}")
            continue
        answer(SERVED)


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()  # the search that started it ends: so does this (and its traces)
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--serve"]:
        serve(sys.stdin, lambda text: print(text, flush=True))
        return 0
    if len(arguments) != 1:
        print("Error: usage: python -m tracing.calibrate REQUESTS.json | --serve", file=sys.stderr)
        return 2
    try:
        requests = json.loads(Path(arguments[0]).read_text())
        if not isinstance(requests, list):
            raise UsageError(f"{arguments[0]}: expected a JSON list of calibration requests")
        trace_requests(requests)
    except (UsageError, OSError, ValueError, KeyError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
