"""What a parallel strategy is, and the registry that maps names to strategies.

A strategy decides, for one stage on a mesh with axes ``("x", "y")``:

* the partition spec of every parameter (``parameter_spec``; None = replicated),
* the partition spec of every stage input (``input_spec``),
* the sharding of activations at the model's annotation points (``activation_spec``), and
  optionally a replacement attention kernel (``attention_fn``),
* the order of the video tokens in the hidden state x (``choose_token_order``: frame-major
  unless a strategy needs the other one, see :mod:`models.opensora.token_order`).  The stage
  runner (:func:`tracing.stages.run_stage`) asks for it through :func:`stage_token_order`, so the
  traced stage and the eager reference of ``--check`` read and write x in the same order.

Partition specs are tuples with one entry per tensor dimension, as ``xs.mark_sharding`` takes
them: a mesh axis name, a tuple of axis names (split over their product), or None.

To add a strategy, subclass :class:`Strategy` in a module of this package and decorate it with
:func:`register`; import the module in ``tracing/strategies/__init__.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from models.opensora.parallel import STRATEGIES as STRATEGY_TABLE
from models.opensora.token_order import TokenOrder
from plans.config import MESH_AXES, PipelineConfig
from plans.feasibility import Layout, check_layout, rule, stage_layout, token_order

if TYPE_CHECKING:
    import torch

    from models.opensora.stdit3 import STDiT3

log = logging.getLogger(__name__)

Spec = tuple  # tuple[str | tuple[str, ...] | None, ...]
ALL_DEVICES = ("x", "y")  # a 1-D strategy splits over the whole mesh, both axes together
#: The model's annotation point whose gradient alone is pinned (``select_grad``: the official
#: path's per-frame select). Its backward, left free, let GSPMD pick another layout in a stage of
#: several pairs than in a one-pair stage (usp 1x8 at 204_640_360: a 508 MB all-gather of the
#: hidden states' gradient between pairs, boolean masks of the hidden size exchanged), where a
#: sequence-parallel run selects on its own tokens; pinned as the residual stream ``x``.
GRADIENT_ONLY_POINT = "select_grad"

_REGISTRY: dict[str, type[Strategy]] = {}


@dataclass(frozen=True)
class Reshard:
    """Mark a tensor ``before`` and hand on a copy marked ``after``: pins where GSPMD changes the
    split (e.g. Ulysses' all-to-all right before the attention, not wherever it likes)."""

    before: Spec
    after: Spec


@dataclass(frozen=True)
class ReplicatedCopy:
    """Read a replicated tensor (a weight, a replicated stage input) through a copy laid out as
    ``spec`` (e.g. the rows of the local heads): the products that read it, the backward's
    included, are partitioned on that layout, and its gradient comes back replicated
    (``laid_out_copy``)."""

    spec: Spec


class Strategy:
    """Base strategy: everything replicated (subclasses override what they split)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: Row order of the fused qkv / kv projections the strategy traces (see
    #: ``models.opensora.stdit3.FUSED_LAYOUTS``): head-major, so that a contiguous split of the
    #: rows gives each device whole heads of q, k and v (OpenSora's own order would make GSPMD
    #: re-lay out the projection output).  The reference weights are reordered to match.
    fused_layout: ClassVar[str] = "head_major"
    #: Whether the blocks attend over the minor token factor on (B, major, minor, h) rather than
    #: (B*major, minor, h) (``STDiT3Block.batch_apart``): needed by a layout that splits the
    #: major factor but leaves part of the batch whole on each device, where B*major is no tile.
    batch_apart: ClassVar[bool] = False

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.token_order: TokenOrder = self.choose_token_order(layout)

    @classmethod
    def choose_token_order(cls, layout: Layout) -> TokenOrder:
        """Order of the T*S tokens of a sample in x on this layout (``plans.feasibility``).
        Never raises: a layout that no order fits is ``validate``'s to reject."""
        return token_order(cls.name, layout)

    # Checks ---------------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise StrategyError when the mesh does not fit the model (heads, batch, sequence):
        the strategy's rule in ``plans.feasibility``, which the plan search applies too."""
        check_layout(self.name, self.layout)

    # Shardings ------------------------------------------------------------------------------

    def parameter_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        """Partition spec of the parameter ``name`` (full model name); None: replicated."""
        block_param = block_parameter_name(name)
        if block_param is not None:
            return self.block_parameter_spec(block_param, shape)
        return None

    def block_parameter_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        """Spec of a block parameter, named relative to the block (e.g. ``attn.qkv.weight``)."""
        return None

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        """Partition spec of the stage input ``name`` (z, y, t, fps, x, t_mlp)."""
        return None

    def output_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        """Partition spec of the stage output ``name`` (x, y, t, t_mlp or out); None: unmarked."""
        return None

    def activation_spec(self, point: str, shape: tuple[int, ...],
                        temporal: bool) -> Spec | Reshard | None:
        """Spec to mark at an annotation point of a spatial or temporal block; None: no mark."""
        return None

    def attention_fn(self, mesh, temporal: bool) -> Callable | None:
        """A replacement self-attention kernel for this kind of block, or None to keep it."""
        return None

    def cross_attention_fn(self, mesh) -> Callable | None:
        """A replacement cross-attention kernel, or None to keep the model's."""
        return None

    # Installation ---------------------------------------------------------------------------

    def make_mesh(self):
        """The stage's device mesh over ids 0..n-1, row-major over (x, y)."""
        import numpy as np
        import torch_xla.distributed.spmd as xs

        x_devices, y_devices = self.layout.mesh_shape
        return xs.Mesh(np.arange(x_devices * y_devices), (x_devices, y_devices), MESH_AXES)

    def reference_parameter(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A parameter of the OpenSora-ordered reference model, in this strategy's fused-row
        order (``--check`` copies the reference weights through it)."""
        from models.opensora.stdit3 import FUSED_PROJECTIONS, fused_rows_to_head_major

        block_param = block_parameter_name(name)
        module = block_param.rpartition(".")[0] if block_param else None
        if self.fused_layout == "head_major" and module in FUSED_PROJECTIONS:
            return fused_rows_to_head_major(tensor, FUSED_PROJECTIONS[module],
                                            self.layout.model.num_heads)
        return tensor

    def install(self, model: STDiT3, block_indices: range, mesh) -> None:
        """Set the annotation hooks (and kernels) of the stage's blocks and of the final layer's
        input; never edits the model."""
        model.annotate = self._make_hook(mesh, temporal=False)
        for index in block_indices:
            for block in (model.spatial_blocks[index], model.temporal_blocks[index]):
                block.batch_apart = block.cross_attn.batch_apart = self.batch_apart
                hook = self._make_hook(mesh, block.temporal)
                for module in (block, block.attn, block.cross_attn, block.mlp,
                               block.cross_attn.kv_linear):
                    module.annotate = hook
                block.attn.fused_layout = block.cross_attn.fused_layout = self.fused_layout
                kernel = self.attention_fn(mesh, block.temporal)
                if kernel is not None:
                    block.attn.attention_fn = kernel
                cross_kernel = self.cross_attention_fn(mesh)
                if cross_kernel is not None:
                    block.cross_attn.attention_fn = cross_kernel

    def _pin_select_gradient(self, mesh, tensor: torch.Tensor, temporal: bool) -> torch.Tensor:
        """:data:`GRADIENT_ONLY_POINT`: in training, the gradient through ``tensor`` laid out
        as the residual stream's point ``x`` (a plain spec); the forward as it is."""
        spec = self.activation_spec("x", tuple(tensor.shape), temporal)
        if not tensor.requires_grad or not isinstance(spec, tuple):
            return tensor
        return pin_gradient(tensor, mesh, spec)

    def _make_hook(self, mesh, temporal: bool) -> Callable[[str, torch.Tensor], torch.Tensor]:
        import torch_xla.distributed.spmd as xs

        def annotate(point: str, tensor: torch.Tensor) -> torch.Tensor:
            if point == GRADIENT_ONLY_POINT:
                return self._pin_select_gradient(mesh, tensor, temporal)
            spec = self.activation_spec(point, tuple(tensor.shape), temporal)
            if isinstance(spec, ReplicatedCopy):
                return laid_out_copy(tensor, mesh, spec.spec)
            if (spec is not None and tensor.requires_grad
                    and not getattr(tensor, "hlo_trace_placeholder", False)):
                # Training: the gradient flowing back through this point gets the same
                # layout (pin_with_gradient), so the backward exchanges what the forward did.
                if isinstance(spec, Reshard):
                    return pin_with_gradient(tensor, mesh, spec.before, spec.after)
                return pin_with_gradient(tensor, mesh, spec, None)
            if isinstance(spec, Reshard):
                xs.mark_sharding(tensor, mesh, spec.before)
                tensor = tensor.clone()
                spec = spec.after
            if spec is not None and getattr(tensor, "hlo_trace_placeholder", False):
                # A stage input created without a buffer is a replicated graph parameter: a
                # replicated mark adds nothing, and a split one must come from input_spec.
                if any(axis is not None for axis in spec):
                    raise RuntimeError(f"strategy {self.name}: stage input at {point!r} must be "
                                       f"split {spec}; give it that spec in input_spec()")
                return tensor
            if spec is not None:
                # mark_sharding annotates the tensor's lazy IR in place; keep the plain tensor
                # (not the XLAShardedTensor wrapper it returns) flowing through the model.
                xs.mark_sharding(tensor, mesh, spec)
            return tensor

        return annotate


def pin_gradient(tensor: torch.Tensor, mesh, spec: Spec):
    """``tensor`` as it is, through an autograd function whose backward marks the incoming
    gradient ``spec`` (the forward's layout is left to GSPMD)."""
    return _pin_gradient_function()(tensor, mesh, spec)


_PIN_GRADIENT = None


def _pin_gradient_function():
    global _PIN_GRADIENT
    if _PIN_GRADIENT is None:
        import torch
        import torch_xla.distributed.spmd as xs

        from tracing.capture import is_stored_data

        class PinGradient(torch.autograd.Function):
            @staticmethod
            def forward(ctx, tensor, mesh, spec):
                ctx.mesh, ctx.spec = mesh, spec
                return tensor.view_as(tensor)

            @staticmethod
            def backward(ctx, grad):
                if not is_stored_data(grad):
                    xs.mark_sharding(grad, ctx.mesh, ctx.spec)
                return grad, None, None

        _PIN_GRADIENT = PinGradient.apply
    return _PIN_GRADIENT


def pin_with_gradient(tensor: torch.Tensor, mesh, before: Spec, after: Spec | None):
    """``tensor`` marked ``before`` (and a copy of it marked ``after`` for a reshard), through an
    autograd function whose backward marks the incoming gradient the same way in reverse:
    ``after`` (if any), then a copy marked ``before``. Gradients that are stored data (a stage's
    output gradient arriving as an input) keep their input spec."""
    return _pin_function()(tensor, mesh, before, after)


_PIN = None


def _pin_function():
    global _PIN
    if _PIN is None:
        import torch
        import torch_xla.distributed.spmd as xs

        from tracing.capture import is_stored_data

        def mark(t, mesh, spec):
            if not is_stored_data(t):
                xs.mark_sharding(t, mesh, spec)

        class Pin(torch.autograd.Function):
            @staticmethod
            def forward(ctx, tensor, mesh, before, after):
                ctx.mesh, ctx.before, ctx.after = mesh, before, after
                xs.mark_sharding(tensor, mesh, before)
                if after is None:
                    return tensor
                out = tensor.clone()
                xs.mark_sharding(out, mesh, after)
                return out

            @staticmethod
            def backward(ctx, grad):
                if ctx.after is not None:
                    mark(grad, ctx.mesh, ctx.after)
                    grad = grad.clone()
                mark(grad, ctx.mesh, ctx.before)
                return grad, None, None, None

        _PIN = Pin.apply
    return _PIN


def laid_out_copy(tensor: torch.Tensor, mesh, spec: Spec):
    """A copy of the replicated ``tensor`` laid out as ``spec``, through an autograd function
    whose backward pins the incoming gradient to ``spec`` and hands back a replicated copy.  The
    copy is first pinned replicated: a tensor without a buffer is a graph parameter whose layout
    GSPMD would otherwise take from its use."""
    return _replicated_copy_function()(tensor, mesh, spec)


_REPLICATED_COPY = None


def _replicated_copy_function():
    global _REPLICATED_COPY
    if _REPLICATED_COPY is None:
        import torch
        import torch_xla.distributed.spmd as xs

        def replicated(t):
            return (None,) * t.dim()

        class ReplicatedCopyFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, tensor, mesh, spec):
                ctx.mesh, ctx.spec = mesh, spec
                # A clone of device data is that data again: the copy takes custom annotations.
                copy = tensor.clone()
                xs.annotate_custom_sharding(copy, mesh, replicated(copy))
                xs.annotate_custom_sharding(copy, mesh, spec)
                return copy

            @staticmethod
            def backward(ctx, grad):
                xs.mark_sharding(grad, ctx.mesh, ctx.spec)
                grad = grad.clone()
                xs.mark_sharding(grad, ctx.mesh, replicated(grad))
                return grad, None, None

        _REPLICATED_COPY = ReplicatedCopyFn.apply
    return _REPLICATED_COPY


def block_parameter_name(name: str) -> str | None:
    """``spatial_blocks.3.attn.qkv.weight`` -> ``attn.qkv.weight``; None outside the blocks."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] in ("spatial_blocks", "temporal_blocks"):
        return ".".join(parts[2:])
    return None


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make a strategy available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name not in STRATEGY_TABLE:  # one table of strategies: models.opensora.parallel
        raise ValueError(f"strategy {cls.name!r} is not in models.opensora.parallel.STRATEGIES")
    rule(cls.name)  # its feasibility rule: plans.feasibility.RULES
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def strategy_names() -> list[str]:
    return sorted(_REGISTRY)


def strategy_class(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; a one-line error for an unknown name."""
    rule(name)  # the unknown name's error
    return _REGISTRY[name]


def get_strategy(name: str, layout: Layout) -> Strategy:
    """The strategy called ``name`` for ``layout``, validated; a one-line error otherwise."""
    strategy = strategy_class(name)(layout)
    strategy.validate()
    return strategy


def stage_token_order(config: PipelineConfig, stage_index: int) -> TokenOrder:
    """Token order in which stage ``stage_index`` of ``config`` runs its blocks (no validation)."""
    return token_order(config.strategy, stage_layout(config, stage_index))


# Helpers shared by the Megatron-like strategies ------------------------------------------------

#: nn.Linear stores weight as (out_features, in_features).
COLUMN_PARALLEL = ("attn.qkv", "cross_attn.q_linear", "cross_attn.kv_linear", "mlp.fc1")
ROW_PARALLEL = ("attn.proj", "cross_attn.proj", "mlp.fc2")


def linear_spec(name: str, axis) -> Spec | None:
    """Column-split (output features) or row-split (input features) spec of a block linear."""
    module, _, kind = name.rpartition(".")
    if module in COLUMN_PARALLEL:
        return (axis, None) if kind == "weight" else (axis,)
    if module in ROW_PARALLEL and kind == "weight":
        return (None, axis)
    return None  # row-parallel biases are added after the reduction: replicated
