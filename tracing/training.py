"""One training step of a stage as one traced program (``trace-stage --mode train``).

The step: the stage's forward (recorded for autograd), then

* last stage: the diffusion training loss, the mean squared error between the predicted noise
  (the first ``in_channels`` of the model's output; the learned-sigma half and its variational
  term are left out) and the sampled noise, a stage input ``noise``; ``loss.backward()``;
* inner stage: the gradient of each stage output arrives as a stage input (``grad_x``,
  ``grad_y``, ...), as in pipeline training; ``torch.autograd.backward(outputs, grads)``; a
  stage after the first also returns the gradients of its own inputs (``input_grad_x`` ...)
  for the stage before;

then AdamW (one step, bias-corrected, decoupled weight decay) on every stage parameter. For a
bf16 (or fp16) model the optimizer keeps an fp32 master copy and fp32 moments: per parameter
2 B weight + 2 B gradient + 12 B optimizer state (master 4, exp_avg 4, exp_avg_sq 4), the
``2 + 2 + 12`` of the ZeRO paper and the notes' ``OS = 6P``; for an fp32 model the weight is
the master: 4 + 4 + 8 (``OS = 2P``). The program returns the updated parameters, master
weights and moments and the gradients (PyTorch keeps ``.grad`` after ``step()``), so each
persistent buffer is a program argument and an output of the dump.

Where the buffers live (``--zero``; the *data axes* of a parameter are the mesh axes its
strategy spec does not use, i.e. the axes over which it is replicated and its gradient summed):

=====  ==========================  ===========================  ============================
zero   parameters                  gradients (outputs)          optimizer states
=====  ==========================  ===========================  ============================
0      strategy spec               strategy spec: all-reduce    strategy spec
1      strategy spec               strategy spec: all-reduce    sharded over the data axes
2      strategy spec               sharded: reduce-scatter      sharded over the data axes
3      sharded over the data axes  sharded: reduce-scatter      sharded over the data axes
=====  ==========================  ===========================  ============================

ZeRO-1 as PyTorch's ``ZeroRedundancyOptimizer`` runs it: gradients all-reduced in full (each
device keeps the full ``.grad``), each device updates its shard of the master weights, the
updated parameters are all-gathered (DeepSpeed's ZeRO-1 sends a reduce-scatter instead of the
all-reduce; a fused SPMD program cannot keep an unreduced gradient). ZeRO-2 keeps only the
gradient shard: reduce-scatter, local update, all-gather of the parameters. ZeRO-3 (FSDP) keeps
the parameters sharded: each is all-gathered before its use in the forward and, through a
saved-tensor hook that stores the shard instead of the gathered weight, all-gathered again
where the backward needs it; the gradients are reduce-scattered; nothing is gathered after the
update. A sharded buffer is split on its first dimension that the data-axes size divides (a
parameter with no such dimension stays replicated).

Phases in the dump: the forward and the loss are traced inside the IR scope
``FORWARD_SCOPE`` and the optimizer inside ``OPTIMIZER_SCOPE``: with ``XLA_HLO_DEBUG`` torch-xla
prefixes the ``op_name`` of each op (and of the collectives GSPMD inserts for it) with the
scope, which becomes the op's MLIR location. The autograd engine runs the backward on its own
thread, outside both scopes. ``hlo_analyzer.training`` reads the phases back.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plans.config import PipelineConfig
from plans.train_options import TrainOptions

if TYPE_CHECKING:
    import torch

MODES = ("infer", "train")

#: IR scopes of the forward (with the loss) and of the optimizer; the backward has none.
FORWARD_SCOPE = "hlo_trace_forward"
OPTIMIZER_SCOPE = "hlo_trace_optimizer"

#: AdamW hyperparameters of the traced step. They are constants of the program: its shapes,
#: ops and collectives do not depend on them. OpenSora v1.2 trains with lr 1e-4, Adam betas
#: (0.9, 0.999) and no weight decay; a non-zero decay keeps its multiply in the program.
LEARNING_RATE = 1e-4
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.01
STEP = 1  # the first step: bias corrections 1 - beta^1

#: Buffer classes of the sidecar's ``training.arguments`` / ``training.outputs``.
PARAM, GRAD, OPTIMIZER_STATE, INPUT, OUTPUT = "param", "grad", "optimizer_state", "input", "output"


def optimizer_bytes_per_parameter(dtype: str) -> dict[str, int]:
    """Bytes per parameter of each persistent buffer: weight, gradient, optimizer state."""
    width = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    master = 0 if dtype == "float32" else 4
    return {PARAM: width, GRAD: width, OPTIMIZER_STATE: master + 8}


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------

Spec = tuple


def spec_axes(spec: Spec | None) -> set[str]:
    """Mesh axes that a partition spec uses."""
    used: set[str] = set()
    for entry in spec or ():
        if isinstance(entry, tuple):
            used.update(entry)
        elif entry is not None:
            used.add(entry)
    return used


def local_shape(shape: tuple[int, ...], spec: Spec | None,
                axis_sizes: dict[str, int]) -> tuple[int, ...]:
    """The per-device shape of a tensor of ``shape`` laid out as ``spec``."""
    if spec is None:
        return tuple(shape)
    local = []
    for size, entry in zip(shape, spec):
        axes = entry if isinstance(entry, tuple) else (entry,) if entry is not None else ()
        local.append(size // math.prod(axis_sizes[axis] for axis in axes))
    return tuple(local)


def zero_spec(shape: tuple[int, ...], spec: Spec | None,
              axis_sizes: dict[str, int]) -> Spec | None:
    """``spec`` with the data axes (the mesh axes it leaves free) added on the first free
    dimension they divide; ``spec`` unchanged when there are none or nothing divides."""
    data_axes = tuple(axis for axis in axis_sizes if axis not in spec_axes(spec))
    parts = math.prod(axis_sizes[axis] for axis in data_axes)
    if not data_axes or parts == 1:
        return spec
    base = tuple(spec) if spec is not None else (None,) * len(shape)
    for dim, size in enumerate(shape):
        if base[dim] is None and size % parts == 0:
            entry = data_axes[0] if len(data_axes) == 1 else data_axes
            return base[:dim] + (entry,) + base[dim + 1:]
    return spec


@dataclass(frozen=True)
class BufferLayouts:
    """Specs of one parameter's persistent buffers under a ZeRO stage."""

    param: Spec | None
    grad: Spec | None
    state: Spec | None
    compute: Spec | None  # the strategy's own spec: where ZeRO-3 gathers the weight to


