"""Trace one pipeline stage under a strategy and return its per-device partitioned HLO.

Steps (each reported through the ``progress`` callback): build the model on ``meta`` (no
memory), shard (materialise only this stage's parameters and inputs on the XLA device with the
strategy's partition specs, install its annotation hooks), trace lazily, compile without
executing.

Memory: a tensor that the strategy leaves replicated would be copied to each of the virtual
devices (16 x 2.2 GB for the full model's weights).  When we only compile, no tensor holds a
buffer: replicated ones are torch-xla *placeholders* (graph parameters with a shape and no
buffer), and split ones placeholders that keep their sharding spec (:func:`device_tensor`,
:func:`drop_lazy_values`, :func:`lay_out_placeholders`), where real shards would add up to one
copy of the weights (2.2 GiB).  With ``materialize="values"`` (the ``--check`` path) every
tensor holds values.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plans.config import PipelineConfig
from plans.feasibility import stage_layout
from tracing import capture
from tracing.stages import StageSpec, run_stage, stage_parameters, stage_spec
from tracing.strategies import Strategy, get_strategy

if TYPE_CHECKING:
    import torch

    from models.opensora.stdit3 import STDiT3

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass
class TracedStage:
    """The lazily traced stage: its model, its XLA output tensors and what it took."""

    stage: StageSpec
    strategy: Strategy
    model: STDiT3
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    seconds: dict[str, float] = field(default_factory=dict)
    mesh: Any = None  # the strategy's xs.Mesh
    #: The split tensors made without a buffer (compile only), as the model and the trace see
    #: them: their graph parameters get their layout from :func:`lay_out_placeholders`.
    split_placeholders: list[torch.Tensor] = field(default_factory=list)


#: Packages that torch-xla or torch import when they are installed and that a trace never uses:
#: torch-xla's ``mark_sharding`` imports torchax and JAX on its first call (1.5 s and 140 MiB on
#: the 2-core machine) only to ask whether the tensor is a torchax tensor, and torch's inductor,
#: which torch-xla imports, loads Triton (70 MiB of native library) for GPU kernels. Both treat
#: a package whose import fails as absent.
UNUSED_IMPORTS = ("jax", "torchax", "triton")


def block_unused_imports() -> None:
    """Make each of :data:`UNUSED_IMPORTS` that this process has not loaded fail to import here
    (a trace's own process: the conversion to MLIR, which needs jaxlib, not JAX, runs apart)."""
    for name in UNUSED_IMPORTS:
        sys.modules.setdefault(name, None)


#: The layout of a stage (model, shape, batch, submesh, usp degrees): one definition, in base.
make_layout = stage_layout


def trace_stage(config: PipelineConfig, stage_index: int, stage_shapes: list[dict], *,
                materialize: str = "placeholder", reference: STDiT3 | None = None,
                reference_inputs: dict[str, torch.Tensor] | None = None,
                progress: Progress = lambda step: None,
                stale_kv: dict[str, tuple[int, ...]] | None = None,
                reorder_weights: bool = True) -> TracedStage:
    """Build, shard and lazily run stage ``stage_index`` on the XLA device under ``no_grad``
    (:func:`prepare_stage` then :func:`run_forward`; see the first for the arguments)."""
    traced = prepare_stage(config, stage_index, stage_shapes, materialize=materialize,
                           reference=reference, reference_inputs=reference_inputs,
                           progress=progress, stale_kv=stale_kv, reorder_weights=reorder_weights)
    run_forward(traced, config, progress)
    return traced


def run_forward(traced: TracedStage, config: PipelineConfig,
                progress: Progress = lambda step: None, requires_grad: bool = False) -> None:
    """Run the prepared stage lazily (recorded for autograd when ``requires_grad``) and mark
    its outputs with the strategy's output specs; fills ``traced.outputs``."""
    import torch
    import torch_xla.distributed.spmd as xs

    progress("trace")
    started = time.perf_counter()
    with torch.set_grad_enabled(requires_grad):
        outputs = run_stage(traced.model, traced.stage, traced.inputs, config)
    for name, tensor in outputs.items():
        spec = traced.strategy.output_spec(laid_out_as(name), tuple(tensor.shape))
        if spec is not None:
            xs.mark_sharding(tensor, traced.mesh, spec)
    traced.outputs = outputs
    lay_out_placeholders(traced.split_placeholders)
    traced.seconds["trace"] = time.perf_counter() - started


def prepare_stage(config: PipelineConfig, stage_index: int, stage_shapes: list[dict], *,
                  materialize: str = "placeholder", reference: STDiT3 | None = None,
                  reference_inputs: dict[str, torch.Tensor] | None = None,
                  progress: Progress = lambda step: None,
                  stale_kv: dict[str, tuple[int, ...]] | None = None,
                  reorder_weights: bool = True, requires_grad: bool = False,
                  parameter_spec: Callable | None = None) -> TracedStage:
    """Build and shard stage ``stage_index`` on the XLA device (parameters and inputs placed
    with the strategy's specs, its annotation hooks installed), ready for :func:`run_forward`.

    ``materialize``: "placeholder" (compile only: no tensor holds data; this must run before
    anything else is traced in the process, see :func:`drop_lazy_values`) or "values" (copy
    parameters from ``reference`` and inputs from ``reference_inputs``, to execute).
    ``stale_kv``: PipeFusion stale K/V buffers (name -> shape, ``tracing.pipefusion``) for the
    spatial attentions of a stage traced on one patch; they become extra stage inputs.
    ``reorder_weights``: bring the reference's fused projection rows into the strategy's order
    (False only for the negative control of ``--check``, which must then fail).
    ``requires_grad``: the stage's parameters require gradients (``--mode train``).
    ``parameter_spec(name, shape, spec) -> spec``: overrides the strategy's spec of a parameter
    (ZeRO-3 shards the parameters over the mesh axes that replicate them).
    """
    import torch
    import torch_xla

    from models.opensora.stdit3 import STDiT3

    if materialize not in ("placeholder", "values"):
        raise ValueError(f"materialize={materialize!r}")
    if materialize == "values" and (reference is None or reference_inputs is None):
        raise ValueError("materialize='values' needs the reference model and inputs")
    seconds: dict[str, float] = {}
    stage = stage_spec(config, stage_index)
    dtype = getattr(torch, config.dtype)
    buffers = materialize == "values"
    split_placeholders = []

    progress("build")
    started = time.perf_counter()
    with torch.device("meta"):
        model = STDiT3(config.model).to(dtype)
    if config.self_attention_flash is not None:
        model.force_self_attention_flash(*config.self_attention_flash)
    strategy = get_strategy(config.strategy, make_layout(config, stage_index, requires_grad))
    seconds["build"] = time.perf_counter() - started

    progress("shard")
    started = time.perf_counter()
    mesh = strategy.make_mesh()
    device = torch_xla.device()
    reference_params = dict(reference.named_parameters()) if reference is not None else {}
    for name, param in stage_parameters(model, stage).items():
        spec = strategy.parameter_spec(name, tuple(param.shape))
        if parameter_spec is not None:
            spec = parameter_spec(name, tuple(param.shape), spec)
        source = reference_params.get(name)
        if source is not None and reorder_weights:
            source = strategy.reference_parameter(name, source.detach())
        tensor = device_tensor(tuple(param.shape), dtype, spec, mesh, device,
                                source.detach() if source is not None else None, buffer=buffers)
        parameter = _replace_parameter(model, name, tensor, requires_grad)
        if spec is not None and not buffers:
            split_placeholders.append(parameter)
    boundary = stage_shapes[stage_index]["inputs"]
    inputs = {}
    for name in stage.input_names():
        shape = tuple(boundary[name]["shape"])
        input_dtype = getattr(torch, boundary[name]["dtype"])
        source = reference_inputs.get(name) if reference_inputs is not None else None
        spec = strategy.input_spec(laid_out_as(name), shape)
        inputs[name] = device_tensor(shape, input_dtype, spec, mesh, device, source,
                                     buffer=buffers)
        if spec is not None and not buffers:
            split_placeholders.append(inputs[name])
    strategy.install(model, range(stage.first_block, stage.last_block + 1), mesh)
    if stale_kv:
        from tracing.pipefusion import install_stale_kv

        inputs.update(install_stale_kv(model, stage, stale_kv, lambda shape: device_tensor(
            shape, dtype, None, mesh, device, None)))
    if not buffers:
        drop_lazy_values(device)
    seconds["shard"] = time.perf_counter() - started

    return TracedStage(stage=stage, strategy=strategy, model=model, inputs=inputs, outputs={},
                       seconds=seconds, mesh=mesh, split_placeholders=split_placeholders)


def compile_stage(session: capture.CaptureSession, traced: TracedStage,
                  progress: Progress = lambda step: None) -> str:
    """Compile the traced stage without executing it; return the partitioned HLO text."""
    progress("compile")
    started = time.perf_counter()
    text = capture.capture_partitioned_hlo(session, list(traced.outputs.values()))
    traced.seconds["compile"] = time.perf_counter() - started
    return text


def device_tensor(shape: tuple[int, ...], dtype, spec, mesh, device, source, *,
                  buffer: bool = True):
    """A tensor on the XLA device: a placeholder when replicated and no values are needed.

    A split tensor (``spec``) without values holds real shards unless ``buffer`` is False
    (compile only): it is then a lazy ``empty`` marked with ``spec``, a computation that
    :func:`drop_lazy_values` turns into a placeholder keeping the spec.
    """
    import torch
    import torch_xla.distributed.spmd as xs

    if source is None and spec is None:
        from torch_xla.core.xla_builder import create_placeholder_tensor

        placeholder = create_placeholder_tensor(shape, dtype)
        # mark_sharding refuses a tensor without a buffer; the hooks look for this flag.
        placeholder.hlo_trace_placeholder = True
        return placeholder
    if source is None and not buffer:
        lazy = torch.empty(shape, dtype=dtype, device=device)  # a computation: no buffer yet
        xs.mark_sharding(lazy, mesh, spec)  # the tensor keeps the spec (and a custom annotation)
        return lazy
    host = source.to(dtype) if source is not None else torch.empty(shape, dtype=dtype)
    tensor = host.to(device)
    del host
    if spec is not None:
        xs.mark_sharding(tensor, mesh, spec)
    return tensor


def drop_lazy_values(device) -> None:
    """Turn every lazy value on ``device`` into a placeholder of its shape, with no buffer, that
    keeps the tensor's sharding spec (torch-xla's ``_clear_pending_irs``, which dynamo uses the
    same way): the split tensors :func:`device_tensor` made with ``buffer=False`` become graph
    parameters, their computation and annotation dropped.  It applies to every live tensor of
    the process, so it runs before anything is traced (one trace per process, see the CLI)."""
    import torch_xla

    torch_xla._XLAC._clear_pending_irs(str(device))


def lay_out_placeholders(tensors: list[torch.Tensor]) -> None:
    """Give the graph parameters of split placeholders their tensors' layout, once traced.

    A placeholder's graph parameter (its device-data node) is made at its first use in the
    trace, without the layout that the tensor keeps; reading the tensor's sharding spec copies
    it onto that node (torch-xla syncs a tensor's spec onto a node that has none), so the
    parameter is split as a sharded buffer's would be.  Made here instead, before the trace,
    the node would carry this file as its location in the dump.  A tensor not used yet is left
    alone (its node is made later, so call it again then); calling it twice changes nothing."""
    import torch_xla

    for tensor in tensors:
        torch_xla._XLAC._get_xla_op_sharding(tensor)


def _replace_parameter(model: STDiT3, name: str, tensor: torch.Tensor,
                       requires_grad: bool = False) -> torch.nn.Parameter:
    """Swap the (meta) parameter ``name`` for ``tensor`` without touching the module's code;
    returns the new parameter."""
    import torch

    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    parameter = torch.nn.Parameter(tensor, requires_grad=requires_grad)
    owner._parameters[leaf] = parameter
    return parameter


#: The official path's stage tensors (tracing.stages.STAGE_INPUTS_OFFICIAL) are laid out as the
#: strategies lay out their counterparts: t0 (B, h) as t, t0_mlp (B, 6h) as t_mlp, and the
#: temporal mask (B, T) as t (batch first, the rest whole).
_LAYOUT_OF = {"t0": "t", "t0_mlp": "t_mlp", "x_mask": "t"}


def laid_out_as(name: str) -> str:
    return _LAYOUT_OF.get(name, name)
