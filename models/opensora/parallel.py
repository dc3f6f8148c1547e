"""The parallel strategies of the study: one table of names, default meshes and collective kinds.

Every user reads this table: the tracer's strategy registry (``tracing.strategies``: one
registered class per name), the study (``scripts/sweep.py``: which meshes to trace on),
the tables (``scripts/study_tables.py``: which collective kinds a strategy's layout formula
covers) and the theory (``models.opensora.theory``).  No torch, no hardware model.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_trace.errors import UsageError

__all__ = ["STRATEGIES", "STRATEGY_NAMES", "StrategyInfo", "UnknownStrategyError", "default_mesh",
           "strategy_info"]


class UnknownStrategyError(UsageError):
    """A strategy name that is not in the table."""


@dataclass(frozen=True)
class StrategyInfo:
    """One strategy: its name (as ``trace-stage --strategy`` spells it), how it lays out a mesh
    of n devices, and the collective kinds its layout formula has per block pair."""

    name: str
    mesh_rule: str  # "one" (1x1), "all" (1 x n: both axes split together), "batch_x" (2 x n/2)
    kinds: tuple[str, ...]
    summary: str

    def mesh(self, devices: int) -> tuple[int, int]:
        """The study's mesh on ``devices``: the guidance batch B=2 can only be split in two, so
        the strategies that put it on x use 2 x n/2; megatron and dp split over all devices."""
        if self.mesh_rule == "one":
            return (1, 1)
        if self.mesh_rule == "all":
            return (1, devices)
        if devices % 2:
            raise UsageError(f"{self.name} on {devices} devices: expected an even count for its "
                             "2 x n/2 mesh (batch on x)")
        return (2, devices // 2)


STRATEGIES: dict[str, StrategyInfo] = {info.name: info for info in (
    StrategyInfo("none", "one", (), "one device, nothing split (baseline)"),
    StrategyInfo("megatron", "all", ("all_reduce",),
                 "1-D tensor parallel over all devices; 6 all-reduces per pair"),
    StrategyInfo("megatron_sp", "batch_x", ("all_gather", "reduce_scatter"),
                 "tensor parallel over y, residual stream split on tokens (batch on x)"),
    StrategyInfo("two_dimension", "batch_x", ("all_gather", "reduce_scatter", "all_reduce"),
                 "2-D tensor parallel: batch on x, hidden on y"),
    StrategyInfo("ds_ulysses", "batch_x", ("all_to_all",),
                 "sequence parallel on y, all-to-all to heads (batch on x)"),
    StrategyInfo("opensora_sp", "all", ("all_to_all",),
                 "OpenSora v1.2's sequence parallelism: S over all devices, all-to-all to heads "
                 "in the spatial blocks, temporal blocks local"),
    StrategyInfo("ring_attention", "batch_x", ("collective_permute", "all_gather"),
                 "sequence parallel on y, K/V ring (batch on x)"),
    StrategyInfo("usp", "batch_x", ("all_to_all", "collective_permute", "all_gather"),
                 "sequence parallel on y = ring x ulysses (batch on x)"),
    StrategyInfo("dp", "all", (), "data parallel: batch over all devices"),
)}
STRATEGY_NAMES = tuple(STRATEGIES)


def strategy_info(name: str) -> StrategyInfo:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UnknownStrategyError(
            f"unknown strategy {name!r}: expected one of {', '.join(STRATEGY_NAMES)}") from None


def default_mesh(name: str, devices: int) -> tuple[int, int]:
    """The study's (X, Y) mesh of strategy ``name`` on ``devices`` devices."""
    return strategy_info(name).mesh(devices)
