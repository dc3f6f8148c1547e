"""The options of a traced training step (``trace-stage --mode train``), torch-free.

``--zero`` (where the parameters, gradients and optimizer states live: ``tracing.training``)
and ``--recompute``; the plan search names its training calibrations' dumps by them too.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo_trace.errors import UsageError

__all__ = ["RECOMPUTE", "ZERO_STAGES", "TrainOptions", "TrainingError"]

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "full")


class TrainingError(UsageError):
    """Training options that cannot be traced."""


@dataclass(frozen=True)
class TrainOptions:
    zero: int = 0
    recompute: str = "none"

    def validate(self) -> None:
        if self.zero not in ZERO_STAGES:
            raise TrainingError(f"--zero {self.zero}: expected one of 0, 1, 2, 3")
        if self.recompute not in RECOMPUTE:
            raise TrainingError(f"--recompute {self.recompute}: expected none or full")

    def label(self) -> str:
        """Suffix of the dump name: ``train``, ``train_zero2``, ``train_zero3_recompute``."""
        return ("train" + (f"_zero{self.zero}" if self.zero else "")
                + ("_recompute" if self.recompute == "full" else ""))

    def to_dict(self) -> dict:
        return {"zero": self.zero, "recompute": self.recompute}
