"""The published GEMM tables of Tenstorrent's chips, and the fit of the [tiled_model] constants
that no datasheet gives (used by scripts/calibrate_tiled.py and scripts/tiled_predictions.py).

Fit apart from validation: only n150 rows are fitted; p150 rows are predicted with n150's
constants and only compared.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hardware.spec import DATA_DIR, ChipSpec, TiledModel
from hardware.tiled_gemm import tiled_gemm

#: The vendor's table, transcribed (its source and commit are in the file's header).
PUBLISHED_GEMMS = DATA_DIR / "public" / "tt_gemm_oob.csv"
#: The table's dtype names and ours.
DTYPES = {"BFLOAT16": "bf16", "BFLOAT8_B": "bfp8", "BFLOAT4_B": "bfp4"}
#: The [tiled_model] constants the fit sets, in the order of a parameter vector: the unpack rate
#: of each dtype, then the scalar constants.
UNPACK_DTYPES = ("bf16", "bfp8", "bfp4")
SCALARS = ("tile_overhead_cycles", "partial_reload_cycles", "sender_read_efficiency", "dispatch_trace_s", "dispatch_s")
FITTED = tuple(f"unpack_bytes_per_noc_byte.{d}" for d in UNPACK_DTYPES) + SCALARS
#: Dtypes no table measures take a measured one's unpack rate: fp32 (absent from the tables) bf16's.
UNPACK_CARRIED = {"fp32": "bf16"}
#: Where the search starts and the bounds it keeps to (an unpack rate at its upper bound never
#: binds: the fidelity's cycles do).
START = (1.0, 1.0, 4.0, 5.0, 20.0, 0.3, 10e-6, 30e-6)
LOWER = (0.1, 0.1, 0.1, 0.0, 0.0, 0.01, 0.0, 0.0)
UPPER = (20.0, 20.0, 20.0, 100.0, 1000.0, 1.0, 100e-6, 200e-6)


@dataclass(frozen=True)
class PublishedGemm:
    """One row of the vendor's table."""

    card: str
    grid: str
    m: int
    k: int
    n: int
    trace: bool
    dtype: str
    fidelity: str
    seconds: float


def load_published_gemms(path: Path = PUBLISHED_GEMMS) -> list[PublishedGemm]:
    with path.open(encoding="utf-8") as handle:
        rows = csv.DictReader(line for line in handle if not line.startswith("#"))
        return [PublishedGemm(r["card"], r["grid"], int(r["M"]), int(r["K"]), int(r["N"]), r["trace"] == "True",
                              DTYPES[r["dtype"]], r["fidelity"], float(r["time_ns"]) * 1e-9) for r in rows]


def chip_for_grid(chip: ChipSpec, grid: str) -> ChipSpec:
    """``chip`` on the ``XxY`` compute grid (x columns, y rows) a table row names."""
    cols, rows = (int(v) for v in grid.split("x"))
    return dataclasses.replace(chip, tile_count=rows * cols, tile_grid_rows=rows, tile_grid_cols=cols)


def with_constants(chip: ChipSpec, values: Sequence[float]) -> ChipSpec:
    """``chip`` with the :data:`FITTED` constants of its [tiled_model] set to ``values``."""
    assert chip.tiled_model is not None
    measured = dict(zip(UNPACK_DTYPES, values[:len(UNPACK_DTYPES)], strict=True))
    rates = tuple(measured.items()) + tuple((d, measured[source]) for d, source in UNPACK_CARRIED.items())
    scalars = dict(zip(SCALARS, values[len(UNPACK_DTYPES):], strict=True))
    model: TiledModel = dataclasses.replace(chip.tiled_model, unpack_bytes_per_noc_byte=rates, **scalars)
    return dataclasses.replace(chip, tiled_model=model)


def predicted_seconds(chip: ChipSpec, row: PublishedGemm) -> float:
    return tiled_gemm(chip_for_grid(chip, row.grid), row.m, row.k, row.n, row.dtype,
                      fidelity=row.fidelity, trace=row.trace).seconds


def fit_loss(chip: ChipSpec, rows: Sequence[PublishedGemm]) -> Callable[[Sequence[float]], float]:
    def loss(values: Sequence[float]) -> float:
        fitted = with_constants(chip, values)
        return sum(math.log(predicted_seconds(fitted, r) / r.seconds) ** 2 for r in rows)
    return loss


def pattern_search(loss: Callable[[Sequence[float]], float], start: Sequence[float], lower: Sequence[float],
                   upper: Sequence[float], *, rounds: int = 60) -> list[float]:
    """Minimise ``loss`` by coordinate steps that shrink when no step helps (deterministic; each
    step scales a value by ``1 +- step``, or moves a zero-bounded value off zero)."""
    best = list(start)
    best_loss = loss(best)
    step = 0.5
    for _ in range(rounds):
        improved = False
        for i in range(len(best)):
            for direction in (1, -1):
                trial = list(best)
                base = best[i] if best[i] > 0 else (upper[i] - lower[i]) * 1e-3
                trial[i] = min(upper[i], max(lower[i], best[i] + direction * step * base))
                trial_loss = loss(trial)
                if trial_loss < best_loss:
                    best, best_loss, improved = trial, trial_loss, True
        if not improved:
            step /= 2
            if step < 1e-4:
                break
    return best


def fit_tiled(chip: ChipSpec, rows: Sequence[PublishedGemm]) -> list[float]:
    """The :data:`FITTED` constants that best predict ``rows`` (the fitting card's rows only)."""
    return pattern_search(fit_loss(chip, rows), START, LOWER, UPPER, rounds=200)


@dataclass(frozen=True)
class Agreement:
    """How far predictions land from the published times: over ``rows`` rows, the median and
    90th percentile of ``|predicted / published - 1|`` and the share within 20% and 25%."""

    rows: int
    median: float
    p90: float
    within_20: float
    within_25: float


def agreement(ratios: Sequence[float]) -> Agreement:
    errors = sorted(abs(r - 1) for r in ratios)
    p90 = errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)]
    return Agreement(len(errors), statistics.median(errors), p90,
                     sum(e <= 0.20 for e in errors) / len(errors), sum(e <= 0.25 for e in errors) / len(errors))
