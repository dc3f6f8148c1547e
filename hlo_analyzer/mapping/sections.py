"""Typed sections that ``analyze-hlo --hw`` adds to a Report (computed in
``hlo_analyzer.mapping.apply``, rendered and held by the Report as
``hlo_analyzer.mapping.render.HardwareSections``)."""

from __future__ import annotations

from dataclasses import dataclass

from hardware import BlockMapping
from hardware.systems import ResolvedSystem
from hlo_analyzer.mapping.results import KernelClass, MappingOptions, ProgramMapping
from models.opensora.block_ops import BlockShapes


@dataclass(frozen=True)
class BlockLabels:
    """The labelled GEMMs (label -> walk positions) of one spatial or temporal block."""

    index: int
    kind: str
    ops: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class BlocksSection:
    """The STDiT3 segmentation: the first pair's shape dictionary and every block's GEMMs."""

    shapes: BlockShapes
    pairs: int
    consistent: bool
    blocks: tuple[BlockLabels, ...]


@dataclass(frozen=True)
class TransformerSection:
    """The blocks of a generic transformer (``hlo_analyzer.transformer_blocks``): each block's
    labelled GEMMs (``BlockLabels.kind``: the block's kind in words) and its shapes per device."""

    blocks: tuple[BlockLabels, ...]
    shapes: tuple[tuple[tuple[str, int], ...], ...]
    consistent: bool


@dataclass(frozen=True)
class PairGroup:
    """The kernels charged to one block pair (``pair`` None: outside the pairs, the embeddings
    before them and the final layer after them).

    A pair is charged from its input on the residual stream to its output, with its own adaLN
    modulation wherever the dump lists it (``hlo_analyzer.pairs``)."""

    pair: int | None
    latency_s: float
    seconds_by_kind: tuple[tuple[str, float], ...]
    kernels: int


@dataclass(frozen=True)
class MappingTotals:
    """One step of the program on one device, and the whole inference.

    ``inference = steps * (outside the pairs + pairs_total * mean pair latency)``; without a
    segmentation ``pairs_total`` is None and ``inference = steps * step``. ``basis`` says which
    total that is (:data:`TOTAL_BASES`): an STDiT3 stage is totalled over a diffusion inference
    unless told otherwise, any other program over one run unless ``--steps`` asks for more.
    """

    step_latency_s: float
    seconds_by_kind: tuple[tuple[str, float], ...]
    gemm_utilization: float
    steps: int
    pairs_found: int | None
    pairs_total: int | None
    inference_latency_s: float
    inference_comm_s: float
    basis: str

    @property
    def inference_compute_s(self) -> float:
        return self.inference_latency_s - self.inference_comm_s

    @property
    def total_text(self) -> str:
        """What the total is, in words (the report's line and JSON ``totals.total``)."""
        pairs = f"{self.pairs_total} pairs x " if self.pairs_total else ""
        if self.basis == "diffusion":
            return (f"diffusion inference, {pairs}{self.steps} sampling steps (the STDiT3 default; "
                    "--steps to change)")
        if self.basis == "one-run":
            return "one run of the program (not an STDiT3 stage; --steps N totals N runs)"
        if self.pairs_total:
            return f"diffusion inference, {pairs}{self.steps} sampling steps (--steps {self.steps})"
        return f"{self.steps} run{'s' if self.steps > 1 else ''} of the program (--steps {self.steps})"


@dataclass(frozen=True)
class KernelGroup:
    """The kernels of one name, kind and shapes (a transformer's blocks repeat each): how many,
    and their time in one step."""

    name: str
    kind: str
    shapes: str
    kernels: int
    seconds: float
    bound: str  # the first kernel's: compute, dram, network ...


#: ``MappingTotals.basis``: "diffusion" (an STDiT3 stage, the default sampling steps),
#: "one-run" (not an STDiT3 stage, --steps not given), "steps" (the steps asked for).
TOTAL_BASES = ("diffusion", "one-run", "steps")


@dataclass(frozen=True)
class MappingSection:
    """Every kernel of the dump on a system, grouped by pair when the dump is an STDiT3 stage.

    ``pair_of`` gives each kernel's pair (same order as ``program.ops``). ``reference`` is one pair
    rebuilt from the ideal shape dictionary (``hardware.build_stdit_block_ops``): a labelled
    comparison, not the source of any total."""

    hardware: str
    system: ResolvedSystem
    options: MappingOptions
    program: ProgramMapping
    pair_of: tuple[int | None, ...]
    pairs: tuple[PairGroup, ...]
    totals: MappingTotals
    reference: BlockMapping | None
    classes: tuple[KernelClass, ...] = ()  # the kernels by class, with first-principles bounds
    #: Each kernel's block (STDiT3: spatial 2k, temporal 2k+1; a generic transformer: its
    #: block), None outside the blocks; and the kernels grouped so (``PairGroup.pair``: the
    #: block). Empty when the dump has no blocks.
    block_of: tuple[int | None, ...] = ()
    blocks: tuple[PairGroup, ...] = ()

    def heaviest(self, count: int) -> tuple[KernelGroup, ...]:
        """The ``count`` kernel groups (same name, kind and shapes) that take the most time in one
        step, the most first (ties by first position)."""
        groups: dict[tuple[str, str, str], KernelGroup] = {}
        for op in self.program.ops:
            key = (op.name, op.kind, op.shapes)
            known = groups.get(key)
            groups[key] = KernelGroup(*key, 1, op.latency_s, op.bound) if known is None else \
                KernelGroup(*key, known.kernels + 1, known.seconds + op.latency_s, known.bound)
        return tuple(sorted(groups.values(), key=lambda g: -g.seconds)[:count])

