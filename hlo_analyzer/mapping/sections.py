"""Typed sections that ``analyze-hlo --hw`` adds to a Report (computed in
``hlo_analyzer.mapping.apply``, rendered and held by the Report as
``hlo_analyzer.mapping.render.HardwareSections``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hardware import BlockMapping
from hardware.systems import ResolvedSystem
from hlo_analyzer.mapping.results import KernelClass, MappingOptions, ProgramMapping
from hlo_trace.documents import dataclass_from_dict
from hlo_trace.errors import InputFileError
from models.opensora.block_ops import BlockShapes


@dataclass(frozen=True)
class BlockLabels:
    """The labelled GEMMs (label -> walk positions) of one spatial or temporal block."""

    index: int
    kind: str
    ops: tuple[tuple[str, tuple[int, ...]], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind,
                "ops": {label: list(positions) for label, positions in self.ops}}

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> BlockLabels:
        """The labels :meth:`to_dict` wrote, read back (``origin`` names them in errors)."""
        try:
            return cls(int(document["index"]), str(document["kind"]),
                       tuple((str(label), tuple(int(p) for p in positions))
                             for label, positions in document["ops"].items()))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise InputFileError(f"{origin}: not a block's labels ({error!r})") from None


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

    def to_dict(self) -> dict[str, Any]:
        """The mapping's JSON ``totals``: the fields, what the total is in words and the
        compute time."""
        return {
            "step_latency_s": self.step_latency_s,
            "seconds_by_kind": dict(self.seconds_by_kind),
            "gemm_utilization": self.gemm_utilization,
            "steps": self.steps,
            "total_basis": self.basis,
            "total": self.total_text,
            "pairs_found": self.pairs_found,
            "pairs_total": self.pairs_total,
            "inference_latency_s": self.inference_latency_s,
            "inference_comm_s": self.inference_comm_s,
            "inference_compute_s": self.inference_compute_s,
        }

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> MappingTotals:
        """The totals :meth:`to_dict` wrote, read back (``origin`` names them in errors)."""
        try:
            fields = {f.name: document[f.name] for f in dataclasses.fields(cls)
                      if f.name not in ("basis", "seconds_by_kind")}
            return cls(**fields, basis=str(document["total_basis"]),
                       seconds_by_kind=tuple(document["seconds_by_kind"].items()))
        except (KeyError, TypeError, AttributeError) as error:
            raise InputFileError(f"{origin}: not a mapping's totals ({error!r})") from None

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


@dataclass(frozen=True)
class KernelRecord:
    """One kernel of the mapping's JSON ``kernels``: its block pair and block (None outside
    them), name, kind, shapes, time and what bounds it, FLOPs, DRAM bytes and the walk positions
    of its ops."""

    position: int
    pair: int | None
    block: int | None
    name: str
    kind: str
    shapes: str
    latency_s: float
    utilization: float
    bound: str
    compute_s: float
    dram_s: float
    noc_s: float
    flops: int
    dram_bytes: int
    hlo_positions: tuple[int, ...]

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> KernelRecord:
        """A kernel record as ``hlo_analyzer.mapping.render.kernel_records`` writes it."""
        return dataclass_from_dict(cls, document, origin, "a kernel record", hlo_positions=tuple)


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

