"""A training plan's step time from the traced program's own kernels: the
training step of one block pair, traced at two small shapes, re-costed at the plan's shape.

The traced figure of a training plan (``plan-search --mode train``) is the training step of one
block pair of its stage (``trace-stage --mode train --stage-ids 0-0,1-1,2-{depth-1} --stage 1``,
:func:`pair_stage`:
the pair's forward, backward and AdamW update as one program, on the stage mesh, at the plan's
micro-batch, ZeRO stage and recompute; docs/training.md) analysed on the system as
``analyze-hlo --hw`` analyses it (``hlo_analyzer.mapping``, the chip's default execution). Its
kernels fall in two groups by when they run in a step of ``m`` micro-batches (gradient
accumulation, :func:`analyze_pair`):

* ``micro``, once per micro-batch: every kernel of the forward and the backward (recompute
  included) and every collective there but the gradient sums;
* ``update``, once per step: the optimizer's kernels and collectives (the ZeRO-1/2 gather of the
  updated parameters) and the collectives of the backward that sum a weight gradient (an
  all-reduce or reduce-scatter moving parameters or gradients by ``hlo_analyzer.training``'s
  traffic classes; a ZeRO-3 gather of a weight stays per micro-batch).

The ``micro`` group is cached as its two phases, ``forward`` (the forward scope's kernels and
collectives) and ``backward`` (the rest: the backward, a recomputed forward among it).

**Recompute as a function of the pair without it.** Full recompute
(``torch.utils.checkpoint`` around each block) runs the block's forward again inside the
backward, its activation collectives included, and changes nothing else that runs: so a
recompute plan's per-micro-batch kernels are the same pair's without recompute plus its
``forward`` group once more (:func:`step_groups`), and :class:`TrainKernels` calibrates a
recompute key with the traces of its twin without recompute (``derive``; one
calibration serves both, halving the keys). Checked on traces it was not built from
(``tests/test_train_generalise.py``, ``tests/test_train_check.py``): on the middle pair of the
3-pair tiny model the derived micro-batch is within :data:`RECOMPUTE_TOLERANCE` of the traced
recompute program, its compute 0.997 (ds_ulysses 2x2), 0.999 (usp 2x4, ring 2, ZeRO-1) and
0.999 (dp 1x4, ZeRO-2) on TX8's fused execution; on the full model at 204_640_360, 0.995 on
tx8-64 (ds_ulysses 4x8 and usp 4x8 ring 1 ZeRO-2, micro-batch 4) and 1.016, 1.016, 1.012 on
H100 (ds_ulysses 2x4, 8x4, 16x2 at micro-batch 4, 8, 16), the communication 0.995-1.000
(docs/plan_search.md, "recompute, derived"). What remains is work the traced rerun does not do
twice: XLA drops the rerun's ops whose results the backward does not read (the block's last
gated residual add, its per-frame selects), and torch-xla computes the tables it builds from
constants (the temporal RoPE's sines and cosines) once for the forward and the rerun.
PyTorch's eager rerun does both, so on a GPU the derivation is the closer of the two to what
runs. (Before the analyzer read each result of the checkpoint's optimization barrier as the
tensor it hands on, the dataflow joined the barrier's operands: every element-wise kernel of
the rerun read all of them, its cross-attention, query and keys from one value, was charged
over every sample's captions, its layer norms joined into one kernel; and with a kernel's
phase read off its last op's location, the forward's kernels that end in an unnamed cast were
the backward's, left out of the rerun: the derived compute was 0.97 on the tiny pairs,
0.90-0.91 on tx8-64 and 0.973-0.928 on H100, falling with the micro-batch.) Also left out: a
stage whose forward group holds more than the blocks (the loss and final layer of a last stage
are not recomputed; the traced pair of a model of 3 or more pairs is a middle stage and has
neither). Not under ZeRO-3: there the
traced recompute step is far cheaper than the derivation (dp on 1x4 of the 3-pair tiny model:
1.54 ms traced, 2.01 ms derived, +31%; the rerun forward and the backward share the weights'
gathers and their work), so a ZeRO-3 recompute key is traced as its own.

**The micro-batch as a third dimension.** The micro-batch ``B`` is a dimension as ``T`` and
``W`` are: every integer of the pair's program is ``c T^a W^b B^e``. So the two calibration
programs differ in the batch too: the first at ``(T0, W0)`` with ``b0`` (:func:`calibration_batch`:
``3 * 2^k``, the plan's power of two of ``B`` capped at the largest power of two of the stage's
chips, by the frames' argument of ``plan_estimate.calibration_shapes``: GSPMD reshards over the
batch where a mesh axis divides it, whichever axis splits it; a usp pair on 1x4 runs
all-to-alls at B = 8 where it runs all-gathers at B = 3), the second at ``(3 T0, 5 W0)`` with
:data:`BATCH_FACTOR` ``b0``; a ratio ``3^a 5^b 7^e`` names the three exponents and the value at
the plan is ``v0 (T/T0)^a (W/W0)^b (B/b0)^e`` (``_StepRescaler``). One calibration serves the
micro-batches of a strategy, mesh and ring that agree in their power of two up to the stage's
(8 and 4 on 4 chips; 8, 4 and 2 on 2). Not a micro-batch of 1: a batch dimension of 1 makes
another program (usp on 1x4 ring 2 at B = 1: 80 us of collectives per micro-batch and 1.07 ms
per step, where the one at B = 3 rescaled to 1 has 704 us and 0.53 ms: gradient sums move),
so B = 1 is calibrated at B = 1 in both programs (the batch kept), and so is every micro-batch
of usp and ring_attention (:data:`OWN_BATCH_STRATEGIES`: GSPMD lays their activation
collectives out otherwise at another batch; the full model's usp pairs derived from 12 and 84
had 1.9-2.9x the traced communication at 204_640_360 and 4, ring_attention's 3.2x). A batch that changes
OpenSora's choice of kernel (flash self-attention only for a sequence longer than its batch:
the full model's spatial attention at 123_1920_360 over 84 x 36 frames is none, at the plan's
204_640_360 over 4 x 60 it is one) would make the two programs differ: a calibration program
whose choice is not the plan's is traced with the plan's forced (``PairKey.flash``, as the
inference calibrations force it). Checked on traces it was not built from
(``tests/test_train_derive.py``: dp on 1x2 at B = 2 and 8, ds_ulysses 1x2 at 2 and 4, dp ZeRO-3
at 2 and 4, each traced at the plan's shape and micro-batch): within the estimate's 5% per group.

**ZeRO 1-3 as ZeRO-0 plus a measured difference.** A ZeRO stage changes where the optimizer
states, gradients (ZeRO-2) and weights (ZeRO-3) live: the optimizer's kernels and collectives,
the gradient sums, and under ZeRO-3 the weights' gathers, sizes of the parameters over the
data-parallel group, none of which depends on ``T``, ``W`` or the micro-batch (the update group
of a traced pair is the same program at B = 12 and 84). So a ZeRO-z key's groups are its ZeRO-0
twin's, rescaled, plus the difference ``z - 0`` of each costed group measured once per stage
mesh: one trace of the ZeRO-z pair at the first calibration shape, ``B = 3 * 2^L`` (``2^L`` the
stage's largest power of two) and usp's ring 1 for every ring, less its ZeRO-0 twin there.
Exact where what differs is parameter-sized; measured (``tests/test_train_derive.py``: usp 2x2
ring 2 at ZeRO 1-3, dp 1x4 at ZeRO 1 and 3, traced at the plan's shape and micro-batch 4)
within the estimate's 5% per group. A ZeRO-3 recompute key is traced as its own (above), at
``b0`` and ``7 b0``.

With both, the tiny training search (8 devices of tx8-16, 276 fitting plans) traces 134
calibration programs instead of 320 (552 per key). ``derive`` False (``--per-key-calibrations``)
traces every key's own at the two shapes, its micro-batch kept: the reference.

:func:`compose_step` composes a pipeline of P stages of n pairs each with 1F1B over m
micro-batches: ``(m + P - 1)`` slots of ``n * micro + boundary`` plus ``n * update``; the
boundary (the hidden states forward, their gradient back) is the caller's.

The estimate takes the same program at the two calibration shapes of ``planning.plan_estimate``
(``(T0, W0)`` and ``(3 T0, 5 W0)``, the plan's height kept): the kernels line up
one to one and every integer is rescaled to the plan's shape and micro-batch as above, then
costed with ``hlo_analyzer.mapping.program.map_kernels``; the
traced figure costs the plan's own full-size program the same way (never derived). Estimate and traced so
differ only where the full-size program has other kernels than the rescaled small ones (an
integer that is no product of the powers: counted in the basis) or a derivation above is not
exact. Both leave out the
embeddings and the final layer (0.3% of the parameters; the first and last stages' extra
work) and assume the stages alike (an even split of the pairs; every stage's collectives as
the first stage's chips run them).

Traces and analyses are cached under the work directory (``train_calibrations/``: the dumps in :data:`DUMPS_DIR`,
and per chip kind each program's kernel groups as JSON); every trace holds
the user's trace lock while it runs (``hlo_trace.cache.trace_lock_path``: one full-size trace
at a time on the machine; a model of fewer than :data:`UNLOCKED_PARAMETERS` parameters, the tiny
config, traces without it).
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from hardware.spec import SystemSpec
from hardware.systems import Hardware
from hlo_trace.atomic import atomic_write
from hlo_trace.cache import trace_lock_path
from hlo_trace.errors import UsageError
from models.opensora.config import get_config
from models.opensora.flops import parameter_count
from planning.plan_estimate import (
    CALIBRATION_FACTORS,
    FAILURE_FILE,
    MAX_EXPONENT,
    GroupCost,
    _largest_power_of_two,
    _Rescaler,
    _small,
    calibration_shapes,
    dump_names,
    run_calibration_traces,
    self_attention_flash,
)
from plans.calibration import request_config
from plans.feasibility import check_stage
from plans.train_options import TrainOptions

log = logging.getLogger(__name__)

__all__ = ["BATCH_FACTOR", "GROUPS", "PROGRAM_GROUPS", "RECOMPUTE_TOLERANCE", "USER_LOCK", "PairCalibration",
           "PairKey", "PairProgram", "TrainKernels", "TrainStep", "analyze_pair", "calibration_batch",
           "check_traceable", "compose_step", "cost_groups", "data_parallel", "derives_batch", "pair_stage", "step_groups"]

#: Kernel groups of a traced pair's step: once per micro-batch, once per step (module doc).
GROUPS = ("micro", "update")
#: The groups cached per traced program: the micro-batch's forward and backward, the step's update.
PROGRAM_GROUPS = ("forward", "backward", "update")
#: How far a recompute pair derived from its twin without recompute may be from its trace
#: (module doc; tests/test_train_generalise.py).
RECOMPUTE_TOLERANCE = 0.05
#: The ZeRO stage from which a recompute pair is traced as its own (module doc: under ZeRO-3 the
#: traced recompute step gathers the weights once for the rerun forward and the backward).
NO_DERIVED_RECOMPUTE_ZERO = 3
#: Collective kinds that sum a weight gradient (once per step under gradient accumulation).
GRADIENT_SUM_KINDS = ("all_reduce", "reduce_scatter")
#: ``lock`` of :func:`trace_lock` and :class:`TrainKernels`: the user's trace lock
#: (``hlo_trace.cache.trace_lock_path()``, resolved when it is taken), held (``flock``) while a
#: trace runs: one full-size trace at a time on the machine (``scripts/training_study.py`` and
#: plan-search's confirmations hold the same file).
USER_LOCK = "user"
#: A model with fewer parameters traces without the lock (the tiny config, 0.34 M: its traces
#: take well under a GiB; the full model, 1.2 G, a few GiB at full size).
UNLOCKED_PARAMETERS = 10**8
#: Format of the cached analyses (bumped when what they hold changes; an older analysis is
#: redone from its cached dump; 4: the rerun behind a checkpoint's barrier analysed as its own
#: ops, a kernel's phase from the dataflow where its op has no location; 5: the fused attention
#: takes the row sums of its probabilities, ring_attention's and usp's ring steps).
CACHE_VERSION = 5
#: Generation of the training programs the tracer writes, part of the cached dumps' directory
#: name (``dumps.v<N>``): bumped when the tracer writes a training step differently, so dumps
#: traced before are traced again rather than analysed as if current (2: the per-frame select's
#: gradient pinned to the residual-stream layout, ``select_grad``).
TRAIN_TRACE_VERSION = 2
#: The cached dumps' directory under a work directory.
DUMPS_DIR = f"dumps.v{TRAIN_TRACE_VERSION}"
#: The second calibration program's micro-batch is ``BATCH_FACTOR b0``: an odd prime other than
#: ``CALIBRATION_FACTORS``, so a ratio ``3^a 5^b 7^c`` names the batch's exponent too (module doc).
BATCH_FACTOR = 7
#: Strategies whose micro-batch is not derived: both calibration programs at the plan's own
#: micro-batch (module doc). GSPMD lays their activation collectives out otherwise at another
#: batch: the full model's usp 2x4 (ring 1) pair at 204_640_360 runs 35 forward collectives at a
#: micro-batch of 4 and 42 at 12 (all-gathers over x where it runs all-to-alls over y), and the
#: micro-batch derived from 12 and 84 had 2.2x the traced communication (1.9x on 1x8, 2.9x on
#: 4x4 with ZeRO-2); ring_attention 4x2's 3.2x (7.7 ms against 2.4 ms, its stages 1.052x the
#: estimate's); ds_ulysses' derived within 1%.
OWN_BATCH_STRATEGIES = ("usp", "ring_attention")
#: The stage shapes (``tracing.stages.boundary_shapes``) of every traced pair, one file beside
#: their dump directories: they depend on the shape and the micro-batch, not on the layout.
SHAPE_CACHE = "stage_shapes.json"
#: Which devices of a stage split the micro-batch, by layout: all of them (dp), the x axis (the
#: sequence-parallel layouts and megatron_sp), none (megatron).
BATCH_AXIS = {"dp": "all", "megatron": "none", "megatron_sp": "x", "ds_ulysses": "x",
              "ring_attention": "x", "usp": "x"}


def data_parallel(strategy: str, mesh: tuple[int, int]) -> int:
    """Devices of a stage mesh that split the batch under ``strategy`` (:data:`BATCH_AXIS`)."""
    return {"all": mesh[0] * mesh[1], "x": mesh[0], "none": 1}[BATCH_AXIS[strategy]]


def pair_stage(depth: int) -> tuple[str, int]:
    """The traced pair: stage 1 of a model cut into (0-0, 1-1, 2-{depth-1}), one pair with
    neither the embeddings nor the final layer, its output gradients arriving as inputs; a
    model of two pairs has no such stage: its last (the pair and the final layer), of one pair
    the whole model."""
    if depth >= 3:
        return f"0-0,1-1,2-{depth - 1}", 1
    return ("0-0,1-1", 1) if depth == 2 else ("0-0", 0)


@dataclass(frozen=True)
class PairKey:
    """What decides a traced pair's program (a plan's stage count and micro-batch count only
    compose it)."""

    config: str
    strategy: str
    mesh: tuple[int, int]
    ring: int | None
    zero: int
    recompute: bool
    micro_batch: int
    #: The self-attentions' kernels forced (spatial, temporal fused or not: a calibration program
    #: made to run the plan's, :meth:`TrainKernels.calibration`); None: OpenSora's choice.
    flash: tuple[bool, bool] | None = None

    @property
    def train_label(self) -> str:
        """``plans.train_options.TrainOptions.label`` of the key (the dump name's suffix)."""

        return TrainOptions(zero=self.zero, recompute="full" if self.recompute else "none").label()

    def name(self, shape: str) -> str:
        nx, ny = self.mesh
        ring = f"_ring{self.ring}" if self.ring is not None else ""
        flash = "" if self.flash is None else "_flash" + "".join(str(int(fused)) for fused in self.flash)
        return (f"{Path(self.config).stem}_{shape}_{self.strategy}_{nx}x{ny}{ring}_b{self.micro_batch}{flash}_"
                f"{self.train_label}")

    @property
    def data_parallel(self) -> int:
        return data_parallel(self.strategy, self.mesh)

    def request(self, shape: str, out: Path) -> dict[str, Any]:
        """``tracing.calibrate``'s request for the pair's training step at ``shape``."""
        stage_ids, stage = pair_stage(get_config(self.config).depth)
        return {"config": self.config, "shape": shape, "strategy": self.strategy, "mesh": list(self.mesh),
                "ring": self.ring, "patches": 1, "stage_ids": stage_ids,
                "stages": [stage], "batch": self.micro_batch, "out": str(out),
                "train": {"zero": self.zero, "recompute": "full" if self.recompute else "none",
                          "label": self.train_label},
                "shape_cache": str(out.parent / SHAPE_CACHE)} | ({} if self.flash is None else {"flash": list(self.flash)})


def derives_batch(key: PairKey) -> bool:
    """Whether ``key``'s micro-batch is derived (module doc): not a micro-batch of 1 (a batch
    dimension of 1 makes another program), nor one of :data:`OWN_BATCH_STRATEGIES`; those are
    calibrated at their own micro-batch in both programs."""
    return key.micro_batch > 1 and key.strategy not in OWN_BATCH_STRATEGIES


def calibration_batch(key: PairKey) -> int:
    """The micro-batch ``b0`` of ``key``'s first calibration program: ``3 * 2^k`` with the power
    of two of the plan's micro-batch capped at the largest power of two of the stage's chips
    (module doc); the plan's own where it is not derived (:func:`derives_batch`)."""
    if not derives_batch(key):
        return key.micro_batch
    return _small(key.micro_batch, _largest_power_of_two(key.mesh[0] * key.mesh[1]))


@dataclass(frozen=True)
class PairCalibration:
    """The traced programs a key's estimate is made of (module doc): ``base`` at the first
    calibration shape and ``scaled`` at the second (the plan's micro-batch, or ``b0`` and
    ``BATCH_FACTOR b0``); for a ZeRO stage derived from ZeRO-0, ``zero`` = (the pair under that
    stage, its ZeRO-0 twin), both at the first shape; ``rerun_forward`` a recompute key derived
    from its twin without recompute."""

    base: PairKey
    scaled: PairKey
    zero: tuple[PairKey, PairKey] | None
    rerun_forward: bool

    @property
    def batch_factor(self) -> int:
        return self.scaled.micro_batch // self.base.micro_batch


class _StepRescaler(_Rescaler):
    """``plan_estimate._Rescaler`` with a third factor, the micro-batch's: an integer ``v0`` in
    the first program and ``v1 = v0 3^a 5^b f^c`` in the second (``f`` = ``batch_factor``,
    :data:`BATCH_FACTOR` or 1: the batch kept) is ``v0 (T/T0)^a (W/W0)^b (B/B0)^c`` at the plan."""

    def __init__(self, t_ratio: Fraction, w_ratio: Fraction, b_ratio: Fraction, batch_factor: int) -> None:
        super().__init__(t_ratio, w_ratio)
        self.b_ratio, self.batch_factor = b_ratio, batch_factor
        self._factors = factors = (*CALIBRATION_FACTORS, batch_factor)
        self._ratios = ratios = (t_ratio, w_ratio, b_ratio)
        batch_exponents = range(MAX_EXPONENT + 1) if batch_factor > 1 else (0,)
        #: each product of the factors' powers, and the same powers of the ratios (looked up by
        #: ``v1 / v0`` instead of trying the 125 products for each integer)
        self._powers: dict[int, Fraction] = {}
        for exponents in itertools.product(range(MAX_EXPONENT + 1), range(MAX_EXPONENT + 1), batch_exponents):
            self._powers.setdefault(math.prod(f ** e for f, e in zip(factors, exponents, strict=True)),
                                    math.prod((r ** e for r, e in zip(ratios, exponents, strict=True)),
                                              start=Fraction(1)))

    def __call__(self, a: Any, b: Any) -> Any:
        if type(a) is int and type(b) is int:
            value, exact = self.value(a, b)
            self.values += 1
            self.inexact += not exact
            return value
        return super().__call__(a, b)

    def value(self, v0: int, v1: int) -> tuple[int, bool]:
        """The integer at the plan's shape and micro-batch, and whether it was exact (else the
        nearest power of the factors' geometric mean, as ``plan_estimate.rescale_value``)."""
        if v0 <= 0 or v1 <= 0:
            return (v0, True) if v0 == v1 else (max(v0, 0), False)
        power = self._powers.get(v1 // v0) if v1 % v0 == 0 else None
        if power is not None:
            value = v0 * power
            return (int(value), True) if value.denominator == 1 else (round(float(value)), False)
        moved = [(f, r) for f, r in zip(self._factors, self._ratios, strict=True) if f > 1]
        power = math.log(v1 / v0) / math.log(math.prod(f for f, _ in moved) ** (1 / len(moved)))
        mean_ratio = math.prod(float(r) for _, r in moved) ** (1 / len(moved))
        return max(1, round(v0 * mean_ratio ** power)), False


def check_traceable(key: PairKey, shape: str) -> None:
    """The tracer's own checks of the pair's stage at ``shape`` (configuration, strategy on the
    stage layout; no torch); UsageError with the tracer's message."""

    request = key.request(shape, Path("."))
    config = request_config(request)
    check_stage(config, request["stages"][0])


@dataclass(frozen=True)
class PairProgram:
    """A traced pair's step analysed on a chip kind: its kernels by group (kernel documents,
    ``hlo_analyzer.mapping.kernel_list.sources_document``, collectives kept) and its memory per
    device by class (``hlo_analyzer.training``: param, grad, optimizer_state, activation)."""

    groups: dict[str, dict[str, Any]]
    memory: dict[str, int]


@dataclass(frozen=True)
class TrainStep:
    """One training step of a plan per device (:func:`compose_step`): ``compute_s`` and
    ``comm_s`` the micro-batches' kernels and collectives on the slowest stage, ``update_s`` the
    once-per-step part, ``bubble_s`` the 1F1B fill and drain, ``boundary_s`` the sends."""

    step_s: float
    compute_s: float
    comm_s: float
    update_s: float
    bubble_s: float
    boundary_s: float


def compose_step(groups: dict[str, GroupCost], *, pairs: int, stages: int, micro_batches: int,
                 boundary_s: float) -> TrainStep:
    """The step of P = ``stages`` stages of ``pairs`` pairs each over m = ``micro_batches``
    micro-batches (1F1B) from one pair's groups: ``(m + P - 1)`` slots of ``pairs * micro +
    boundary`` plus ``pairs * update`` (module doc)."""
    micro, update = groups["micro"], groups["update"]
    slot = pairs * (micro.compute_s + micro.comm_s) + boundary_s
    slots = micro_batches + stages - 1
    update_s = pairs * (update.compute_s + update.comm_s)
    return TrainStep(step_s=slots * slot + update_s, compute_s=micro_batches * pairs * micro.compute_s,
                     comm_s=micro_batches * pairs * micro.comm_s, update_s=update_s,
                     bubble_s=(stages - 1) * slot, boundary_s=slots * boundary_s)


def analyze_pair(dump: str, system: SystemSpec) -> PairProgram:
    """The kernels of a traced pair's training step on ``system``'s chip, by group (module doc),
    and its memory classes."""
    from hlo_analyzer.mapping.analysis import AnalysisOptions, analyze_dump
    from hlo_analyzer.mapping.kernel_list import sources_document
    from hlo_analyzer.sidecar import stage_sidecar
    from hlo_analyzer.training import (
        FORWARD,
        OPTIMIZER,
        PARAM_GRAD,
        node_phases,
        read_training_layout,
    )

    sidecar = stage_sidecar(dump, "analyze-pipeline")
    layout = read_training_layout(sidecar)
    if layout is None:
        raise UsageError(f"{dump}: not a training step (its sidecar has no training section)")
    analysis = analyze_dump(dump, Hardware(system.name, system), AnalysisOptions(steps=1), sidecar=sidecar)
    report, mapping, options, split = analysis.report, analysis.mapping, analysis.options, analysis.training
    assert split is not None and options is not None  # the sidecar's training section, a chip
    phases = node_phases(analysis.graph, {row.position: row.location for row in report.rows}, layout)
    groups: dict[str, list[Any]] = {name: [] for name in PROGRAM_GROUPS}
    for op, source in zip(mapping.program.ops, mapping.program.sources, strict=True):
        if source.collective is not None:
            if op.position not in split.collective_classes:
                raise UsageError(f"{dump}: collective {op.name} at {op.position} has no training class")
            phase, traffic = split.collective_classes[op.position]
            once = phase == OPTIMIZER or (traffic == PARAM_GRAD and source.collective[0] in GRADIENT_SUM_KINDS)
        else:
            phase = phases.get(op.position, layout.phase(""))
            once = phase == OPTIMIZER
        groups["update" if once else "forward" if phase == FORWARD else "backward"].append(source)
    memory = {key: int(split.memory.get(key, 0)) for key in ("param", "grad", "optimizer_state", "activation")}
    return PairProgram({name: sources_document(kernels, options.execution) for name, kernels in groups.items()},
                       memory)


def cost_groups(groups: dict[str, dict[str, Any]], system: SystemSpec) -> dict[str, GroupCost]:
    """Each group of a program (:data:`PROGRAM_GROUPS`) costed on ``system`` (``map_kernels``,
    as ``analyze-hlo --hw`` costs them: kernel by kernel, so the groups add up to the program)."""
    from hlo_analyzer.mapping.kernel_list import sources_from_document
    from hlo_analyzer.mapping.program import map_kernels
    from hlo_analyzer.mapping.results import NETWORK_KIND, MappingOptions

    costs = {}
    for name in PROGRAM_GROUPS:
        sources, execution = sources_from_document(groups[name])
        program = map_kernels(sources, system.chip, system, MappingOptions(execution=execution))
        comm = sum(op.latency_s for op in program.ops if op.kind == NETWORK_KIND)
        costs[name] = GroupCost(program.latency_s - comm, comm)
    return costs


def step_groups(costs: dict[str, GroupCost], *, rerun_forward: bool = False) -> dict[str, GroupCost]:
    """A pair's :data:`GROUPS` from its program's costed groups: ``micro`` = forward + backward
    (+ the forward once more: ``rerun_forward``, a recompute pair derived from its twin without
    recompute, module doc), ``update`` as it is."""
    micro = costs["forward"] + costs["backward"]
    if rerun_forward:
        micro = micro + costs["forward"]
    return {"micro": micro, "update": costs["update"]}


@contextmanager
def trace_lock(path: str | Path | None = USER_LOCK) -> Iterator[None]:
    """Hold the trace lock ``path`` (``flock``; :data:`USER_LOCK`: the user's) while tracing
    (``None``: no lock)."""
    if path is None:
        yield
        return
    lock = trace_lock_path() if path == USER_LOCK else Path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class TrainKernels:
    """The traced pairs of training plans at one shape: the two calibration programs of each
    key (the estimate) and the full-size program (the traced figure), traced on demand under
    the trace lock (``lock``: :data:`USER_LOCK`, the user's for a model of
    :data:`UNLOCKED_PARAMETERS` or more; a path; None: none), analysed per chip kind and
    cached under ``work/train_calibrations``; ``jobs`` tracing processes at once.
    ``derive``: the micro-batch, the ZeRO stage and recompute derived (module doc,
    :meth:`calibration`); False traces each key's own at the two shapes (the per-key
    calibration, the baseline of ``benchmarks/plan_search.py``)."""

    def __init__(self, work: Path, config: str, shape: str, *, lock: str | Path | None = USER_LOCK,
                 derive: bool = True, jobs: int = 1) -> None:
        self.work = Path(work) / "train_calibrations"
        self.jobs = jobs
        small = parameter_count(get_config(config)) < UNLOCKED_PARAMETERS
        self.lock = None if lock == USER_LOCK and small else lock
        self.derive = derive
        self._holding = False
        self._lock_context: Any = None
        self.config, self.shape = config, shape
        self._programs: dict[tuple[PairKey, str, str], PairProgram | str] = {}
        self._estimates: dict[tuple[PairKey, str], tuple[dict[str, GroupCost], str]] = {}
        self._costs: dict[tuple[PairKey, str, str], dict[str, GroupCost]] = {}
        self._rescalings: dict[tuple[PairKey, PairKey, int, str], tuple[dict[str, GroupCost], int, int]] = {}
        self.traced = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep the trace lock, once a trace inside takes it, until the end of the block (one
        hold for a run of traces; none when nothing is traced)."""
        if self._holding:
            yield
            return
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            if self._lock_context is not None:
                context, self._lock_context = self._lock_context, None
                context.__exit__(None, None, None)

    @contextmanager
    def _tracing(self) -> Iterator[None]:
        """The trace lock around one run of traces (kept on inside :meth:`held`)."""
        if self._lock_context is not None:
            yield
            return
        context = trace_lock(self.lock)
        context.__enter__()
        if self._holding:
            self._lock_context = context
            yield
            return
        try:
            yield
        finally:
            context.__exit__(None, None, None)

    def _dump_dir(self, key: PairKey, shape: str) -> Path:
        return self.work / DUMPS_DIR / key.name(shape)

    def _analysis_path(self, key: PairKey, shape: str, kind: str) -> Path:
        return self.work / kind / f"{key.name(shape)}.json"

    def shapes(self, key: PairKey) -> tuple[str, str, Fraction, Fraction]:
        """``key``'s two calibration shapes and the factors ``T / T0``, ``W / W0`` to the plan's
        (``plan_estimate.calibration_shapes`` on the stage's chips: the frames' power of two
        capped at the largest power of two of the mesh, so shapes of one size that differ by a
        power of two of frames share the traces, as the inference calibrations do)."""
        nx, ny = key.mesh
        return calibration_shapes(get_config(self.config), self.shape, nx * ny)

    def calibration(self, key: PairKey) -> PairCalibration:
        """The programs ``key``'s estimate is made of (module doc; ``derive`` False: the key's own
        at the two shapes, its micro-batch kept)."""
        if not self.derive:
            return PairCalibration(key, key, None, False)
        b0 = calibration_batch(key)
        own = key.zero >= NO_DERIVED_RECOMPUTE_ZERO and key.recompute  # traced as its own
        base = dataclasses.replace(key, micro_batch=b0, **({} if own else {"zero": 0, "recompute": False}))
        zero = None
        if base.zero != key.zero:
            ring = 1 if key.strategy == "usp" else key.ring  # the ZeRO difference: not the ring's
            batch = _small(_largest_power_of_two(key.mesh[0] * key.mesh[1]))  # nor the micro-batch's
            staged = dataclasses.replace(base, ring=ring, zero=key.zero, micro_batch=batch)
            zero = (staged, dataclasses.replace(staged, zero=0))
        factor = BATCH_FACTOR if derives_batch(key) else 1
        base_shape, scaled_shape = self.shapes(key)[:2]
        return PairCalibration(self._plan_kernels(base, base_shape, key),
                               self._plan_kernels(dataclasses.replace(base, micro_batch=factor * b0), scaled_shape, key),
                               None if zero is None else tuple(self._plan_kernels(z, base_shape, key) for z in zero),
                               key.recompute and not base.recompute)

    def _plan_kernels(self, traced: PairKey, shape: str, key: PairKey) -> PairKey:
        """``traced`` (a calibration program of ``key`` at ``shape``) forced to the self-attention
        kernels of ``key``'s own program where OpenSora's rule (flash only for a sequence longer
        than its batch, ``plan_estimate.self_attention_flash`` on the micro-batch) would choose
        others at ``shape`` and ``traced``'s micro-batch: the programs then line up kernel for
        kernel (the full model's spatial attention at 123_1920_360 and a micro-batch of 84 over
        36 frames is no flash kernel; at 204_640_360 and 4 it is), as the inference calibrations
        force it (``plan_estimate.forced_flash``)."""
        model = get_config(self.config)
        wanted = self_attention_flash(model, self.shape, 1, key.micro_batch)
        if self_attention_flash(model, shape, 1, traced.micro_batch) == wanted:
            return traced
        return dataclasses.replace(traced, flash=wanted)

    def calibration_keys(self, keys: Sequence[PairKey]) -> list[PairKey]:
        """The distinct keys traced at the first calibration shape to calibrate ``keys``, in
        their order (the second shape's are their ``scaled`` twins)."""
        return list(dict.fromkeys(self.calibration(key).base for key in keys))

    def requests(self, keys: Sequence[PairKey], system: SystemSpec, *, full: bool = False) -> list[dict[str, Any]]:
        """The trace requests of :meth:`prepare` whose programs are not analysed yet (some may
        be traced already: ``run_calibration_traces`` skips those)."""
        return [request for _, _, request in self._planned(keys, system, full=full)]

    def _calibration_programs(self, key: PairKey) -> list[tuple[PairKey, str]]:
        """(traced key, shape) of every program ``key``'s estimate reads."""
        calibration = self.calibration(key)
        base_shape, scaled_shape = self.shapes(key)[:2]
        programs = [(calibration.base, base_shape), (calibration.scaled, scaled_shape)]
        return programs + [(zero, base_shape) for zero in calibration.zero or ()]

    def _planned(self, keys: Sequence[PairKey], system: SystemSpec, *, full: bool,
                 ) -> list[tuple[PairKey, str, dict[str, Any]]]:
        """(traced key, shape, request) of each program of :meth:`requests`."""
        programs = [(key, self.shape) for key in keys] if full else \
            [program for key in keys for program in self._calibration_programs(key)]
        kind = system.chip.name
        return [(key, shape, key.request(shape, self._dump_dir(key, shape))) for key, shape in dict.fromkeys(programs)
                if not self._analysis_path(key, shape, kind).exists()]

    def prepare(self, keys: Sequence[PairKey], system: SystemSpec, *, full: bool = False,
                progress: Callable[[int, int], None] | None = None) -> int:
        """Trace every program of ``keys`` not traced yet, in ``jobs`` processes that load
        torch once each: the two calibration shapes of their calibration keys, or (``full``)
        the keys' own programs at the plan's shape; the number traced. ``progress(done,
        total)`` as the traces are written (``run_calibration_traces``)."""
        planned = self._planned(keys, system, full=full)
        if not planned:
            return 0
        requests = [request for _, _, request in planned]
        programs = {request["out"]: (key, shape) for key, shape, request in planned}

        def analyse(request: dict[str, Any]) -> None:  # beside the traces, on another core
            key, shape = programs[request["out"]]
            self.program(key, shape, system)

        with self._tracing():
            traced = run_calibration_traces(requests, self.work, jobs=self.jobs, progress=progress,
                                            written=analyse)
        self.traced += traced
        return traced

    def program(self, key: PairKey, shape: str, system: SystemSpec) -> PairProgram | str:
        """The pair's program at ``shape`` analysed on ``system``'s chip, or the tracer's error
        line (traced when missing)."""

        kind = system.chip.name
        cached = self._programs.get((key, shape, kind))
        if cached is not None:
            return cached
        path = self._analysis_path(key, shape, kind)
        if not path.exists():
            out = self._dump_dir(key, shape)
            request = key.request(shape, out)
            if not (out / dump_names(request)[0]).exists() and not (out / FAILURE_FILE).exists():
                with self._tracing():
                    self.traced += run_calibration_traces([request], self.work, jobs=1)
            failure = out / FAILURE_FILE
            if failure.exists():
                document: dict[str, Any] = {"version": CACHE_VERSION, "error": failure.read_text().strip()}
            else:
                analysed = analyze_pair(str(out / dump_names(request)[0]), system)
                document = {"version": CACHE_VERSION, "groups": analysed.groups, "memory": analysed.memory}
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(document) + "\n", force=True)
        document = json.loads(path.read_text())
        if document.get("version") != CACHE_VERSION:  # an older analysis: redone from the dump
            path.unlink()
            return self.program(key, shape, system)
        value = document["error"] if "error" in document else PairProgram(document["groups"], document["memory"])
        self._programs[(key, shape, kind)] = value
        return value

    def estimate(self, key: PairKey, system: SystemSpec) -> tuple[dict[str, GroupCost], str]:
        """The pair's groups at the plan's shape and micro-batch from its calibration's programs
        (:meth:`calibration`), costed on ``system``, and the basis (ValueError when a calibration
        failed or its two programs differ): the two programs rescaled; a derived ZeRO stage's
        difference from ZeRO-0 added; a derived recompute key's forward once more."""
        cached = self._estimates.get((key, system.name))
        if cached is None:
            cached = self._estimates[(key, system.name)] = self._estimate(key, system)
        return cached

    def _estimate(self, key: PairKey, system: SystemSpec) -> tuple[dict[str, GroupCost], str]:
        """From the derived calibration; where its two programs differ (GSPMD may choose other
        collectives at the calibration's micro-batches than at the key's: usp 2x2 ZeRO-2 at a
        micro-batch of 2, 70 kernels against 75), from the key's own programs at the two shapes,
        traced now, as ``derive`` False would."""
        calibration = self.calibration(key)
        own = PairCalibration(key, key, None, False)
        try:
            return self._estimate_with(calibration, key, system)
        except ValueError as error:
            if calibration == own:
                raise
            log.info("%s: the derived calibration's programs differ (%s); the key's own traced", key, error)
            groups, basis = self._estimate_with(own, key, system)
            return groups, f"{basis}; the key's own programs: the derived calibration's differ"

    def _estimate_with(self, calibration: PairCalibration, key: PairKey, system: SystemSpec,
                       ) -> tuple[dict[str, GroupCost], str]:
        base_shape, scaled_shape = self.shapes(key)[:2]
        costs, inexact, values = self._rescaled(calibration, key.micro_batch, system)
        notes = []
        if calibration.base.micro_batch != key.micro_batch:
            notes.append(f"micro-batch {key.micro_batch} from {calibration.base.micro_batch} and "
                         f"{calibration.scaled.micro_batch}")
        if calibration.zero is not None:
            staged, plain = (self._costed(zero, base_shape, system) for zero in calibration.zero)
            costs = {name: costs[name] + staged[name] - plain[name] for name in PROGRAM_GROUPS}
            notes.append(f"ZeRO-{key.zero}: ZeRO-0 and the difference at {base_shape}")
        if calibration.rerun_forward:
            notes.append("recompute: the pair without it, its forward once more")
        basis = (f"traced kernels ({base_shape}, {scaled_shape}; {inexact} of "
                 f"{values} integers inexact{''.join('; ' + note for note in notes)})")
        return step_groups(costs, rerun_forward=calibration.rerun_forward), basis

    def _rescaled(self, calibration: PairCalibration, micro_batch: int, system: SystemSpec,
                  ) -> tuple[dict[str, GroupCost], int, int]:
        """The calibration's two programs rescaled to the plan's shape and ``micro_batch`` and
        costed on ``system``, with the inexact and all integers rescaled (once: the keys of a
        calibration that differ in their ZeRO stage or recompute share them)."""
        cache_key = (calibration.base, calibration.scaled, micro_batch, system.name)
        cached = self._rescalings.get(cache_key)
        if cached is None:
            base_shape, scaled_shape, t_ratio, w_ratio = self.shapes(calibration.base)
            programs = [self._traced(calibration.base, base_shape, system),
                        self._traced(calibration.scaled, scaled_shape, system)]
            rescaler = _StepRescaler(t_ratio, w_ratio, Fraction(micro_batch, calibration.base.micro_batch),
                                     calibration.batch_factor)
            groups = {name: rescaler(programs[0].groups[name], programs[1].groups[name]) for name in PROGRAM_GROUPS}
            cached = self._rescalings[cache_key] = (cost_groups(groups, system), rescaler.inexact, rescaler.values)
        return cached

    def _costed(self, key: PairKey, shape: str, system: SystemSpec) -> dict[str, GroupCost]:
        """A traced program's groups costed on ``system`` (once: the ZeRO differences' programs
        serve many keys)."""
        cached = self._costs.get((key, shape, system.name))
        if cached is None:
            cached = self._costs[(key, shape, system.name)] = cost_groups(self._traced(key, shape, system).groups,
                                                                          system)
        return cached

    def _traced(self, key: PairKey, shape: str, system: SystemSpec) -> PairProgram:
        value = self.program(key, shape, system)
        if isinstance(value, str):
            raise ValueError(f"calibration not traced: {value}")
        return value

    def full(self, key: PairKey, system: SystemSpec) -> tuple[dict[str, GroupCost], dict[str, int]] | str:
        """The pair's own program at the plan's shape, costed on ``system``, and its memory
        classes; or the tracer's error line."""
        value = self.program(key, self.shape, system)
        if isinstance(value, str):
            return value
        return step_groups(cost_groups(value.groups, system)), dict(value.memory)

