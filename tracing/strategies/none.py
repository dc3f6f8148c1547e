"""No parallelism: the stage on one device (the baseline every strategy is compared with)."""

from __future__ import annotations

from tracing.strategies.base import Strategy, StrategyError, register


@register
class NoParallelism(Strategy):
    name = "none"
    summary = "one device, nothing split (baseline); needs --mesh 1x1"

    def validate(self) -> None:
        if self.layout.num_devices != 1:
            x, y = self.layout.mesh_shape
            raise StrategyError(f"strategy none runs on one device: use --mesh 1x1, not {x}x{y}")
