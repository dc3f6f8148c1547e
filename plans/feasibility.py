"""Which plan can be traced: each strategy's feasibility rules on a stage's layout (no torch).

A strategy (``tracing/strategies``) splits a stage's tensors over the stage's mesh. Whether a
mesh fits the model, the shape and the batch (the heads, the batch, the tokens divisible by the
devices that split them), and in which order the video tokens lie in x (frame-major or
space-major, ``models.opensora.token_order``), are questions of numbers: the plan search asks
them of every plan without torch, and the tracer's strategies take their answers from here
(``Strategy.validate``, ``Strategy.choose_token_order``), so a plan the search keeps is one the
tracer accepts, refused with the same message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hlo_trace.errors import UsageError
from models.opensora.config import STDiT3Config
from models.opensora.inputs import Geometry, geometry
from models.opensora.theory import usp_degrees
from models.opensora.token_order import FRAME_MAJOR, SPACE_MAJOR, TokenOrder
from plans.config import PipelineConfig

__all__ = ["RULES", "Layout", "Rule", "StrategyError", "check_layout", "check_stage", "rule",
           "stage_layout", "token_order"]


class StrategyError(UsageError):
    """A strategy that cannot run on the given model, shape, batch or mesh."""


@dataclass(frozen=True)
class Layout:
    """The facts a strategy needs to decide shardings and to check that they divide."""

    model: STDiT3Config
    geometry: Geometry
    batch: int
    mesh_shape: tuple[int, int]
    ring_degree: int | None = None  # usp only: ring x Ulysses degrees over mesh axis y
    ulysses_degree: int | None = None
    #: Traced for a training step (forward, backward, optimizer): a strategy may lay out the
    #: forward differently where the backward makes another layout the cheaper one (dp).
    training: bool = False

    @property
    def num_devices(self) -> int:
        return self.mesh_shape[0] * self.mesh_shape[1]


def stage_layout(config: PipelineConfig, stage_index: int, training: bool = False) -> Layout:
    """The layout of stage ``stage_index``: the model, the shape and the stage's submesh
    (``training``: traced for a training step)."""
    return Layout(model=config.model, geometry=geometry(config.model, config.shape),
                  batch=config.batch, mesh_shape=config.submesh(stage_index).shape,
                  ring_degree=config.ring_degree, ulysses_degree=config.ulysses_degree,
                  training=training)


# -- the rules ---------------------------------------------------------------------------------


def _divisible(name: str, layout: Layout, what: str, size: int, parts: int, axis: str) -> None:
    if size % parts:
        raise StrategyError(
            f"strategy {name}: {what} = {size} is not divisible by the {parts} devices "
            f"of mesh {axis} (mesh {layout.mesh_shape[0]}x{layout.mesh_shape[1]})")


def _one_device(name: str, layout: Layout) -> None:
    if layout.num_devices != 1:
        x, y = layout.mesh_shape
        raise StrategyError(f"strategy {name} runs on one device: use --mesh 1x1, not {x}x{y}")


def _data_parallel(name: str, layout: Layout) -> None:
    _divisible(name, layout, "batch", layout.batch, layout.num_devices, "x*y")


def _sequence_split(name: str, layout: Layout) -> None:
    """Batch on x, and T or S (the token order's major factor) on y."""
    x_devices, y_devices = layout.mesh_shape
    _divisible(name, layout, "batch", layout.batch, x_devices, "axis x")
    T, S = layout.geometry.T, layout.geometry.S
    if T % y_devices and S % y_devices:
        raise StrategyError(
            f"strategy {name}: neither the temporal tokens T = {T} nor the spatial "
            f"tokens S = {S} are divisible by the {y_devices} devices of mesh axis y "
            f"(mesh {x_devices}x{y_devices}); the sequence split needs one of them")


def _ulysses(name: str, layout: Layout) -> None:
    _sequence_split(name, layout)
    _divisible(name, layout, "heads", layout.model.num_heads, layout.mesh_shape[1], "axis y")


def _ring(name: str, layout: Layout) -> None:
    _sequence_split(name, layout)
    captions = layout.batch * layout.model.model_max_length
    _divisible(name, layout, "caption tokens B*TOKEN", captions, layout.mesh_shape[1], "axis y")


def _unified(name: str, layout: Layout) -> None:
    _, ulysses = usp_degrees(layout.mesh_shape[1], layout.ring_degree, layout.ulysses_degree)
    _sequence_split(name, layout)
    _divisible(name, layout, "heads", layout.model.num_heads, ulysses,
               f"the Ulysses groups (ulysses degree {ulysses})")


def _tensor_parallel(name: str, layout: Layout) -> None:
    n = layout.num_devices
    _divisible(name, layout, "heads", layout.model.num_heads, n, "x*y")
    _divisible(name, layout, "mlp hidden", layout.model.mlp_hidden, n, "x*y")


def _tensor_sequence_parallel(name: str, layout: Layout) -> None:
    _sequence_split(name, layout)
    y_devices = layout.mesh_shape[1]
    _divisible(name, layout, "heads", layout.model.num_heads, y_devices, "axis y")
    _divisible(name, layout, "mlp hidden", layout.model.mlp_hidden, y_devices, "axis y")


def _spatial_split(name: str, layout: Layout) -> None:
    x_devices, y_devices = layout.mesh_shape
    _divisible(name, layout, "batch", layout.batch, x_devices, "axis x")
    _divisible(name, layout, "spatial tokens S", layout.geometry.S, y_devices, "axis y")
    _divisible(name, layout, "heads", layout.model.num_heads, y_devices, "axis y")


def _two_dimension(name: str, layout: Layout) -> None:
    x_devices, y_devices = layout.mesh_shape
    _divisible(name, layout, "batch", layout.batch, x_devices, "axis x")
    _divisible(name, layout, "heads", layout.model.num_heads, y_devices, "axis y")
    _divisible(name, layout, "hidden", layout.model.hidden_size, y_devices, "axis y")


def _frame_major(layout: Layout) -> TokenOrder:
    return FRAME_MAJOR


def _split_major(layout: Layout) -> TokenOrder:
    """Split T (frame-major) when axis y divides it, else S (space-major) when y divides that;
    frame-major when neither, which the strategy's check rejects."""
    y_devices = layout.mesh_shape[1]
    if layout.geometry.T % y_devices and not layout.geometry.S % y_devices:
        return SPACE_MAJOR
    return FRAME_MAJOR


def _space_major(layout: Layout) -> TokenOrder:
    return SPACE_MAJOR  # OpenSora cuts S: each device holds every frame of its positions


@dataclass(frozen=True)
class Rule:
    """A strategy's feasibility: ``check(name, layout)`` raises StrategyError when the layout
    does not fit; ``token_order(layout)`` never raises (a layout no order fits is ``check``'s
    to reject)."""

    check: Callable[[str, Layout], None]
    token_order: Callable[[Layout], TokenOrder] = _frame_major


#: Each strategy of ``models.opensora.parallel.STRATEGIES`` by name.
RULES: dict[str, Rule] = {
    "none": Rule(_one_device),
    "dp": Rule(_data_parallel),
    "ds_ulysses": Rule(_ulysses, _split_major),
    "ring_attention": Rule(_ring, _split_major),
    "usp": Rule(_unified, _split_major),
    "megatron": Rule(_tensor_parallel),
    "megatron_sp": Rule(_tensor_sequence_parallel, _split_major),
    "opensora_sp": Rule(_spatial_split, _space_major),
    "two_dimension": Rule(_two_dimension),
}


def rule(name: str) -> Rule:
    """The rule of the strategy ``name``; a one-line error for an unknown name."""
    try:
        return RULES[name]
    except KeyError:
        raise StrategyError(
            f"unknown strategy {name!r}: expected one of {', '.join(sorted(RULES))}") from None


def check_layout(name: str, layout: Layout) -> None:
    """Raise StrategyError when strategy ``name`` cannot trace ``layout``."""
    rule(name).check(name, layout)


def token_order(name: str, layout: Layout) -> TokenOrder:
    """The order of the T*S tokens of a sample in x under strategy ``name`` on ``layout``."""
    return rule(name).token_order(layout)


def check_stage(config: PipelineConfig, stage_index: int, training: bool = False) -> None:
    """The tracer's strategy checks of stage ``stage_index`` of ``config`` (StrategyError)."""
    check_layout(config.strategy, stage_layout(config, stage_index, training))
