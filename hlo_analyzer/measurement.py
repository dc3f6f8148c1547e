"""One program measured on no hardware: the measurement every analysis of a dump shares.

:func:`measure` walks the program once for its FLOPs and collectives
(:func:`hlo_analyzer.report.analyze`) with the memory (:class:`~hlo_analyzer.memory.MemoryVisitor`)
and, when the mapping needs it, the dataflow graph following the same walk; or it measures the
memory at the same time in a forked child that shares the parsed module (``parallel``: a large
dump on a machine with a second core). The report gets its typed memory section and, when the
sidecar describes a training step, its training section; trace-module's warning about the plan
it traced becomes a note. :func:`hlo_analyzer.mapping.analysis.analyze_dump` maps the result on
a hardware.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir

from hlo_analyzer.attention_memory import flash_memory
from hlo_analyzer.comm import CollectiveTime
from hlo_analyzer.dataflow import DataflowVisitor
from hlo_analyzer.memory import (
    InputSignature,
    MemorySection,
    MemoryUsage,
    MemoryVisitor,
    measure_memory,
    read_sidecar_inputs,
)
from hlo_analyzer.report import Report, analyze
from hlo_analyzer.sidecar import Sidecar
from hlo_analyzer.tensors import TypeTable
from hlo_analyzer.training import measure_training, read_training_layout
from hlo_trace.errors import UnsupportedIRError, UsageError
from hlo_trace.isolate import ChildTask, start_in_child

__all__ = ["PARALLEL_MIN_BYTES", "MeasureOptions", "Measurement", "as_usage_error", "measure",
           "run_in_parallel"]

log = logging.getLogger(__name__)

#: Dumps from this size up have their memory measured in a second process, beside the rest
#: of the analysis, when the machine has a second core: the liveness walk is a third of the
#: analysis, the fork ~5 ms (benchmarks/analyze_speed.py). ~10k ops of StableHLO text.
PARALLEL_MIN_BYTES = 1_000_000


@dataclass(frozen=True)
class MeasureOptions:
    """How to measure: ``collective_time`` a link model for the collectives' time (None: none),
    ``bruck`` and ``branch`` as ``analyze`` takes them, ``capacity_bytes`` the chip's memory the
    verdict compares with, ``parallel`` the memory in a forked child, ``dataflow`` the graph the
    mapping needs (with the ops' ``locations`` where ``--exec torch`` reads them),
    ``attention_memory`` ``written`` (the memory as the program is written) or ``fused`` (every
    attention's scores and softmax held in tiles: :mod:`hlo_analyzer.attention_memory`)."""

    collective_time: CollectiveTime | None = None
    bruck: bool = False
    branch: str | int = "max"
    capacity_bytes: float | None = None
    parallel: bool = False
    attention_memory: str = "written"
    dataflow: bool = False
    locations: bool = False


@dataclass(frozen=True)
class Measurement:
    """The report and, when asked for, the program's dataflow graph (``networkx.DiGraph``)."""

    report: Report
    graph: Any = None


def measure(module: ir.Module, name: str, sidecar: Sidecar | None,
            options: MeasureOptions = MeasureOptions()) -> Measurement:
    """FLOPs, collectives, memory and (a training step) the training section of ``module``
    (the dump ``name``; its ``sidecar``, if any); see the module docstring."""
    inputs = read_sidecar_inputs(sidecar)
    types = TypeTable()
    fused = options.attention_memory == "fused"
    task = (_start_memory(module, inputs, options.capacity_bytes, name)
            if options.parallel and not fused else None)
    memory = MemoryVisitor(inputs, types) if task is None and not fused else None
    dataflow = DataflowVisitor(types, locations=options.locations) if options.dataflow else None
    try:
        with as_usage_error(name, "cannot be measured"):
            report = analyze(module, collective_time=options.collective_time, bruck=options.bruck,
                             name=name, branch=options.branch, types=types,
                             followers=tuple(v for v in (memory, dataflow) if v is not None))
        if task is not None:
            usage = task.result()
        elif memory is not None:
            with as_usage_error(name, "memory cannot be measured"):
                usage = memory.result(options.capacity_bytes)
        else:
            with as_usage_error(name, "memory cannot be measured"):
                usage = flash_memory(module, inputs, capacity_bytes=options.capacity_bytes,
                                     graph=None if dataflow is None else dataflow.graph)
    finally:
        if task is not None:
            task.cancel()
    report.memory = MemorySection(usage, None if sidecar is None else str(sidecar.path),
                                  attention=options.attention_memory)
    if sidecar is not None:
        _add_sidecar_sections(report, module, sidecar, name)
    return Measurement(report, None if dataflow is None else dataflow.graph)


def _add_sidecar_sections(report: Report, module: ir.Module, sidecar: Sidecar, name: str) -> None:
    """trace-module's warning as a note; the training section of a training step."""
    redundancy = sidecar.section("redundancy")
    warning = redundancy.get("warning") if isinstance(redundancy, dict) else None
    if isinstance(warning, str) and warning:  # trace-module's, about the plan it traced
        report.notes = (*report.notes, f"trace-module warned: {warning}")
    layout = read_training_layout(sidecar)
    if layout is not None:
        with as_usage_error(name, "its training step cannot be split"):
            report.training = measure_training(module, layout, name)


def run_in_parallel(dump: str) -> bool:
    """Whether to measure ``dump``'s memory in a second process (``PARALLEL_MIN_BYTES``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        return cores >= 2 and os.path.getsize(dump) >= PARALLEL_MIN_BYTES
    except OSError:  # the loader says what is wrong with the file
        return False


def _start_memory(module: ir.Module, inputs: list[InputSignature] | None, capacity: float | None,
                  dump: str) -> ChildTask:
    """The memory of ``module`` measured in a forked child (it shares the parsed module)."""
    return start_in_child(_measure_memory, module, inputs, capacity, dump, origin=dump,
                          what="measuring its memory")


def _measure_memory(module: ir.Module, inputs: list[InputSignature] | None, capacity: float | None,
                    dump: str) -> MemoryUsage:
    with as_usage_error(dump, "memory cannot be measured"):
        try:
            return measure_memory(module, inputs, capacity_bytes=capacity)
        except UnsupportedIRError as exc:
            raise UnsupportedIRError(f"{dump}: {exc}") from None


@contextmanager
def as_usage_error(dump: str, what: str) -> Iterator[None]:
    """Numbers the input makes impossible (a zero group, an overflow, a shape no tiling fits,
    nesting beyond the interpreter's stack) are the input's fault: one line naming the dump.
    Other exceptions stay internal errors (bugs)."""
    try:
        yield
    except (ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
        reason = "out of memory" if isinstance(exc, MemoryError) else (
            "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
        first_line = (reason.strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{dump}: {what}: {first_line}") from None
