"""``trace-stage --check``: run a stage through XLA (sharded, executed) and eagerly on the CPU
with the same weights and inputs, and compare the outputs.

Meant for small configs (``--config tiny``): it executes, so every tensor holds values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tracing import capture
from tracing.config import PipelineConfig
from tracing.stages import boundary_shapes, run_stage, stage_spec

log = logging.getLogger(__name__)

#: Largest |xla - eager| allowed, relative to the largest |eager| of that output.  bf16 keeps
#: 8 bits of mantissa (2^-8 = 0.4%); the sharded program sums in a different order.
RELATIVE_TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2, "float32": 1e-4}


@dataclass
class CheckReport:
    strategy: str
    stage: int
    tolerance: float
    errors: dict[str, float] = field(default_factory=dict)  # output -> relative max error

    @property
    def passed(self) -> bool:
        return bool(self.errors) and all(err <= self.tolerance for err in self.errors.values())

    def summary(self) -> str:
        parts = ", ".join(f"{name} {err:.2e}" for name, err in self.errors.items())
        verdict = "PASS" if self.passed else "FAIL"
        return (f"check {verdict}: strategy {self.strategy}, stage {self.stage}: max |xla - eager| "
                f"/ max |eager| = {parts} (tolerance {self.tolerance:.0e})")


def run_check(config: PipelineConfig, stage_index: int, progress=lambda step: None,
              seed: int = 0, reorder_weights: bool = True) -> CheckReport:
    """Compare the traced stage with the eager OpenSora-ordered reference.  The traced model
    gets the reference's weights in its strategy's fused-row order; ``reorder_weights=False``
    copies them unchanged (the negative control: the check must then fail)."""
    stage = stage_spec(config, stage_index)
    shapes = boundary_shapes(config, None)
    session = capture.prepare_process(config.submesh(stage_index).size)
    try:
        capture.enable_spmd()
        import torch
        import torch_xla

        from models.opensora.inputs import make_inputs
        from models.opensora.stdit3 import STDiT3
        from tracing.tracer import trace_stage

        dtype = getattr(torch, config.dtype)
        torch.manual_seed(seed)
        reference = STDiT3(config.model).to(dtype).eval()
        if stage.has_embeddings:
            inputs = make_inputs(config.model, config.shape, batch=config.batch, dtype=dtype,
                                 seed=seed)
        else:
            generator = torch.Generator().manual_seed(seed)
            inputs = {name: _random_input(spec, generator, dtype)
                      for name, spec in shapes[stage_index]["inputs"].items()}
        progress("eager")
        with torch.no_grad():
            expected = run_stage(reference, stage, inputs, config)
        traced = trace_stage(config, stage_index, shapes, materialize="values",
                             reference=reference, reference_inputs=inputs, progress=progress,
                             reorder_weights=reorder_weights)
        progress("execute")
        torch_xla.sync()
        report = CheckReport(strategy=config.strategy, stage=stage_index,
                             tolerance=RELATIVE_TOLERANCE[config.dtype])
        for name, want in expected.items():
            got = traced.outputs[name].cpu().float()
            want = want.float()
            scale = want.abs().max().clamp_min(1e-6)
            report.errors[name] = float((got - want).abs().max() / scale)
        return report
    finally:
        capture.release(session)


def _random_input(spec: dict, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:  # noqa: F821
    """A random stage input of the recorded shape: the temporal mask (bool) all set, as plain
    text-to-video passes it; any other input normal in ``dtype``."""
    import torch

    if spec["dtype"] == "bool":
        return torch.ones(spec["shape"], dtype=torch.bool)
    return torch.randn(spec["shape"], generator=generator).to(dtype)