def buffer_layouts(shape: tuple[int, ...], strategy_spec: Spec | None, zero: int,
                   axis_sizes: dict[str, int]) -> BufferLayouts:
    sharded = zero_spec(shape, strategy_spec, axis_sizes)
    return BufferLayouts(param=sharded if zero >= 3 else strategy_spec,
                         grad=sharded if zero >= 2 else strategy_spec,
                         state=sharded if zero >= 1 else strategy_spec,
                         compute=strategy_spec)


# ---------------------------------------------------------------------------------------------
# The optimizer (pure torch: the traced step and the eager reference of --check run it)
# ---------------------------------------------------------------------------------------------


def adamw_update(master: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                 exp_avg_sq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step in fp32: (new master, new exp_avg, new exp_avg_sq)."""
    beta1, beta2 = BETAS
    g = grad.float()
    new_avg = exp_avg * beta1 + g * (1 - beta1)
    new_sq = exp_avg_sq * beta2 + g * g * (1 - beta2)
    avg_hat = new_avg / (1 - beta1 ** STEP)
    sq_hat = new_sq / (1 - beta2 ** STEP)
    new_master = master - (avg_hat / (sq_hat.sqrt() + ADAM_EPS) + master * WEIGHT_DECAY) \
        * LEARNING_RATE
    return new_master, new_avg, new_sq


def diffusion_loss(out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """MSE between the predicted noise (the first ``noise.shape[1]`` output channels) and the
    sampled noise, in fp32."""
    predicted = out[:, :noise.shape[1]]
    return ((predicted.float() - noise.float()) ** 2).mean()


# ---------------------------------------------------------------------------------------------
# The traced step
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Buffer:
    """A program argument or output: its name, class, global shape, dtype and spec."""

    name: str
    klass: str
    shape: tuple[int, ...]
    dtype: str
    spec: Spec | None

    def to_dict(self, axis_sizes: dict[str, int]) -> dict:
        return {"name": self.name, "class": self.klass, "shape": list(self.shape),
                "dtype": self.dtype, "local_shape": list(local_shape(self.shape, self.spec,
                                                                        axis_sizes)),
                "spec": _spec_json(self.spec)}


def _spec_json(spec: Spec | None) -> list | None:
    if spec is None:
        return None
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


@dataclass
class TrainStep:
    """The traced step: the stage, its program arguments and outputs (in the output order)."""

    traced: Any  # tracing.tracer.TracedStage
    options: TrainOptions
    axis_sizes: dict[str, int]
    arguments: list[Buffer] = field(default_factory=list)
    outputs: list[tuple[Buffer, Any]] = field(default_factory=list)  # (buffer, tensor)

    def output_tensors(self) -> list:
        return [tensor for _, tensor in self.outputs]

    def sidecar(self, dtype: str) -> dict:
        return {"mode": "train", **self.options.to_dict(),
                "bytes_per_parameter": optimizer_bytes_per_parameter(dtype),
                "optimizer": {"name": "AdamW", "lr": LEARNING_RATE, "betas": list(BETAS),
                              "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY, "step": STEP},
                "loss": "mse(predicted noise, sampled noise)",
                "scopes": {"forward": FORWARD_SCOPE, "optimizer": OPTIMIZER_SCOPE},
                "mesh_axes": dict(self.axis_sizes),
                "arguments": [b.to_dict(self.axis_sizes) for b in self.arguments],
                "outputs": [b.to_dict(self.axis_sizes) for b, _ in self.outputs]}


@contextlib.contextmanager
def ir_scope(name: str):
    """Ops traced inside carry ``name`` as the prefix of their op_name (needs XLA_HLO_DEBUG)."""
    import torch_xla

    pusher = torch_xla._XLAC.profiler.scope_pusher(name)
    try:
        yield
    finally:
        del pusher


def mesh_axis_sizes(mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.mesh_shape))


def trace_train_step(config: PipelineConfig, stage_index: int, stage_shapes: list[dict],
                     options: TrainOptions, *, materialize: str = "placeholder",
                     reference=None, reference_inputs: dict | None = None,
                     progress: Callable[[str], None] = lambda step: None,
                     reorder_weights: bool = True) -> TrainStep:
    """Trace one training step of the stage lazily; see the module docstring.

    ``reference_inputs`` (with ``materialize="values"``) also holds the values of the extra
    inputs: ``noise`` (last stage) or ``grad_<output>`` (inner stages)."""
    import torch
    import torch_xla

    from tracing.capture import is_stored_data
    from tracing.stages import stage_parameters
    from tracing.strategies import get_strategy
    from tracing.tracer import (
        device_tensor,
        drop_lazy_values,
        laid_out_as,
        lay_out_placeholders,
        make_layout,
        prepare_stage,
        run_forward,
    )

    options.validate()
    strategy = get_strategy(config.strategy, make_layout(config, stage_index, training=True))
    axis_sizes = mesh_axis_sizes(strategy.make_mesh())
    layouts: dict[str, BufferLayouts] = {}

    def parameter_spec(name: str, shape: tuple[int, ...], spec: Spec | None) -> Spec | None:
        layouts[name] = buffer_layouts(shape, spec, options.zero, axis_sizes)
        return layouts[name].param

    traced = prepare_stage(config, stage_index, stage_shapes, materialize=materialize,
                           reference=reference, reference_inputs=reference_inputs,
                           progress=progress, requires_grad=True, parameter_spec=parameter_spec,
                           reorder_weights=reorder_weights)
    mesh, stage, model = traced.mesh, traced.stage, traced.model
    device = torch_xla.device()
    dtype = getattr(torch, config.dtype)
    step = TrainStep(traced=traced, options=options, axis_sizes=axis_sizes)
    boundary = stage_shapes[stage_index]

    params = stage_parameters(model, stage)  # (the other stages' stay on the meta device)
    for name, p in params.items():
        step.arguments.append(Buffer(name, PARAM, tuple(p.shape), config.dtype,
                                     layouts[name].param))
    for name in stage.input_names():
        spec = traced.strategy.input_spec(laid_out_as(name),
                                          tuple(boundary["inputs"][name]["shape"]))
        step.arguments.append(Buffer(name, INPUT, tuple(boundary["inputs"][name]["shape"]),
                                     boundary["inputs"][name]["dtype"], spec))
    input_grads = {}
    if not stage.has_embeddings:  # gradients for the stage before
        for name, tensor in traced.inputs.items():
            if tensor.dtype.is_floating_point:
                tensor.requires_grad_(True)
                input_grads[name] = tensor

    # The extra inputs of the backward: the sampled noise, or the gradients of the outputs.
    if stage.has_final_layer:
        out_shape = tuple(boundary["outputs"]["out"]["shape"])
        noise_shape = (out_shape[0], config.model.in_channels) + out_shape[2:]
        extra_specs = {"noise": (noise_shape, traced.strategy.output_spec("out", out_shape),
                                 config.dtype)}
    else:
        extra_specs = {f"grad_{name}": (tuple(spec["shape"]),
                                        traced.strategy.output_spec(laid_out_as(name),
                                                                    tuple(spec["shape"])),
                                        spec["dtype"])
                       for name, spec in boundary["outputs"].items() if spec["dtype"] != "bool"}
    # Compile only: no buffers, as the stage's own inputs (a split gradient held real shards:
    # the hidden states of the micro-batch, 19 GB for the full model at 123_1920_360 and a
    # micro-batch of 84); placeholders keeping their spec, laid out after their first use, in
    # the backward. Not with recompute: torch-xla's checkpoint puts the output gradients through
    # an optimization barrier, which would take the placeholder's graph parameter before it is
    # laid out (replicated, then sliced: another program).
    buffers = materialize == "values" or options.recompute == "full"
    extra = {}
    for name, (shape, spec, extra_dtype) in extra_specs.items():
        source = reference_inputs.get(name) if reference_inputs is not None else None
        extra[name] = device_tensor(shape, getattr(torch, extra_dtype), spec, mesh, device,
                                     source, buffer=buffers)
        step.arguments.append(Buffer(name, INPUT, shape, extra_dtype, spec))
    split_extra = [] if buffers else [extra[name] for name, (_, spec, _) in extra_specs.items()
                                      if spec is not None]
    if split_extra:
        drop_lazy_values(device)  # nothing traced yet but these lazy empties

    if options.recompute == "full":
        _checkpoint_blocks(model, stage)
    with contextlib.ExitStack() as scopes:
        scopes.enter_context(ir_scope(FORWARD_SCOPE))
        gathered = _gather_sharded_parameters(model, params, layouts, mesh) \
            if options.zero >= 3 else {}
        if gathered:
            scopes.enter_context(
                torch.autograd.graph.saved_tensors_hooks(*_regather_hooks(gathered, mesh)))
        run_forward(traced, config, progress, requires_grad=True)
        loss = (diffusion_loss(traced.outputs["out"], extra["noise"])
                if stage.has_final_layer else None)
    # The backward, outside the forward scope (the saved-tensor hooks unpack there).
    progress("backward")
    if loss is not None:
        loss.backward()
    else:
        names = [name for name in traced.outputs if f"grad_{name}" in extra]  # floating ones
        torch.autograd.backward([traced.outputs[n] for n in names],
                                [extra[f"grad_{n}"] for n in names])
    lay_out_placeholders(split_extra)

    progress("optimizer")
    if loss is not None:
        step.outputs.append((Buffer("loss", OUTPUT, (), "float32", None), loss))
    else:
        for name, tensor in traced.outputs.items():  # the activations handed on
            spec = traced.strategy.output_spec(laid_out_as(name), tuple(tensor.shape))
            step.outputs.append((Buffer(name, OUTPUT, tuple(tensor.shape),
                                        str(tensor.dtype).removeprefix("torch."), spec), tensor))
    master_needed = config.dtype != "float32"
    reference_params = dict(reference.named_parameters()) if reference is not None else {}
    with torch.no_grad(), ir_scope(OPTIMIZER_SCOPE):
        for name, p in params.items():
            layout, shape = layouts[name], tuple(p.shape)
            grad = p.grad
            if grad is None:
                raise RuntimeError(f"parameter {name} got no gradient")
            if layout.grad != layout.compute:
                # Sum the gradient where the backward made it, then keep a shard: an all-reduce
                # whose users keep 1/n each, i.e. a reduce-scatter (comm.py). Marking the
                # shard alone lets GSPMD shard the weight-gradient GEMM instead, moving
                # activations (all-to-alls) to do it.
                _mark(grad, mesh, layout.compute)
                grad = grad.clone()
            _mark(grad, mesh, layout.grad)
            states = {}
            for state_name in (("master",) if master_needed else ()) + ("exp_avg", "exp_avg_sq"):
                source = None
                if materialize == "values":
                    source = (_reference_value(traced.strategy, name, reference_params,
                                               reorder_weights).float()
                              if state_name == "master" else torch.zeros(shape))
                states[state_name] = device_tensor(shape, torch.float32, layout.state, mesh,
                                                    device, source)
                step.arguments.append(Buffer(f"{name}.{state_name}", OPTIMIZER_STATE, shape,
                                             "float32", layout.state))
            master = states.get("master", p)
            new_master, new_avg, new_sq = adamw_update(master.float(), grad,
                                                       states["exp_avg"], states["exp_avg_sq"])
            for tensor in (new_master, new_avg, new_sq):
                _mark(tensor, mesh, layout.state)
            new_param = new_master.to(dtype)
            _mark(new_param, mesh, layout.param)
            step.outputs.append((Buffer(name, PARAM, shape, config.dtype, layout.param),
                                 new_param))
            if master_needed:
                step.outputs.append((Buffer(f"{name}.master", OPTIMIZER_STATE, shape, "float32",
                                            layout.state), new_master))
            step.outputs.append((Buffer(f"{name}.exp_avg", OPTIMIZER_STATE, shape, "float32",
                                        layout.state), new_avg))
            step.outputs.append((Buffer(f"{name}.exp_avg_sq", OPTIMIZER_STATE, shape, "float32",
                                        layout.state), new_sq))
            step.outputs.append((Buffer(f"{name}.grad", GRAD, shape, config.dtype, layout.grad),
                                 grad))
    for name, tensor in input_grads.items():
        grad = tensor.grad
        if grad is None or is_stored_data(grad):
            continue  # not differentiated through, or handed back unchanged (t, mid-pipeline)
        spec = traced.strategy.input_spec(laid_out_as(name), tuple(tensor.shape))
        _mark(grad, mesh, spec)
        step.outputs.append((Buffer(f"input_grad_{name}", OUTPUT, tuple(tensor.shape),
                                    str(tensor.dtype).removeprefix("torch."), spec), grad))
    # A value handed on unchanged (t through a middle stage, its gradient back) is stored data,
    # not something the program computes: XLA does not return it.
    step.outputs = [(buffer, tensor) for buffer, tensor in step.outputs
                    if not is_stored_data(tensor)]
    return step


def _mark(tensor, mesh, spec: Spec | None) -> None:
    """Pin ``tensor`` to ``spec`` (replicated when None)."""
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, spec if spec is not None else (None,) * tensor.dim())


def _gathered_copy(shard, mesh, spec: Spec | None):
    """A copy of a sharded parameter laid out as ``spec``: GSPMD all-gathers it. (A clone of
    device data is that data again, already annotated: the copy takes a custom annotation.)"""
    import torch_xla.distributed.spmd as xs

    full = shard.clone()
    xs.annotate_custom_sharding(full, mesh, spec if spec is not None else (None,) * full.dim())
    return full


def _reference_value(strategy, name: str, reference_params: dict, reorder: bool):
    source = reference_params[name].detach()
    return strategy.reference_parameter(name, source) if reorder else source


class _Regather:
    """What a saved-tensor hook stores instead of a gathered ZeRO-3 weight: its shard."""

    def __init__(self, shard, spec: Spec | None) -> None:
        self.shard, self.spec = shard, spec


def _gather_sharded_parameters(model, params: dict, layouts: dict, mesh) -> dict[int, _Regather]:
    """Replace each ZeRO-3-sharded parameter, as its module reads it, by an all-gathered copy
    (the strategy's own spec); returns id(copy) -> how to gather it again."""
    gathered: dict[int, _Regather] = {}
    for name, shard in params.items():
        layout = layouts[name]
        if layout.param == layout.compute:
            continue  # not sharded by ZeRO (nothing divides): used as it is
        full = _gathered_copy(shard, mesh, layout.compute)
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        del owner._parameters[leaf]
        setattr(owner, leaf, full)
        gathered[id(full)] = _Regather(shard, layout.compute)
    return gathered


def _regather_hooks(gathered: dict[int, _Regather], mesh):
    """Saved-tensor hooks: autograd keeps the shard of a gathered weight and gathers it again
    when the backward unpacks it (FSDP's re-gather), instead of keeping the full weight."""

    def pack(tensor):
        entry = gathered.get(id(tensor))
        return entry if entry is not None else tensor

    def unpack(saved):
        if isinstance(saved, _Regather):
            import torch_xla.core.xla_model as xm

            # Through an optimization barrier the backward's gather is an op of its own, which
            # XLA cannot merge with the forward's (the same gather of the same parameter).
            shard = saved.shard.detach().clone()
            xm.optimization_barrier_([shard])
            return _gathered_copy(shard, mesh, saved.spec)
        return saved

    return pack, unpack


def _checkpoint_blocks(model, stage) -> None:
    """Activation checkpointing per block: each block's forward runs again in the backward
    (torch-xla's checkpoint: an optimization barrier keeps XLA from merging the recomputation
    with the forward)."""
    import functools

    from torch_xla.utils.checkpoint import checkpoint

    for index in range(stage.first_block, stage.last_block + 1):
        for block in (model.spatial_blocks[index], model.temporal_blocks[index]):
            block.forward = functools.partial(checkpoint, block.forward)
