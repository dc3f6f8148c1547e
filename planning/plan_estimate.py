"""The plan search's estimate from the traced program's own kernels: a traced pair at a
small shape, re-costed at the plan's shape.

A plan's traced latency (``analyze-pipeline``) is the sum of the kernels the analyzer finds in
each stage's dump (``hlo_analyzer.mapping.program``: under ``--exec torch`` one kernel per library
call or torch op, under the fused execution one per fusion group), each costed on the chip, plus
the stage's collectives on the network, composed by the PipeFusion schedule. The ideal op list
of ``hardware.map_block`` leaves out most of those kernels (the eager element-wise ops, the
copies and layout transposes GSPMD and PyTorch add), so on a GPU it sits at a third of the trace.

Here every kernel is the trace's. The program of one block pair on a stage mesh does not depend
on the video size except through the sizes of its dimensions: a pair traced at a small shape
holds the same kernels in the same order, each dimension a product of powers of the latent
frames ``T`` and the token columns ``W`` (the latent width over the patch) times constants (the
height is kept: PipeFusion cuts it and pads it). So each *calibration* traces one pair per stage
role (a flat stage: embeddings + pair + final layer; a pipeline of three one-pair stages: first,
middle, last) at two small shapes, ``(T0, W0)`` and ``(f_T T0, f_W W0)``, with ``T0`` and
``W0`` divisible by every split of the stage (a divisor of its chips: a mesh axis, a ring or a
Ulysses degree) exactly when the plan's ``T`` and ``W`` are: the same splits divide, the same
pads happen (:func:`calibration_geometry`). ``f_T`` and ``f_W`` are two odd primes that change
no split's divisibility: 3 and 5 unless the stage's chips need them (15 chips at 408_640_360
keep 3 and 5; 45 chips scale by 5 and 7). Each integer of each kernel (shapes, FLOPs, bytes of
a collective, rows) is ``v0`` in the first and ``v1`` in the second: ``v1 / v0 = f_T^a f_W^b``
gives its exponents, and its value at the plan's shape is ``v0 (T/T0)^a (W/W0)^b``
(:func:`rescale_value`). The kernels are then costed with ``mapping.program.map_kernels``, the function
``analyze-hlo --hw`` uses, in the execution mode ``analyze-pipeline`` picks for the chip, and a
stage is its role's kernels outside the pairs plus its pairs times one pair's, as
``mapping.apply.program_totals`` totals a traced stage. What the trace knows and this does not:
a value that is no such product (an integer the analyzer derives by a sum or a rounding; counted
in ``Calibration.inexact``) and whatever differs between a one-pair stage and a stage of many
pairs.

The calibration traces are small (about a second each in a process that has torch loaded) and
are cached by what decides them (model, strategy, stage mesh, usp degrees, patches, the two
shapes) under the search's work directory, with each chip kind's kernel list; re-costing at a
shape and a system is cached in memory, so a space of 10^4 plans that shares its calibrations
is estimated in seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from hardware.ops import OpType
from hardware.spec import SystemSpec
from hardware.systems import Hardware
from hlo_trace.atomic import atomic_write
from hlo_trace.errors import UsageError
from hlo_trace.isolate import child_environment
from models.opensora.config import STDiT3Config, get_config
from models.opensora.inputs import geometry, latent_frames, parse_shape
from models.opensora.library_calls import self_attention_is_flash
from planning.trace_process import CalibrationTrace
from plans.calibration import FAILURE_FILE, dump_names, failure_file, request_config
from plans.patches import patch_plan

log = logging.getLogger(__name__)

__all__ = ["CALIBRATION_FACTORS", "GUIDANCE_BATCH", "Boundary", "Calibration", "CalibrationKey",
           "CalibrationShapes", "GroupCost", "KernelCosts", "StageCosts", "StagePart", "calibration_geometry",
           "calibration_shapes", "decode_exponents", "dump_names",
           "forced_flash", "request_config", "rescale_value", "run_calibration_traces", "scale_factors",
           "self_attention_flash", "stage_roles", "tracer_environment"]

#: The second calibration shape's factors ``(T1 / T0, W1 / W0)`` when no split of the stage
#: needs them (``calibration_geometry``), and always in the training calibration: two odd
#: primes, so a ratio ``3^a 5^b`` names both exponents and no power of two (a mesh split) changes.
CALIBRATION_FACTORS = (3, 5)
#: Largest exponent of ``T`` or ``W`` looked for in one integer (an attention's FLOPs over a
#: pair of sequences: 2; a product of those with a batch of frames: 3).
MAX_EXPONENT = 4
#: The smallest odd prime tried as a calibration dimension's filler and scaling factor
#: (``_small``, ``_scaling_prime``): the first shape's odd part when no split needs another.
SMALL_ODD_PART = 3
#: Stage roles: a flat plan's one stage, and a pipeline's first, middle, last.
ROLES = ("flat", "first", "middle", "last")
#: Block pairs of a calibration's one stage: the first pair, one in the middle, the last.
CALIBRATION_PAIRS = 3
#: Format of the cached calibration files (bumped when what they hold changes; 3: the GEMM
#: epilogues that depend on the sizes are left pending, decided at the plan's shape; 4: the
#: fused attention takes the row sums of its probabilities, which moved ring_attention's and usp's kernels).
CACHE_VERSION = 4
#: The kernel groups of a calibration stage (``_groups``).
GROUPS = ("embed", "final", "pair0", "pair1", "pair2")
#: Classifier-free guidance: every inference runs the batch of 2 (docs/model.md; the tracer's
#: default batch).
GUIDANCE_BATCH = 2


@dataclass(frozen=True)
class CalibrationKey:
    """What decides a calibration's programs (the plan's split and stage count do not)."""

    config: str
    strategy: str
    mesh: tuple[int, int]
    ring: int | None
    patches: int
    base_shape: str
    scaled_shape: str
    #: (spatial, temporal) self-attention fused or not, forced in both traces: the plan's shape
    #: makes another choice than a calibration shape would (:func:`forced_flash`); None: none.
    flash: tuple[bool, bool] | None = None

    @property
    def factors(self) -> tuple[int, int]:
        """The odd primes ``(T1 / T0, W1 / W0)`` that take the first shape to the second."""
        t_factor, w_factor = scale_factors(get_config(self.config), self.base_shape, self.scaled_shape)
        return int(t_factor), int(w_factor)

    def rescaler(self, shape: str) -> _Rescaler:
        """A rescaler of this calibration's integers to ``shape``."""
        return _Rescaler(*scale_factors(get_config(self.config), self.base_shape, shape), self.factors)

    @property
    def name(self) -> str:
        text = (f"{Path(self.config).stem}_{self.strategy}_{self.mesh[0]}x{self.mesh[1]}_M{self.patches}"
                f"_{self.base_shape}_{self.scaled_shape}")
        text += f"_ring{self.ring}" if self.ring is not None else ""
        if self.flash is not None:
            text += "_attention-" + "-".join(f"{axis}{'flash' if fused else 'plain'}" for axis, fused
                                             in zip(("spatial", "temporal"), self.flash, strict=True))
        return text


