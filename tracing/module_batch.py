"""``python -m tracing.module_batch REQUESTS.json``: many ``trace-module`` traces in one process
(the module plan search's calibrations and full-size parts, ``planning.module_search``).

``REQUESTS.json`` lists ``{"factory": "pkg.module:factory", "kwargs": {...}, "inputs":
["NAME=SHAPE:DTYPE", ...], "plan": TOML text or null (one device), "dtype", "name", "out": DIR}``;
a request whose dump ``OUT/NAME.mlir`` (and sidecar) exists already is skipped. A request
``{"modules": true, "factory", "kwargs", "name", "out"}`` writes the model's module and
parameter names as ``OUT/NAME.modules.json`` (the role map's check). torch and torch-xla are
imported once; each trace runs in a forked child (``trace-module``'s own child function: the
device count is fixed per process), so a trace costs a few seconds instead of a fresh process's
import. A request the tracer refuses is recorded as ``OUT/NAME.failed.txt`` (the tracer's line)
and the others go on; exit code 2 and one ``Error:`` line on a malformed requests file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hlo_trace.atomic import atomic_write
from hlo_trace.errors import UsageError
from hlo_trace.isolate import call_in_child, die_with_parent
from plans.module_plan import load_plan, parse_input
from tracing.calibrate import load_tracer

__all__ = ["FAILED_SUFFIX", "MODULES_SUFFIX", "main", "trace_requests"]

#: A refused request's record beside its dump: ``NAME.failed.txt``.
FAILED_SUFFIX = ".failed.txt"
#: The module and parameter names of a ``modules`` request: ``NAME.modules.json``.
MODULES_SUFFIX = ".modules.json"


def trace_requests(requests: Sequence[dict[str, Any]]) -> int:
    """Trace (or list) every request not done yet; how many ran."""
    load_tracer()
    ran = 0
    for request in requests:
        out = Path(request["out"])
        out.mkdir(parents=True, exist_ok=True)
        try:
            ran += _run(request, out)
        except UsageError as error:  # recorded; the search says so for this plan
            (out / f"{request['name']}{FAILED_SUFFIX}").write_text(f"{error}\n")
    return ran


def _run(request: dict[str, Any], out: Path) -> int:
    name = request["name"]
    if request.get("modules"):
        target = out / f"{name}{MODULES_SUFFIX}"
        if target.exists():
            return 0
        names = call_in_child(_names, request["factory"], dict(request.get("kwargs", {})),
                              origin=request["factory"], what="building it")
        atomic_write(target, json.dumps(names) + "\n", force=True)
        return 1
    mlir = out / f"{name}.mlir"
    if mlir.exists() and mlir.with_suffix(".json").exists():
        return 0
    from tracing.module_cli import _trace_in_child

    plan_file = None
    if request.get("plan") is None:
        plan = load_plan(None, shorthand="dp", mesh="1x1")
    else:
        plan_file = out / f"{name}.plan.toml"
        plan_file.write_text(request["plan"])
        plan = load_plan(str(plan_file), shorthand=None, mesh=None)
    inputs = [parse_input(text) for text in request["inputs"]]
    call_in_child(_trace_in_child, request["factory"], dict(request.get("kwargs", {})), inputs, plan,
                  None if plan_file is None else str(plan_file), "infer", request["dtype"], "stablehlo",
                  mlir, True, origin=name, what="tracing it")
    return 1


def _names(factory: str, kwargs: dict[str, Any]) -> dict[str, list[str]]:
    """The model's module and parameter names (built on ``meta``, in the child)."""
    from tracing.module_tracer import build_model

    model = build_model(factory, kwargs, "float32")
    return {"modules": [n for n, _ in model.named_modules() if n],
            "parameters": [n for n, _ in model.named_parameters()]}


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()  # the search that started it ends: so does this (and its traces)
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) != 1:
        print("Error: usage: python -m tracing.module_batch REQUESTS.json", file=sys.stderr)
        return 2
    try:
        requests = json.loads(Path(arguments[0]).read_text())
        if not isinstance(requests, list) or not all(isinstance(r, dict) and "name" in r and "out" in r
                                                      for r in requests):
            raise ValueError("expected a list of requests with name and out")
    except (OSError, ValueError) as error:
        print(f"Error: {arguments[0]}: {error}", file=sys.stderr)
        return 2
    try:
        trace_requests(requests)
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
