"""How planning reaches the tracer: the one protocol between them.

Planning (the search, the estimates, sizing, the runner) needs no torch; the tracer
(``tracing/``) needs torch-xla, which fixes its device count per process. So planning never
imports the tracer: it starts it in a fresh process, with one of the requests below. Each is a
frozen dataclass whose ``command()`` is that process's command line; the tracer reads what it
is given through the plan vocabulary (``plans``), never through planning's code. No other file
of planning names a module of ``tracing`` (tests/test_layering.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["CalibrationServer", "CalibrationTrace", "CaseStageTrace", "ModuleTraces", "PipelineStageTrace",
           "TraceProcess"]


class TraceProcess(Protocol):
    """A trace that planning orders: the command line of the process that runs it."""

    def command(self) -> list[str]: ...


@dataclass(frozen=True)
class CalibrationTrace:
    """The calibration requests listed in ``listing`` (JSON, ``plans.calibration``), traced in
    one process (``python -m tracing.calibrate``: torch loaded once for all of them)."""

    listing: Path

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tracing.calibrate", str(self.listing)]


@dataclass(frozen=True)
class CalibrationServer:
    """``python -m tracing.calibrate --serve``: lines of requests on its stdin, traced in one
    process (torch loaded once for all of them), ``done`` on its stdout after each line."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tracing.calibrate", "--serve"]


@dataclass(frozen=True)
class CaseStageTrace:
    """Stage ``stage`` of a study case (``trace-stage --config ... --stage``), dumped into
    ``out``."""

    config: str
    shape: str
    strategy: str
    mesh: str
    stage_ids: str
    stage: int
    dialect: str
    out: str

    def command(self) -> list[str]:
        return _trace_stage("--config", self.config, "--shape", self.shape,
                            "--strategy", self.strategy, "--mesh", self.mesh,
                            "--stage-ids", self.stage_ids, "--stage", str(self.stage),
                            "--dialect", self.dialect, "-o", self.out)


@dataclass(frozen=True)
class PipelineStageTrace:
    """Stage ``stage`` of the pipeline file ``pipeline`` (``trace-stage --pipeline``), dumped
    into ``out``."""

    pipeline: str
    stage: int
    dialect: str
    out: str

    def command(self) -> list[str]:
        return _trace_stage("--pipeline", self.pipeline, "--stage", str(self.stage),
                            "--dialect", self.dialect, "-o", self.out)


def _trace_stage(*options: str) -> list[str]:
    """``trace-stage OPTIONS --force`` in a fresh process (its dump replaces a stale one)."""
    return [sys.executable, "-m", "tracing.cli", *options, "--force"]


@dataclass(frozen=True)
class ModuleTraces:
    """The ``trace-module`` requests listed in ``listing`` (JSON, ``tracing.module_batch``),
    traced in one process (torch loaded once for all of them)."""

    listing: Path

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tracing.module_batch", str(self.listing)]