def _odd_part_free(value: int) -> int:
    """The largest power of two dividing ``value``."""
    return value & -value


def _valuation(value: int, prime: int) -> int:
    """The exponent of ``prime`` in ``value`` (``value`` > 0)."""
    count = 0
    while value % prime == 0:
        value //= prime
        count += 1
    return count


def _odd_primes(value: int) -> list[int]:
    """The odd primes dividing ``value``, smallest first."""
    primes, candidate = [], 3
    value //= _odd_part_free(value)
    while value > 1:
        if value % candidate == 0:
            primes.append(candidate)
            while value % candidate == 0:
                value //= candidate
        candidate += 2
    return primes


def _next_odd_prime(after: int) -> int:
    candidate = after + 2
    while any(candidate % p == 0 for p in range(3, math.isqrt(candidate) + 1, 2)):
        candidate += 2
    return candidate


def _filler(devices: int | None) -> int:
    """The smallest odd prime that divides no split of a stage of ``devices`` chips (3 when
    ``devices`` is None or has no odd factor): a factor of a calibration dimension that changes
    no split's divisibility."""
    prime = SMALL_ODD_PART
    while devices is not None and devices % prime == 0:
        prime = _next_odd_prime(prime)
    return prime


def _small(value: int, cap: int | None = None, devices: int | None = None) -> int:
    """A calibration dimension for ``value`` (frames, token columns, a micro-batch): the power of
    two of ``value`` (at most ``cap``) times, for each odd prime ``p`` of ``devices`` (the
    stage's chips: every split of the stage, by a mesh axis, a ring or a Ulysses degree, divides
    them), ``p`` to the exponent it has in ``value``, capped at its exponent in ``devices``. So
    every split divides it exactly when it divides ``value``. When that leaves no odd factor (and
    always without ``devices``) it is multiplied by :func:`_filler` (3 unless a split has a 3),
    so that no split by a power of two is 1 where the split of ``value`` is not (a dimension of 1
    may make another kernel: a broadcast where there was a strided read)."""
    power = _odd_part_free(value)
    small = power if cap is None else min(power, cap)
    for prime in _odd_primes(devices) if devices is not None else ():
        small *= prime ** min(_valuation(value, prime), _valuation(devices, prime))
    if small == _odd_part_free(small):
        small *= _filler(devices)
    return small


def _scaling_prime(value: int, devices: int | None, taken: int | None = None) -> int:
    """The smallest odd prime (not ``taken``) by which a calibration dimension ``value`` can be
    scaled without changing whether any split of a stage of ``devices`` chips divides it: one
    that divides no split, or whose exponent in ``value`` already reaches its exponent in
    ``devices``."""
    prime = SMALL_ODD_PART
    while prime == taken or (devices is not None and devices % prime == 0
                             and _valuation(value, prime) < _valuation(devices, prime)):
        prime = _next_odd_prime(prime)
    return prime


def _largest_power_of_two(devices: int) -> int:
    return 1 << (devices.bit_length() - 1)


def _shape_text(model: STDiT3Config, frames_latent: int, columns: int, height: int) -> str:
    frames = math.ceil(frames_latent * 17 / 5)
    while latent_frames(frames) < frames_latent:
        frames += 1
    _, _, pw = model.patch_size
    return f"{frames}_{columns * pw * model.vae_downsample}_{height}"


