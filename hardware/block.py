"""Map a block's op list onto a chip, and turn block latency into whole-inference totals.

Ops of a block run one after another on the whole chip (each op is spread over all tiles by its
mapper), so the block latency is the sum of the op latencies. Identical ops (the two
cross-attentions and MLPs of a STDiT3 block share shapes) are mapped once. A Vector op marked
``fuse_into`` a GEMM (the MLP's GELU) becomes that GEMM's fused epilogue when
``fuse_epilogues`` is on, and is mapped on its own otherwise.

Inference: ``compute = block_latency * blocks * steps``; ``comm = steps * per-step chip-to-chip
time`` where the per-step time is either given (sum of :func:`hardware.collectives.collective_time_s`
over the dump's collectives, which includes hop latencies) or
``comm_bytes_per_device / link bandwidth``; communication is not overlapped with compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hardware.collectives import collective_time_s
from hardware.flash_attention_mapper import flashatten_mapper
from hardware.gemm_mapper import GemmPreset, gemm_auto_opt_mapper
from hardware.kernel_mapping import Mapping
from hardware.ops import Op, OpType
from hardware.spec import ChipSpec, SystemSpec
from hardware.vector_mapper import vector_mapper

__all__ = ["DEFAULT_SAMPLING_STEPS", "BlockMapping", "InferenceTotals", "comm_latency_s", "inference_totals", "map_block", "map_op"]

#: OpenSora v1.2 samples with 30 rectified-flow steps by default.
DEFAULT_SAMPLING_STEPS = 30


@dataclass(frozen=True)
class BlockMapping:
    """Per-op mappings of one block, in op order, and their totals on one chip."""

    chip_name: str
    mappings: tuple[Mapping, ...]
    latency_s: float
    latency_s_by_type: dict[str, float]
    matrix_flops: int
    vector_flops: int
    gemm_utilization: float

    @property
    def time_share_by_type(self) -> dict[str, float]:
        """Fraction of the block latency spent in each op type (GEMM, Vector, FlashAttention)."""
        return {kind: t / self.latency_s for kind, t in self.latency_s_by_type.items()}


@dataclass(frozen=True)
class InferenceTotals:
    """Whole-inference latency: ``inference = block * blocks * steps + comm``."""

    block_latency_s: float
    blocks: int
    steps: int
    compute_latency_s: float
    comm_latency_s: float
    inference_latency_s: float


def _signature(op: Op, epilogue: Op | None) -> tuple:
    def one(o: Op | None) -> tuple | None:
        if o is None:
            return None
        return (o.op_type, o.input_shapes, o.weight_shape, o.output_shape, o.flops, o.vector_flops, o.bytes_per_element)

    return one(op), one(epilogue)


def map_op(
    op: Op,
    chip: ChipSpec,
    *,
    epilogue: Op | None = None,
    gemm_preset: GemmPreset | None = None,
    flash_tx_ty: tuple[int, int] | None = None,
    fuse_heads: bool = True,
) -> Mapping:
    """Send one op to the mapper of its type."""
    if op.op_type is OpType.GEMM:
        return gemm_auto_opt_mapper(op, chip, preset=gemm_preset, epilogue=epilogue)
    if op.op_type is OpType.FLASH_ATTENTION:
        return flashatten_mapper(op, chip, tx_ty=flash_tx_ty, fuse_heads=fuse_heads)
    return vector_mapper(op, chip)


def map_block(
    ops: Sequence[Op],
    chip: ChipSpec,
    *,
    fuse_epilogues: bool = True,
    gemm_preset: GemmPreset | None = None,
    flash_tx_ty: tuple[int, int] | None = None,
    fuse_heads: bool = True,
) -> BlockMapping:
    """Map every op of a block on ``chip`` and total them (see the module docstring)."""
    names = {op.name for op in ops}
    epilogues: dict[str, Op] = {}
    if fuse_epilogues:
        for op in ops:
            if op.fuse_into is not None and op.fuse_into in names:
                epilogues[op.fuse_into] = op
    fused_away = {op.name for op in epilogues.values()}
    cache: dict[tuple, Mapping] = {}
    mappings: list[Mapping] = []
    for op in ops:
        if op.name in fused_away:
            continue
        epilogue = epilogues.get(op.name)
        key = _signature(op, epilogue)
        if key not in cache:
            cache[key] = map_op(op, chip, epilogue=epilogue, gemm_preset=gemm_preset, flash_tx_ty=flash_tx_ty, fuse_heads=fuse_heads)
        name = f"{op.name}+{epilogue.name}" if epilogue is not None else op.name
        mappings.append(replace(cache[key], op_name=name))
    latency_s = sum(m.latency_s for m in mappings)
    by_type: dict[str, float] = {kind.value: 0.0 for kind in OpType}
    for mapping in mappings:
        by_type[mapping.op_type] += mapping.latency_s
    matrix_flops = sum(op.flops for op in ops if op.op_type is not OpType.VECTOR)
    vector_flops = sum(op.flops if op.op_type is OpType.VECTOR else op.vector_flops for op in ops)
    return BlockMapping(
        chip_name=chip.name,
        mappings=tuple(mappings),
        latency_s=latency_s,
        latency_s_by_type=by_type,
        matrix_flops=matrix_flops,
        vector_flops=vector_flops,
        gemm_utilization=matrix_flops / latency_s / chip.gemm_flops_per_s if latency_s > 0 else 0.0,
    )


def comm_latency_s(collectives: Iterable[tuple[str, int, float] | tuple[str, int, float, Sequence[int]]], system: SystemSpec) -> float:
    """Sum of :func:`collective_time_s` over ``(kind, group_size, message_bytes[, devices])`` tuples."""
    total = 0.0
    for entry in collectives:
        kind, group_size, message_bytes = entry[0], entry[1], entry[2]
        devices = entry[3] if len(entry) > 3 else None  # type: ignore[misc]
        total += collective_time_s(kind, group_size, message_bytes, system, devices=devices)
    return total


def inference_totals(
    block_mapping: BlockMapping,
    blocks: int,
    steps: int = DEFAULT_SAMPLING_STEPS,
    *,
    comm_bytes_per_device: float = 0.0,
    system: SystemSpec | None = None,
    comm_latency_s_per_step: float | None = None,
) -> InferenceTotals:
    """Totals for ``blocks`` blocks and ``steps`` sampling steps.

    Communication per step is ``comm_latency_s_per_step`` when given, else
    ``comm_bytes_per_device`` (bytes each device sends in one forward pass over these blocks, as
    counted by the ring formulas) over the system's chip-to-chip link bandwidth.
    """
    if blocks < 0 or steps < 0:
        raise ValueError(f"blocks and steps must not be negative, got {blocks}, {steps}")
    if comm_latency_s_per_step is not None:
        comm_per_step_s = comm_latency_s_per_step
    elif comm_bytes_per_device:
        if system is None:
            raise ValueError("comm_bytes_per_device needs a system (its chip-to-chip link bandwidth)")
        comm_per_step_s = comm_bytes_per_device / system.link_bandwidth_bytes_per_s
    else:
        comm_per_step_s = 0.0
    compute_s = block_mapping.latency_s * blocks * steps
    comm_s = comm_per_step_s * steps
    return InferenceTotals(
        block_latency_s=block_mapping.latency_s,
        blocks=blocks,
        steps=steps,
        compute_latency_s=compute_s,
        comm_latency_s=comm_s,
        inference_latency_s=compute_s + comm_s,
    )
