"""No parallelism: the stage on one device (the baseline every strategy is compared with)."""

from __future__ import annotations

from tracing.strategies.base import Strategy, register


@register
class NoParallelism(Strategy):
    name = "none"
    summary = "one device, nothing split (baseline); needs --mesh 1x1"