@dataclass(frozen=True)
class CalibrationShapes:
    """The two calibration shapes of a plan's shape on a stage (:func:`calibration_geometry`),
    the ratios ``T / T0`` and ``W / W0`` that take the first to the plan's shape, and the two
    odd primes ``(T1 / T0, W1 / W0)`` that take the first to the second."""

    base: str
    scaled: str
    t_ratio: Fraction
    w_ratio: Fraction
    factors: tuple[int, int] = CALIBRATION_FACTORS


def calibration_geometry(model: STDiT3Config, shape: str, devices: int | None = None, *,
                         odd_splits: bool = True) -> CalibrationShapes:
    """The calibration of ``shape`` on a stage of ``devices`` chips: the first shape's frames
    ``T0`` and token columns ``W0`` are ``_small`` of the plan's (with ``odd_splits``: the
    frames' power of two capped at the power of two of ``devices``, and the odd primes of
    ``devices`` kept as the plan's shape has them, each capped at its exponent in ``devices``;
    the columns' power of two uncapped), the height ``shape``'s. The second
    shape scales ``T0`` and ``W0`` by two distinct odd primes (3 and 5 unless a split needs them:
    :func:`_scaling_prime`), so that every split of the stage divides the same dimensions at
    the plan's shape and at both calibration shapes, and a ratio ``v1 / v0 = f_T^a f_W^b`` of
    an integer names both its exponents. Without ``odd_splits`` (the training calibration, whose
    rescaler decodes ``CALIBRATION_FACTORS``): the powers of two alone, the frames' capped at the
    largest power of two of ``devices``, odd part 3 and the factors 3 and 5.

    The caps lose nothing: whether a prime power ``p^k`` divides a product ``c T^a W^b`` is the
    same for ``T`` and ``T0`` when every ``p^k`` a split asks about is at most ``p^L`` (a split
    of a stage's tensors is by mesh axes, ring or Ulysses degrees, each a divisor of its chips)
    and the powers of ``p`` in ``T`` and ``T0`` agree up to ``p^L``. And it shares: the shapes of one size that differ by
    a power of two of frames (204 and 408 frames at 640 x 360, 51 and 102 at 1280 x 720) have the
    same calibration shapes on stages of few chips (4 or fewer at 640 x 360, 1 at 1280 x 720),
    traced once in a shared ``--work-dir``."""
    geo = geometry(model, shape)
    video = parse_shape(shape)
    pt, _, _ = model.patch_size
    if pt != 1 or geo.T_lat != geo.T:
        raise UsageError(f"--shape {shape}: the estimate's calibration expects a temporal patch of 1")
    if geo.W_lat != geo.W_patches * model.patch_size[2]:
        raise UsageError(f"--shape {shape}: the estimate's calibration expects a latent width the "
                         "patch divides")
    splits = devices if odd_splits else None
    cap = None if devices is None else _odd_part_free(devices) if odd_splits else _largest_power_of_two(devices)
    t0 = _small(geo.T, cap, splits)
    w0 = _small(geo.W_patches, None, splits)
    ft = _scaling_prime(t0, splits)
    fw = _scaling_prime(w0, splits, taken=ft)
    base = _shape_text(model, t0, w0, video.height)
    scaled = _shape_text(model, ft * t0, fw * w0, video.height)
    for text, (t, w) in ((base, (t0, w0)), (scaled, (ft * t0, fw * w0))):
        check = geometry(model, text)
        assert (check.T, check.W_patches, check.H_patches) == (t, w, geo.H_patches), text
    return CalibrationShapes(base, scaled, Fraction(geo.T, t0), Fraction(geo.W_patches, w0), (ft, fw))


def calibration_shapes(model: STDiT3Config, shape: str, devices: int | None = None,
                       ) -> tuple[str, str, Fraction, Fraction]:
    """The two small shapes of ``shape``'s calibration on a stage of ``devices`` chips and the
    factors ``T / T0``, ``W / W0`` that take the first to ``shape``, by the powers of two alone
    and scaled by ``CALIBRATION_FACTORS`` (:func:`calibration_geometry` without ``odd_splits``:
    the training calibration's)."""
    found = calibration_geometry(model, shape, devices, odd_splits=False)
    return found.base, found.scaled, found.t_ratio, found.w_ratio


def scale_factors(model: STDiT3Config, base: str, shape: str) -> tuple[Fraction, Fraction]:
    """``T / T0`` and ``W / W0``: what takes the calibration shape ``base`` to ``shape``."""
    small, large = geometry(model, base), geometry(model, shape)
    return Fraction(large.T, small.T), Fraction(large.W_patches, small.W_patches)


def self_attention_flash(model: STDiT3Config, shape: str, patches: int, batch: int = GUIDANCE_BATCH,
                         ) -> tuple[bool, bool]:
    """Whether the spatial and the temporal self-attention of a trace at ``shape`` (on one of
    ``patches`` PipeFusion patches) run the fused kernel: OpenSora's rule
    (``self_attention_is_flash``) on the sequences the model attends over, the spatial tokens
    of the patch in a batch of ``batch`` (inference: ``GUIDANCE_BATCH``) x frames, the frames
    in a batch of ``batch`` x spatial tokens."""
    geo = geometry(model, shape)
    tokens = geo.S
    if patches > 1:

        tokens = patch_plan(model, shape, patches).S_patch
    return (self_attention_is_flash(tokens, batch * geo.T),
            self_attention_is_flash(geo.T, batch * tokens))


