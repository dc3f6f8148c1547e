"""``trace-stage --check``: run a stage through XLA (sharded, executed) and eagerly on the CPU
with the same weights and inputs, and compare the outputs.

Meant for small configs (``--config tiny``): it executes, so every tensor holds values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from models.opensora.inputs import make_inputs
from plans.config import PipelineConfig
from tracing import capture
from tracing.stages import boundary_shapes, run_stage, stage_spec

log = logging.getLogger(__name__)

#: Largest |xla - eager| allowed, relative to the largest |eager| of that output.  bf16 keeps
#: 8 bits of mantissa (2^-8 = 0.4%); the sharded program sums in a different order.
RELATIVE_TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2, "float32": 1e-4}

#: ``--check --mode train`` compares parameter updates where the gradient is above this share of
#: the parameter's largest gradient (far above fp32 rounding, so its sign is the same both ways).
SETTLED_GRADIENT = 1e-3


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
              seed: int = 0, reorder_weights: bool = True, train=None) -> CheckReport:
    """Compare the traced stage with the eager OpenSora-ordered reference.  The traced model
    gets the reference's weights in its strategy's fused-row order; ``reorder_weights=False``
    copies them unchanged (the negative control: the check must then fail).  With ``train``
    (``tracing.training.TrainOptions``) one training step runs both ways instead and the loss
    (or handed-on outputs), the gradients and the parameter updates are compared."""
    if train is not None:
        return _run_train_check(config, stage_index, train, progress, seed, reorder_weights)
    stage = stage_spec(config, stage_index)
    shapes = boundary_shapes(config, None)
    session = capture.prepare_process(config.submesh(stage_index).size)
    try:
        capture.enable_spmd()
        import torch
        import torch_xla

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


def _run_train_check(config: PipelineConfig, stage_index: int, train, progress, seed: int,
                     reorder_weights: bool) -> CheckReport:
    """One training step through XLA (sharded, executed) and eagerly on the CPU.  Errors:
    ``loss`` (or each handed-on output), ``grads`` (the largest over the parameters of
    max |xla - eager| / max |eager| of its gradient), ``exp_avg`` (the same for the first
    moments) and ``params``: the updated parameters, max |xla - eager| / max |eager| where the
    gradient is above ``SETTLED_GRADIENT`` of its largest. At step 1
    AdamW moves each weight by lr * g / (|g| + eps), +-lr whatever |g|: for a gradient at the
    rounding noise its sign, and so the update, is a coin toss in either program."""
    stage = stage_spec(config, stage_index)
    shapes = boundary_shapes(config, None)
    session = capture.prepare_process(config.submesh(stage_index).size)
    try:
        capture.enable_spmd()
        import torch
        import torch_xla

        from models.opensora.stdit3 import STDiT3
        from tracing.stages import stage_parameters
        from tracing.training import (
            GRAD,
            OUTPUT,
            PARAM,
            adamw_update,
            diffusion_loss,
            trace_train_step,
        )

        dtype = getattr(torch, config.dtype)
        torch.manual_seed(seed)
        reference = STDiT3(config.model).to(dtype)
        generator = torch.Generator().manual_seed(seed + 1)
        boundary = shapes[stage_index]
        if stage.has_embeddings:
            inputs = make_inputs(config.model, config.shape, batch=config.batch, dtype=dtype,
                                 seed=seed)
        else:
            inputs = {name: _random_input(spec, generator, dtype)
                      for name, spec in boundary["inputs"].items()}
        if stage.has_final_layer:
            out_shape = boundary["outputs"]["out"]["shape"]
            extra = {"noise": torch.randn([out_shape[0], config.model.in_channels,
                                           *out_shape[2:]], generator=generator).to(dtype)}
        else:
            extra = {f"grad_{name}": torch.randn(spec["shape"], generator=generator).to(dtype)
                     for name, spec in boundary["outputs"].items() if spec["dtype"] != "bool"}

        # The traced step first: the autograd engine sizes its per-device queues at its first
        # backward, and an eager (CPU) one before leaves none for the XLA device.
        step = trace_train_step(config, stage_index, shapes, train, materialize="values",
                                reference=reference, reference_inputs=inputs | extra,
                                progress=progress, reorder_weights=reorder_weights)
        progress("execute")
        torch_xla.sync()

        progress("eager")
        eager_inputs = {name: t.clone().requires_grad_(t.dtype.is_floating_point
                                                        and not stage.has_embeddings)
                        for name, t in inputs.items()}
        outputs = run_stage(reference, stage, eager_inputs, config)
        expected: dict[str, torch.Tensor] = {}
        if stage.has_final_layer:
            loss = diffusion_loss(outputs["out"], extra["noise"])
            loss.backward()
            expected["loss"] = loss.detach()
        else:
            names = [name for name in outputs if f"grad_{name}" in extra]
            torch.autograd.backward([outputs[n] for n in names],
                                    [extra[f"grad_{n}"] for n in names])
            expected |= {name: outputs[name].detach() for name in names}
        params = stage_parameters(reference, stage)
        strategy = step.traced.strategy
        report = CheckReport(strategy=config.strategy, stage=stage_index,
                             tolerance=RELATIVE_TOLERANCE[config.dtype])
        grad_errors, moment_errors, update_errors = [], [], []
        for buffer, tensor in step.outputs:
            if buffer.klass == OUTPUT and buffer.name in expected:
                report.errors[buffer.name] = _relative(tensor, expected[buffer.name])
                continue
            name = buffer.name.removesuffix(".grad").removesuffix(".exp_avg")
            if name not in params:
                continue  # the master copy and exp_avg_sq: functions of the above
            param = params[name]
            zeros = torch.zeros(param.shape)
            master, exp_avg, _ = adamw_update(param.detach().float(), param.grad, zeros, zeros)
            if buffer.klass == GRAD:
                want = strategy.reference_parameter(name, param.grad.detach())
                grad_errors.append(_relative(tensor, want))
            elif buffer.name.endswith(".exp_avg"):
                moment_errors.append(_relative(tensor, strategy.reference_parameter(name, exp_avg)))
            elif buffer.klass == PARAM:
                want = strategy.reference_parameter(name, master)
                grad = strategy.reference_parameter(name, param.grad.detach()).abs()
                settled = grad > SETTLED_GRADIENT * grad.max()
                if settled.any():
                    error = (tensor.cpu().float() - want).abs()[settled].max()
                    update_errors.append(float(error / want.abs().max().clamp_min(1e-12)))
        report.errors["grads"] = max(grad_errors)
        report.errors["exp_avg"] = max(moment_errors)
        report.errors["params"] = max(update_errors)
        return report
    finally:
        capture.release(session)


def _relative(got, want) -> float:
    """max |got - want| / max |want| (got may live on the XLA device)."""
    got, want = got.cpu().float(), want.float()
    scale = want.abs().max().clamp_min(1e-12)
    return float((got - want).abs().max() / scale)


def _random_input(spec: dict, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:  # noqa: F821
    """A random stage input of the recorded shape: the temporal mask (bool) all set, as plain
    text-to-video passes it; any other input normal in ``dtype``."""
    import torch

    if spec["dtype"] == "bool":
        return torch.ones(spec["shape"], dtype=torch.bool)
    return torch.randn(spec["shape"], generator=generator).to(dtype)
