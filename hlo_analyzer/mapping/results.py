"""What a mapping of a program onto a chip is: the options it runs under and the frozen results it
gives (one :class:`MappedOp` per kernel, the :class:`ProgramMapping` of a program, the kernels by
:class:`KernelClass`, and the :class:`KernelSource` that re-costs a kernel without the dump).

The kinds of mapped op (``KINDS``) are ``gemm``, ``vector``, ``flash_attention`` and
``collective``; under ``--exec torch`` a memory-bound kernel is also named after its class
(``layer_norm``, ``softmax``, ``gelu``, ...: ``hardware.MEMORY_KERNEL_CLASSES``). The execution
modes (``EXECUTION_MODES``) are described where they are built: ``fused`` in
``hlo_analyzer.mapping.fusion``, ``torch`` in ``hlo_analyzer.mapping.torch_kernels``, ``eager``
(one kernel per HLO op) in ``hlo_analyzer.mapping.program``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hardware import MEMORY_KERNEL_CLASSES, ChipSpec, Op
from hlo_analyzer.mapping.library_calls import CallRegion

EXECUTION_MODES = ("fused", "eager", "torch")
#: ``ProgramMapping.cross_attention`` of a program without a cross-attention.
NO_CROSS_ATTENTION = "none"
#: How a cross-attention over the flattened samples is charged (module docstring); the first is
#: the default, docs/hardware.md says why.
CROSS_ATTENTION_MODES = ("per-sample", "all")
GEMM_KIND, VECTOR_KIND, FLASH_KIND, NETWORK_KIND = "gemm", "vector", "flash_attention", "collective"
#: The kinds of mapped op, which are also the timeline's compute tracks.
KINDS = (GEMM_KIND, VECTOR_KIND, FLASH_KIND, NETWORK_KIND)
TORCH_KERNEL_CLASSES = frozenset(MEMORY_KERNEL_CLASSES)


@dataclass(frozen=True)
class MappingOptions:
    """How the program is executed and the cost-model parameters that are options, with defaults.

    ``execution``: ``fused`` or ``eager`` (module docstring). ``dram_efficiency``: the fraction of
    the DRAM bandwidth sustained (1.0 = the datasheet figure; docs/hardware-model.md).
    ``exp_ops``: vector operations charged per element of an ``exponential`` (1 = as cheap as an
    add; a vector unit without a hardware exp may need several). ``cross_attention``: one of
    ``CROSS_ATTENTION_MODES``; ``per-sample`` needs ``caption_tokens``, the caption (key) tokens of
    one sample (the tracer's sidecar has it as ``model_max_length``); without it the traced key
    length is charged and the mapping says so (``ProgramMapping.cross_attention``).
    """

    execution: str = "fused"
    dram_efficiency: float = 1.0
    exp_ops: int = 1
    cross_attention: str = CROSS_ATTENTION_MODES[0]
    caption_tokens: int | None = None
    library_calls: tuple[CallRegion, ...] = ()
    #: Math fidelity of every GEMM on a chip with a tiled model (``--fidelity``); None: each
    #: dtype's default (the vendor's out-of-box choice).
    fidelity: str | None = None
    #: Leave a GEMM's element-wise consumer that its epilogue takes or not by the sizes
    #: undecided (``KernelSource.pending``), for kernel documents rescaled to another shape:
    #: the mapping then charges such a GEMM without its consumer.
    defer_epilogues: bool = False

    def __post_init__(self) -> None:
        if self.execution not in EXECUTION_MODES:
            raise ValueError(f"execution must be one of {', '.join(EXECUTION_MODES)}, got {self.execution!r}")
        if not 0 < self.dram_efficiency <= 1:
            raise ValueError(f"dram_efficiency must be in (0, 1], got {self.dram_efficiency}")
        if self.exp_ops < 1:
            raise ValueError(f"exp_ops must be at least 1, got {self.exp_ops}")
        if self.cross_attention not in CROSS_ATTENTION_MODES:
            raise ValueError(f"cross_attention must be one of {', '.join(CROSS_ATTENTION_MODES)}, "
                             f"got {self.cross_attention!r}")
        if self.caption_tokens is not None and self.caption_tokens < 1:
            raise ValueError(f"caption_tokens must be at least 1, got {self.caption_tokens}")

    @property
    def per_sample_keys(self) -> int | None:
        """Keys per sample of a cross-attention when charged per sample, else None."""
        return self.caption_tokens if self.cross_attention == "per-sample" else None


DEFAULT_OPTIONS = MappingOptions()


def default_execution(chip: ChipSpec, library_calls: Sequence[CallRegion], *,
                      traced_pytorch: bool = False) -> str:
    """``torch`` for a traced PyTorch model (its sidecar lists its library calls, or it is
    ``trace-module``'s: ``traced_pytorch``) on a GPU (a chip with a kernel
    model: PyTorch runs eagerly there, as published measurements do); ``fused`` for anything
    else (a compiled graph: TX8, a JAX program)."""
    pytorch = bool(library_calls) or traced_pytorch
    return "torch" if chip.kernel_model is not None and pytorch else "fused"


@dataclass(frozen=True)
class MappedOp:
    """One kernel of the program on the chip (or one collective on the network)."""

    position: int                 # walk position where it runs (a fusion: its last member)
    positions: tuple[int, ...]    # every HLO op it charges (a fusion or an attention has several)
    name: str
    kind: str                     # one of KINDS
    shapes: str                   # e.g. "4x64x32->4x64x128"
    latency_s: float
    compute_s: float
    dram_s: float
    noc_s: float
    utilization: float
    bound: str
    flops: int
    dram_bytes: float = 0.0       # DRAM traffic the kernel's model charges


class PendingEpilogue(NamedTuple):
    """A GEMM's element-wise consumer whose fusion into the GEMM's epilogue depends on sizes
    (``hlo_analyzer.mapping.fusion.is_epilogue``), left undecided on the GEMM's kernel
    (``MappingOptions.defer_epilogues``): its name, its Op as a kernel of its own, the elements
    it writes and the elements of each side input it reads. A kernel document whose integers
    are rescaled to another shape decides it there (``kernel_list.sources_from_document``)."""

    name: str
    op: Op
    out_elements: int
    side_elements: tuple[int, ...]


class KernelSource(NamedTuple):
    """What one kernel is costed from, without the dump: its name, kind and shapes text as
    :class:`MappedOp` has them, the Op and its fused epilogue (both None for a collective,
    which keeps its collective instead: kind, group size, bytes, devices)."""

    name: str
    kind: str
    shapes: str
    op: Op | None
    epilogue: Op | None = None
    collective: tuple[str, int, int, tuple[int, ...] | None] | None = None
    per_sample: bool = False      # a cross-attention charged per sample (its Op is one sample's)
    #: a GEMM's consumer not yet fused or left alone (deferred mapping only; None: decided)
    pending: PendingEpilogue | None = None


@dataclass(frozen=True)
class KernelClass:
    """The kernels of one class in a program (``gemm``, ``flash_attention``, ``collective``; under
    ``--exec torch`` the memory-bound classes ``layer_norm``, ``softmax``, ``gelu``, ``elementwise``,
    ``copy``; else ``vector``) and their first-principles bound: each kernel's FLOPs at the chip's
    peak or its DRAM bytes at the datasheet bandwidth, whichever is longer (collectives: their
    own time). ``ratio`` is how much more the model charges than that bound."""

    name: str
    kernels: int
    seconds: float
    bound_seconds: float
    #: Where the chip description's constants for this class come from (``KernelModel.provenance``:
    #: a measurement's file, a public table or a transfer rule); '' on a chip without a kernel model.
    provenance: str = ""

    @property
    def ratio(self) -> float:
        return self.seconds / self.bound_seconds if self.bound_seconds > 0 else 1.0


@dataclass(frozen=True)
class ProgramMapping:
    """Every kernel of one program (one step on one device), in program order, and the totals."""

    chip: str
    execution: str
    ops: tuple[MappedOp, ...]
    distinct_mappings: int        # searches actually run (the rest came from the cache)
    #: The cross-attention mode applied: ``per-sample`` when it was asked for and the caption
    #: length is known, else ``all`` (``none``: the program has no cross-attention); and how
    #: many attention kernels were charged per sample.
    cross_attention: str = "all"
    per_sample_attentions: int = 0
    #: What each kernel of ``ops`` was costed from (same order), for a kernel list that is
    #: re-costed without the dump (``hlo_analyzer.mapping.kernel_list``); empty when not kept.
    sources: tuple[KernelSource, ...] = ()

    @property
    def latency_s(self) -> float:
        return sum(op.latency_s for op in self.ops)

    def seconds_by_kind(self) -> dict[str, float]:
        totals = dict.fromkeys(KINDS, 0.0)
        for op in self.ops:
            totals[op.kind] += op.latency_s
        return totals

    def matrix_flops(self) -> int:
        return sum(op.flops for op in self.ops if op.kind in (GEMM_KIND, FLASH_KIND))

    def kernel_classes(self, chip: ChipSpec) -> tuple[KernelClass, ...]:
        """The kernels by class (:class:`KernelClass`), the longest first."""
        totals: dict[str, list[float]] = {}
        for op in self.ops:
            name = kernel_class_of(op)
            if op.kind == NETWORK_KIND:
                bound = op.latency_s
            else:
                peak = chip.vector_flops_per_s if op.kind == VECTOR_KIND else chip.gemm_flops_per_s
                bound = max(op.flops / peak, op.dram_bytes / chip.dram_bandwidth_bytes_per_s)
            entry = totals.setdefault(name, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += op.latency_s
            entry[2] += bound
        model = chip.kernel_model
        tiled = chip.tiled_model

        def provenance(name: str) -> str:
            if model is not None:
                return model.provenance_of(_PROVENANCE_KEY.get(name, name))
            if tiled is not None and name == GEMM_KIND:
                return tiled.provenance_of("unpack_bytes_per_noc_byte")
            return ""

        classes = [KernelClass(name, int(n), seconds, bound, provenance(name)) for name, (n, seconds, bound) in totals.items()]
        return tuple(sorted(classes, key=lambda c: -c.seconds))


#: The provenance entry of a class that is named otherwise in the kernel model: a memory-bound
#: kernel of no class streams at ``hbm_efficiency``; a collective's time is the network's.
_PROVENANCE_KEY = {VECTOR_KIND: "hbm_efficiency", NETWORK_KIND: "network"}


def kernel_class_of(op: MappedOp) -> str:
    """The class of a kernel (:class:`KernelClass`): its kind, or for a memory-bound kernel of
    ``--exec torch`` the class it is named after (``layer_norm``, ``gelu(tanh_gelu)`` -> ``gelu``)."""
    if op.kind != VECTOR_KIND:
        return op.kind
    name = op.name.split("(", 1)[0]
    return name if name in TORCH_KERNEL_CLASSES else VECTOR_KIND