def forced_flash(model: STDiT3Config, shape: str, patches: int, devices: int | None = None,
                 ) -> tuple[bool, bool] | None:
    """The self-attention kernels a calibration of ``shape`` must force (:class:`CalibrationKey`):
    the choice at ``shape`` where either calibration shape would make another (a patch of 240
    tokens over 2 x 120 frames at 408_640_360, M = 4, runs no fused kernel; at both calibration
    shapes it would), else None: the traces make the plan's choice by themselves."""
    found = calibration_geometry(model, shape, devices)
    base, scaled = found.base, found.scaled
    wanted = self_attention_flash(model, shape, patches)
    if all(self_attention_flash(model, small, patches) == wanted for small in (base, scaled)):
        return None
    return wanted


def decode_exponents(v0: int, v1: int, factors: tuple[int, int] = CALIBRATION_FACTORS,
                     ) -> tuple[int, int] | None:
    """``(a, b)`` with ``v1 = v0 f_T^a f_W^b`` (``factors``: the calibration's two odd primes,
    by default ``CALIBRATION_FACTORS``), or None when none is."""
    if v0 <= 0 or v1 <= 0:
        return (0, 0) if v0 == v1 else None
    ft, fw = factors
    for a in range(MAX_EXPONENT + 1):
        for b in range(MAX_EXPONENT + 1):
            if v0 * ft ** a * fw ** b == v1:
                return a, b
    return None


def rescale_value(v0: int, v1: int, t_ratio: Fraction, w_ratio: Fraction,
                  factors: tuple[int, int] = CALIBRATION_FACTORS) -> tuple[int, bool]:
    """The value at the plan's shape of an integer that is ``v0`` at the first calibration
    shape and ``v1`` at the second (scaled by ``factors``), and whether it was exact (a product
    of powers). Not one: the nearest such product by the logarithm of ``v1 / v0`` (both
    exponents rounded as one power of the geometric mean of the two factors)."""
    exponents = decode_exponents(v0, v1, factors)
    if exponents is not None:
        a, b = exponents
        value = v0 * t_ratio ** a * w_ratio ** b
        return (int(value), True) if value.denominator == 1 else (round(float(value)), False)
    ft, fw = factors
    if v0 <= 0 or v1 <= 0:
        return max(v0, 0), False
    power = math.log(v1 / v0) / math.log(math.sqrt(ft * fw))
    mean_ratio = math.sqrt(float(t_ratio) * float(w_ratio))
    return max(1, round(v0 * mean_ratio ** power)), False


class _Rescaler:
    """Rescales the integers of aligned structures; counts the inexact ones."""

    def __init__(self, t_ratio: Fraction, w_ratio: Fraction,
                 factors: tuple[int, int] = CALIBRATION_FACTORS) -> None:
        self.t_ratio, self.w_ratio, self.factors = t_ratio, w_ratio, factors
        self.inexact = 0
        self.values = 0

    def __call__(self, a: Any, b: Any) -> Any:
        if isinstance(a, str) and isinstance(b, str):
            if a != b:  # a kernel class that depends on the size (a broadcast of a dim of 1)
                self.inexact += 1
            return b
        if isinstance(a, bool) or a is None:
            if a != b:
                raise ValueError(f"calibration programs differ: {str(a)[:40]} against {str(b)[:40]}")
            return a
        if isinstance(a, int):
            if not isinstance(b, int):
                raise ValueError(f"calibration programs differ: {a} against {str(b)[:40]}")
            value, exact = rescale_value(a, b, self.t_ratio, self.w_ratio, self.factors)
            self.values += 1
            self.inexact += not exact
            return value
        if isinstance(a, float):
            return a  # no float field decides a kernel's cost through its size
        if isinstance(a, (list, tuple)):
            if not isinstance(b, (list, tuple)) or len(a) != len(b):
                raise ValueError(f"calibration programs differ: {len(a)} items against "
                                 f"{len(b) if isinstance(b, (list, tuple)) else type(b).__name__}")
            return type(a)(self(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            if not isinstance(b, dict) or a.keys() != b.keys():
                raise ValueError("calibration programs differ in a record's fields")
            if a.get("op_type") == OpType.FLASH_ATTENTION.value and "vector_flops" in a:
                return self._attention(a, b)
            return {key: self(a[key], b[key]) for key in a}
        raise TypeError(f"cannot rescale {type(a).__name__}")

    def _attention(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        """A fused attention's record. Its softmax work (``vector_flops``, the sum of the
        element-wise ops of its region) is no product of powers: ops over the scores (B x heads x
        S_Q x S_KV elements) and reductions that count one less per row (B x heads x S_Q rows;
        a plain softmax is 5 per score - 2 per row). So it is taken as ``alpha scores + beta
        rows``, the two constants solved from the two calibration shapes, at the plan's scores and
        rows; where both shapes have the same keys per row (the captions' cross-attention) the two
        terms are one product and it is rescaled as any integer."""
        others = {key: self(a[key], b[key]) for key in a if key != "vector_flops"}
        (p0, r0), (p1, r1) = _attention_counts(a), _attention_counts(b)
        determinant = p0 * r1 - p1 * r0
        if determinant == 0:
            return {**others, "vector_flops": self(a["vector_flops"], b["vector_flops"])}
        v0, v1 = a["vector_flops"], b["vector_flops"]
        alpha = Fraction(v0 * r1 - v1 * r0, determinant)
        beta = Fraction(p0 * v1 - p1 * v0, determinant)
        scores, rows = _attention_counts(others)
        value = alpha * scores + beta * rows
        self.values += 1
        self.inexact += value.denominator != 1
        return {**others, "vector_flops": round(value)}


def _attention_counts(record: dict[str, Any]) -> tuple[int, int]:
    """(score elements, score rows) of a fused attention's record: B x heads x S_Q x S_KV and
    B x heads x S_Q, its q (B, heads, S_Q, head_dim) and k (B, heads, S_KV, head_dim) as
    ``hardware.ops.attention_dims`` reads them."""
    q, k = record["input_shapes"][0], record["input_shapes"][1]
    rows = q[0] * q[1] * q[2]
    return rows * k[2], rows


@dataclass(frozen=True)
class StagePart:
    """A calibration stage at one calibration shape: its kernels by group as kernel documents
    (``hlo_analyzer.mapping.kernel_list.sources_document``, collectives kept): ``embed`` before the
    first pair, ``final`` after the last, and each of the three pairs (``_groups``)."""

    groups: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Boundary:
    """Bytes a pipeline stage sends on (name -> bytes of one traced patch, the hidden states
    ``x`` among them) and the latent the last stage sends back (stage 0's input ``z``)."""

    outputs: dict[str, int]
    latent_bytes: int


@dataclass(frozen=True)
class GroupCost:
    """Seconds of a kernel group at the plan's shape: its kernels and its collectives."""

    compute_s: float
    comm_s: float

    def __add__(self, other: GroupCost) -> GroupCost:
        return GroupCost(self.compute_s + other.compute_s, self.comm_s + other.comm_s)

    def __mul__(self, factor: float) -> GroupCost:
        return GroupCost(self.compute_s * factor, self.comm_s * factor)

    def __sub__(self, other: GroupCost) -> GroupCost:
        return GroupCost(self.compute_s - other.compute_s, self.comm_s - other.comm_s)


ZERO = GroupCost(0.0, 0.0)


@dataclass(frozen=True)
class StageCosts:
    """A calibration's groups at the plan's shape on the system (:func:`stage`), with how many
    of the integers they were rescaled from were exact."""

    groups: dict[str, GroupCost]
    inexact: int
    values: int

    def outside(self, role: str) -> GroupCost:
        """The kernels outside the pairs of a stage of ``role``: a pipeline's first stage holds
        the embeddings, its last the final layer, a flat stage both, a middle stage neither."""
        g = self.groups
        embed, final = g["embed"], g["final"]
        return {"flat": embed + final, "first": embed, "middle": ZERO, "last": final}[role]

    def pairs(self, count: int) -> GroupCost:
        """``count`` pairs of a stage: the first and the last pair of the calibration (their
        boundaries with the rest of the stage) and ``count - 2`` middle ones; one pair alone
        has both boundaries: first + last - middle."""
        g = self.groups
        if count == 1:
            return g["pair0"] + g["pair2"] - g["pair1"]
        return g["pair0"] + g["pair2"] + g["pair1"] * (count - 2)


@dataclass(frozen=True)
class Calibration:
    """A calibration's kernel groups at both shapes."""

    key: CalibrationKey
    hardware_kind: str
    base: StagePart | None
    scaled: StagePart | None
    #: The tracer's line when the calibration could not be traced (no parts then).
    error: str | None = None


def _model_toml(model: STDiT3Config, depth: int) -> str:
    lines = []
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name == "depth":
            value = depth
        if isinstance(value, bool):
            lines.append(f"{field.name} = {'true' if value else 'false'}")
        elif isinstance(value, (tuple, list)):
            lines.append(f"{field.name} = [{', '.join(str(v) for v in value)}]")
        elif isinstance(value, str):
            lines.append(f"{field.name} = {json.dumps(value)}")
        else:
            lines.append(f"{field.name} = {value!r}")
    return "\n".join(lines) + "\n"


#: The strategy and mesh of a boundary calibration (the boundary tensors are global shapes:
#: any layout gives them).
BOUNDARY_LAYOUT = ("none", (1, 1))


class KernelCosts:
    """The traced-kernel estimate's calibrations, traced on demand and cached under ``work``
    (``work/calibrations``), and their costs at a shape on a system, cached in memory.
    ``jobs``: calibration processes at once (each loads torch once)."""

    def __init__(self, work: Path, *, jobs: int = 1) -> None:
        self.work = Path(work) / "calibrations"
        self.jobs = jobs
        self._calibrations: dict[tuple[CalibrationKey, str], Calibration] = {}
        self._costs: dict[tuple, StageCosts] = {}
        self._boundaries: dict[tuple, Boundary] = {}
        self.traced = 0

    def key(self, config: str, shape: str, strategy: str, mesh: tuple[int, int], ring: int | None,
            patches: int) -> CalibrationKey:
        model = get_config(config)
        devices = mesh[0] * mesh[1]
        found = calibration_geometry(model, shape, devices)
        return CalibrationKey(config, strategy, tuple(mesh), ring, patches, found.base, found.scaled,
                              forced_flash(model, shape, patches, devices))

    def _path(self, key: CalibrationKey, kind: str) -> Path:
        return self.work / kind / f"{key.name}.json"

    # -- tracing and analyzing ----------------------------------------------------------------
    def calibration(self, key: CalibrationKey, system: SystemSpec) -> Calibration:
        kind = system.chip.name
        cached = self._calibrations.get((key, kind))
        if cached is None:
            if not self._path(key, kind).exists():
                self.prepare([key], system)
            cached = self._calibrations[(key, kind)] = _read_calibration(self._path(key, kind), key, kind)
        return cached

    def prepare(self, keys: Sequence[CalibrationKey], system: SystemSpec, *, boundaries: bool = True,
                progress: Callable[[int, int], None] | None = None) -> int:
        """Trace (``jobs`` processes of ``tracing.calibrate``) and analyze every calibration of
        ``keys`` not cached yet, and (``boundaries``: for pipelines) the boundary calibration of
        each (model, shapes, patches); the number of trace requests run. ``progress(done,
        total)`` as the traces are written."""

        kind = system.chip.name
        missing = list(dict.fromkeys(k for k in keys if not self._path(k, kind).exists()))
        boundaries = list(dict.fromkeys(self._boundary_key(k) for k in keys)) if boundaries else []
        requests = [r for key in missing for r in self._requests(key, stages=(0,))[1]]
        requests += [r for key in boundaries for r in self._requests(key, stages=(0,), boundary=True)[1]]
        if not requests:
            return 0
        analyze = functools.partial(_calibrate_key, system=system, kind=kind)
        dumps_of = {key: self._requests(key, stages=(0,))[0] for key in missing}
        pending = {key: set(dumps.values()) for key, dumps in dumps_of.items()}
        owner = {dump: key for key, dumps in dumps_of.items() for dump in dumps.values()}

        def written(request: dict[str, Any]) -> None:
            """Analyze a key as soon as both its traces are written, here, beside the traces
            still running (a core the tracing process leaves)."""
            for dump in _request_files(request)[1][:1]:
                key = owner.get(str(dump))
                if key is None:
                    continue
                pending[key].discard(str(dump))
                if not pending[key]:
                    self._write(analyze((key, dumps_of[key])), kind)

        traced = run_calibration_traces(requests, self.work, jobs=self.jobs, progress=progress, written=written)
        self.traced += traced
        missing = [key for key in missing if not self._path(key, kind).exists()]
        work = [(key, dumps_of[key]) for key in missing]
        if self.jobs > 1 and len(work) > 1:
            import concurrent.futures
            import multiprocessing

            from hlo_analyzer.mlir import use_fresh_context

            # forked workers: each makes an MLIR context of its own (this process's may hold a
            # thread pool that did not fork)
            with concurrent.futures.ProcessPoolExecutor(
                    self.jobs, mp_context=multiprocessing.get_context("fork"), initializer=use_fresh_context) as pool:
                calibrations = list(pool.map(analyze, work))
        else:
            calibrations = [analyze(item) for item in work]
        for calibration in calibrations:
            self._write(calibration, kind)
        return traced

    def _write(self, calibration: Calibration, kind: str) -> None:
        path = self._path(calibration.key, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(_calibration_document(calibration)) + "\n", force=True)

    def _boundary_key(self, key: CalibrationKey) -> CalibrationKey:
        strategy, mesh = BOUNDARY_LAYOUT
        return dataclasses.replace(key, strategy=strategy, mesh=mesh, ring=None, flash=None)

    def _requests(self, key: CalibrationKey, *, stages: Sequence[int], boundary: bool = False,
                  ) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """The dump of the calibration's stage per shape, and the tracer's requests for them: one
        stage of ``CALIBRATION_PAIRS`` pairs; a boundary calibration: stage 0 of two one-pair
        stages (its outputs are what a pipeline stage sends on)."""
        depth = 2 if boundary else CALIBRATION_PAIRS
        stage_ids = "0-0,1-1" if boundary else f"0-{CALIBRATION_PAIRS - 1}"
        model_file = self._model_file(key.config, depth)
        dumps, requests = {}, []
        for label, shape in (("base", key.base_shape), ("scaled", key.scaled_shape)):
            out = self.work / "dumps" / (("boundary_" if boundary else "") + key.name) / label
            request = {"config": model_file, "shape": shape, "strategy": key.strategy,
                       "mesh": list(key.mesh), "ring": key.ring, "patches": key.patches,
                       "stage_ids": stage_ids, "stages": list(stages), "out": str(out),
                       "flash": None if key.flash is None else list(key.flash)}
            dumps[label] = str(out / dump_names(request)[0])
            requests.append(request)
        return dumps, requests

    def _model_file(self, config: str, depth: int) -> str:
        model = get_config(config)
        path = self.work / "models" / f"{Path(config).stem}_depth{depth}.toml"
        text = _model_toml(model, depth)
        if not path.exists() or path.read_text() != text:

            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text, force=True)
        return str(path)

    # -- the costs ----------------------------------------------------------------------------
    def stage(self, key: CalibrationKey, shape: str, system: SystemSpec) -> StageCosts:
        """The calibration's kernel groups at ``shape`` on ``system`` (cached)."""
        cache_key = (key, shape, system.name, id(system))
        cost = self._costs.get(cache_key)
        if cost is None:
            cost = self._costs[cache_key] = _stage_costs(self.calibration(key, system), shape, system)
        return cost

    def boundary(self, key: CalibrationKey, shape: str) -> Boundary:
        """What a pipeline stage of ``key``'s model, shapes and patches sends on, at ``shape``."""
        bkey = self._boundary_key(key)
        cached = self._boundaries.get((bkey, shape))
        if cached is None:
            dumps, requests = self._requests(bkey, stages=(0,), boundary=True)
            if not all(Path(d).exists() for d in dumps.values()):
                run_calibration_traces(requests, self.work, jobs=1)
            parts = {label: _boundary_of(dump) for label, dump in dumps.items()}
            rescaler = key.rescaler(shape)
            cached = self._boundaries[(bkey, shape)] = Boundary(
                rescaler(parts["base"].outputs, parts["scaled"].outputs),
                rescaler(parts["base"].latent_bytes, parts["scaled"].latent_bytes))
        return cached


def run_calibration_traces(requests: Sequence[dict[str, Any]], work: Path, *, jobs: int = 1,
                           progress: Callable[[int, int], None] | None = None,
                           written: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Trace the stages of ``requests`` with ``python -m tracing.calibrate`` (``jobs``
    processes, each loading torch once and taking every ``jobs``-th request); the number of
    requests run. ``progress(done, total)``: called while they run, each time another request's
    dumps are written (a dump and its sidecar, each written whole: an interrupted run leaves
    none half written, and the next one traces only what is missing); ``written(request)`` then
    for each such request (its analysis can run here, beside the traces). UsageError with the
    tracer's last line when one fails as a whole."""
    import os
    import subprocess
    import tempfile

    missing = [r for r in requests if not _request_done(_request_files(r))]
    if not missing:
        return 0
    work.mkdir(parents=True, exist_ok=True)
    environment = tracer_environment()
    log.info("tracing %d calibration requests in %d process(es)", len(missing), jobs)
    listings, processes, logs = [], [], []
    try:
        for job in range(min(jobs, len(missing))):
            listing = work / f"requests.{os.getpid()}.{job}.json"
            atomic_write(listing, json.dumps(missing[job::jobs]), force=True)
            listings.append(listing)
            logs.append(tempfile.TemporaryFile("w+"))  # a pipe would fill with the traces' progress
            processes.append(subprocess.Popen(CalibrationTrace(listing).command(),
                                              stdout=subprocess.DEVNULL, stderr=logs[-1], text=True,
                                              env=environment))
        codes = _wait_reporting(processes, missing, progress, written)
        errors = []
        for code, stream in zip(codes, logs, strict=True):
            stream.seek(0)
            errors.append((code, stream.read()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        for listing in listings:
            listing.unlink(missing_ok=True)
        for stream in logs:
            stream.close()
    for code, stderr in errors:
        if code:
            lines = [line for line in stderr.splitlines() if line.startswith("Error:")] or \
                stderr.strip().splitlines()[-1:] or [f"exit code {code}"]
            raise UsageError(f"calibration trace failed: {lines[-1].removeprefix('Error: ')}")
    return len(missing)


def tracer_environment() -> dict[str, str]:
    """The environment of a ``tracing.calibrate`` process: this checkout first on its path."""
    import os

    root = str(Path(__file__).resolve().parent.parent)
    return child_environment({**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])})


#: Seconds between two looks at the calibration traces written so far (``progress``).
PROGRESS_POLL_S = 0.5


def _request_files(request: dict[str, Any]) -> tuple[Path, list[Path]]:
    """A request's failure record and the files of its traced stages (each dump and sidecar)."""
    out = Path(request["out"])
    dumps = [out / name for name in dump_names(request)]
    return failure_file(request), [*dumps, *(dump.with_suffix(".json") for dump in dumps)]


def _request_done(files: tuple[Path, list[Path]]) -> bool:
    failure, written = files
    return failure.exists() or all(path.exists() for path in written)


def _wait_reporting(processes: Sequence[Any], requests: Sequence[dict[str, Any]],
                    progress: Callable[[int, int], None] | None,
                    written: Callable[[dict[str, Any]], None] | None) -> list[int]:
    """Wait for ``processes``; meanwhile ``progress(done, total)`` and ``written(request)`` as
    requests' files appear."""
    import time

    pending = [(request, _request_files(request)) for request in requests]
    done = 0
    while True:
        running = any(process.poll() is None for process in processes)
        if progress is not None or written is not None:
            finished = [request for request, files in pending if _request_done(files)]
            pending = [(request, files) for request, files in pending if not _request_done(files)]
            done += len(finished)
            if progress is not None:
                progress(done, len(requests))
            for request in finished if written is not None else ():
                written(request)
        if not running:
            return [process.wait() for process in processes]
        time.sleep(PROGRESS_POLL_S)


def _calibrate_key(item: tuple[CalibrationKey, dict[str, str]], *, system: SystemSpec,
                   kind: str) -> Calibration:
    """The calibration of a key from its traced stage at both shapes (or the tracer's error)."""
    key, dumps = item
    failures = [Path(dump).parent / FAILURE_FILE for dump in dumps.values()]
    failed = [f.read_text().strip() for f in failures if f.exists()]
    if failed:
        return Calibration(key, kind, None, None, error=failed[0])
    return Calibration(key, kind, analyze_calibration_stage(dumps["base"], system),
                       analyze_calibration_stage(dumps["scaled"], system))


def _boundary_of(dump: str) -> Boundary:
    from hlo_analyzer.mapping.pipeline import LATENT_INPUT
    from hlo_analyzer.sidecar import stage_sidecar

    sidecar = stage_sidecar(dump, "analyze-pipeline")
    outputs = {tensor.name: tensor.nbytes for tensor in sidecar.outputs}
    latent = sidecar.input(LATENT_INPUT)
    return Boundary(outputs, 0 if latent is None else latent.nbytes)


def analyze_calibration_stage(dump: str, system: SystemSpec, *, defer: bool = True) -> StagePart:
    """The kernels of a calibration stage as ``analyze-pipeline`` finds them on ``system``'s
    chip, by group (:class:`StagePart`), with each GEMM epilogue that the sizes decide left
    pending (``defer``: ``AnalysisOptions.defer_epilogues``): the rescaled documents decide it at
    the plan's shape, so both shapes have the same kernels whichever way it goes at either."""
    from hlo_analyzer.mapping.analysis import AnalysisOptions, analyze_dump
    from hlo_analyzer.mapping.kernel_list import sources_document
    from hlo_analyzer.sidecar import stage_sidecar

    analysis = analyze_dump(dump, Hardware(system.name, system),
                            AnalysisOptions(steps=1, pairs=CALIBRATION_PAIRS, defer_epilogues=defer),
                            sidecar=stage_sidecar(dump, "analyze-pipeline"))
    mapping, options = analysis.mapping, analysis.options
    if mapping.totals.pairs_found != CALIBRATION_PAIRS:
        raise UsageError(f"{dump}: a calibration stage must hold {CALIBRATION_PAIRS} block pairs, found "
                         f"{mapping.totals.pairs_found}")
    groups = _groups(mapping.program.sources, mapping.pair_of)
    return StagePart({name: sources_document(kernels, options.execution) for name, kernels in groups.items()})


def _groups(sources: Sequence[Any], pair_of: Sequence[int | None]) -> dict[str, list[Any]]:
    """The kernels by group (:class:`StagePart`), in program order. A kernel outside every
    pair that runs among them (a pair's modulation from the timestep, which reads no token:
    the block segmentation leaves it out) goes with the pair of the next pair kernel: a stage
    of many pairs runs one such run per pair."""
    inside = [i for i, pair in enumerate(pair_of) if pair is not None]
    first, last = inside[0], inside[-1]
    groups: dict[str, list[Any]] = {name: [] for name in GROUPS}
    following = None
    for index in range(len(sources) - 1, -1, -1):  # backwards: the next pair kernel is known
        pair = pair_of[index]
        if pair is not None:
            following = pair
            groups[f"pair{pair}"].append(sources[index])
        elif index < first:
            groups["embed"].append(sources[index])
        elif index > last:
            groups["final"].append(sources[index])
        else:
            groups[f"pair{following}"].append(sources[index])
    return {name: kernels[::-1] for name, kernels in groups.items()}


def _stage_costs(calibration: Calibration, shape: str, system: SystemSpec) -> StageCosts:
    from hlo_analyzer.mapping.kernel_list import sources_from_document
    from hlo_analyzer.mapping.program import map_kernels
    from hlo_analyzer.mapping.results import NETWORK_KIND, MappingOptions

    key = calibration.key
    if calibration.error is not None or calibration.base is None or calibration.scaled is None:
        raise ValueError(f"calibration not traced: {calibration.error}")
    rescaler = key.rescaler(shape)
    groups = {}
    for name in GROUPS:
        document = rescaler(calibration.base.groups[name], calibration.scaled.groups[name])
        sources, execution = sources_from_document(document)
        program = map_kernels(sources, system.chip, system, MappingOptions(execution=execution))
        comm = sum(op.latency_s for op in program.ops if op.kind == NETWORK_KIND)
        groups[name] = GroupCost(program.latency_s - comm, comm)
    return StageCosts(groups, rescaler.inexact, rescaler.values)


def _calibration_document(calibration: Calibration) -> dict[str, Any]:
    return {"version": CACHE_VERSION, "key": dataclasses.asdict(calibration.key),
            "hardware_kind": calibration.hardware_kind, "error": calibration.error,
            "base": None if calibration.base is None else calibration.base.groups,
            "scaled": None if calibration.scaled is None else calibration.scaled.groups}


def _read_calibration(path: Path, key: CalibrationKey, kind: str) -> Calibration:
    document = json.loads(path.read_text())
    if document.get("version") != CACHE_VERSION:
        raise UsageError(f"{path}: calibration cache version {document.get('version')!r}; expected "
                         f"{CACHE_VERSION} (delete the file to trace it again)")
    base, scaled = document["base"], document["scaled"]
    return Calibration(key, kind, None if base is None else StagePart(base),
                       None if scaled is None else StagePart(scaled), error=document.get("error"))


def stage_roles(stages: int) -> Sequence[str]:
    """The role of each stage of a plan of ``stages`` stages."""
    if stages == 1:
        return ("flat",)
    return ("first", *["middle"] * (stages - 2), "last")
