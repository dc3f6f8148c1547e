"""``plan-search --model``: the fastest parallel layout of a ``trace-module`` model (the video
DiTs of ``models/zoo/videodit``, or a user's ``pkg.module:factory`` with a role map) at a shape
on a system, estimated for every layout and traced for the best few (docs/plan_search.md,
"Any model: --model").

**The space.** A *layout* is a strategy at a degree (``Layout``): for the video DiTs xDiT's
strategies as ``models.zoo.videodit.plans`` writes them (Ulysses, ring, USP, tensor parallel,
CFG parallel and CFG x Ulysses; PipeFusion where the zoo has its plan), for a user model those
its role map allows (``tp`` with ``--column``/``--row``, ``ulysses`` with ``--qkv``/
``--attn-out``, ``dp`` over the batch). By default the layouts that use every device; the
feasibility rules (``SearchModel.refusal``: heads, FFN width and tokens divisible, a CFG batch)
refuse the others with a reason, before anything is traced.

**The estimate.** Every dimension of one call of these models is a polynomial of degree at
most 2 in one variable ``T`` (the latent frames of a video; a user model's ``T`` input
dimension): tokens are ``c T``, a joint text + video sequence ``c T + L`` and its attention's
scores ``(c T + L)^2``. So each part of a layout (``configs.parts``: one block of each kind,
and one more of each) is traced at three other values of ``T`` (:func:`calibration_values`:
as divisible by the layout's devices as the plan's ``T``, so the same splits and pads happen),
every integer of its kernel list (shapes, FLOPs, bytes of each collective) is interpolated
exactly at the plan's ``T`` (:func:`interpolate`: Lagrange on three points; a value that is
no such polynomial is rounded and counted as inexact), the kernels costed on the system with
``hlo_analyzer.mapping.program.map_kernels`` (what ``analyze-hlo --hw`` runs), and the whole
model is the parts scaled by the layer counts (``configs.scaled``). (``planning.plan_estimate``
rescales STDiT3 as products of powers of two variables from two shapes; a joint sequence
``c T + L`` is no such product, hence three points and a polynomial here.)
The calibrations are cached under the work directory by what decides them, so another frame
count at the same resolution (or another system) re-costs them without tracing.

**The traced check.** The best ``budget`` layouts by estimate are traced at full size (each
part at the plan's ``T``), analyzed on the system and scaled the same way: the method
``tests/test_videodit_blocks.py`` checked against whole reduced models. The answer is the
fastest *traced* layout that fits the chip's memory; the estimate/traced ratio of each traced
layout is reported. Every trace runs in one process (``tracing.module_batch``) under the
user's trace lock.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from hardware.systems import resolve_system
from hlo_trace.atomic import atomic_write
from hlo_trace.errors import UsageError
from hlo_trace.isolate import child_environment
from models.zoo.videodit import plans as zoo_plans
from models.zoo.videodit.configs import MODELS, VideoDiT, part_kwargs, parts, peak, scaled
from planning.trace_process import ModuleTraces
from plans.module_plan import MODEL_DTYPES, parse_factory, parse_input

__all__ = ["CALIBRATION_POINTS", "Estimate", "Layout", "ModuleSearchResult", "Outcome", "PartFigures",
           "SearchModel", "UserModel", "ZooModel", "calibration_values", "enumerate_layouts",
           "interpolate", "interpolate_value", "search_model", "zoo_model"]

#: Points of the calibration polynomial: degree 2 (an attention's scores over ``c T + L`` tokens).
CALIBRATION_POINTS = 3
#: The smallest calibration value of ``T`` (a dimension of 1 may lower to another kernel).
MIN_CALIBRATION_VALUE = 2
#: Layouts traced at full size by default: the best by estimate and the next ones.
DEFAULT_BUDGET = 3
#: The dtype of the traced programs (the official samplers run the transformers in bfloat16).
DTYPE = "bfloat16"
#: Strategies that a zoo model may run, beside ``plans.STRATEGIES`` (a place for PipeFusion:
#: refused with this reason until ``models/zoo/videodit/plans.py`` writes its plan).
PLANNED = {"pipefusion": "PipeFusion: no plan for the video DiTs yet (models/zoo/videodit/plans.py)"}
#: A user model's strategies and the roles each needs.
USER_STRATEGIES = {"tp": ("column", "row"), "ulysses": ("qkv", "attn_out"), "dp": ()}
#: Seconds between two looks at the traces written so far (progress).
PROGRESS_POLL_S = 2.0
#: The variable dimension of a user model's ``--input`` shapes.
VARIABLE = "T"


# -- layouts ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """A strategy at a degree (per CFG branch) on its mesh; ``none``: one device."""

    strategy: str
    degree: int
    mesh: tuple[int, ...]

    @property
    def devices(self) -> int:
        return math.prod(self.mesh)

    @property
    def label(self) -> str:
        if self.strategy == "none":
            return "one device"
        if self.strategy == "usp":
            return f"usp ring={self.mesh[1]} x ulysses={self.mesh[2]}"
        if self.strategy == "cfg_ulysses":
            return f"cfg=2 x ulysses={self.degree}"
        return "cfg=2" if self.strategy == "cfg" else f"{self.strategy}={self.degree}"

    @property
    def tag(self) -> str:
        return "none" if self.strategy == "none" else f"{self.strategy}{self.degree}"


# -- the models ---------------------------------------------------------------------------------------
class SearchModel:
    """What the search needs of a model: its parts and layer counts, one call's inputs at a
    value ``t`` of the variable, the plan of a layout, and why a layout cannot run."""

    name: str
    factory: str
    variable: int
    steps: int
    dtype: str = DTYPE

    def parts(self) -> tuple[str, ...]:
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        raise NotImplementedError

    def kwargs(self, part: str, layout: Layout) -> dict[str, Any]:
        raise NotImplementedError

    def inputs(self, t: int) -> list[str]:
        raise NotImplementedError

    def plan(self, layout: Layout) -> str | None:
        raise NotImplementedError

    def strategies(self) -> tuple[str, ...]:
        raise NotImplementedError

    def layout(self, strategy: str, degree: int) -> Layout:
        raise NotImplementedError

    def refusal(self, layout: Layout) -> str | None:
        raise NotImplementedError

    def cannot_run(self, strategy: str) -> str | None:
        """Why the model cannot run ``strategy`` at any degree (None: it can)."""
        raise NotImplementedError


@dataclass
class ZooModel(SearchModel):
    """A video DiT of ``models/zoo/videodit`` at a video shape (frames, height, width)."""

    config: VideoDiT
    frames: int
    height: int
    width: int

    def __post_init__(self) -> None:
        self.name, self.factory = self.config.name, self.config.factory
        self.variable = self.config.latent(self.frames, self.height, self.width)[0]
        self.steps = self.config.steps
        t, h, w = self.config.latent(self.frames, self.height, self.width)
        _, ph, pw = self.config.patch
        if h % ph or w % pw or h < ph or w < pw:
            raise UsageError(f"--shape {self.frames}x{self.height}x{self.width}: the latent "
                             f"{h} x {w} is no multiple of the patch {ph} x {pw} (height and width "
                             f"multiples of {ph * self.config.vae_stride[1]})")
        self.tokens_per_frame = (h // ph) * (w // pw)

    def parts(self) -> tuple[str, ...]:
        return parts(self.config.blocks)

    def counts(self) -> dict[str, int]:
        return self.config.counts()

    def kwargs(self, part: str, layout: Layout) -> dict[str, Any]:
        kwargs = part_kwargs(self.config.kwargs, self.config.blocks, part)
        if layout.strategy != "none":
            kwargs.update(zoo_plans.factory_kwargs(layout.strategy, layout.degree))
            if self.config.model == "wan21":  # cross-attention: no joint sequence to order
                kwargs.pop("chunks")
        return kwargs

    def inputs(self, t: int) -> list[str]:
        st = self.config.vae_stride[0]
        return self.config.inputs((t - 1) * st + 1, self.height, self.width, DTYPE)

    def plan(self, layout: Layout) -> str | None:
        if layout.strategy == "none":
            return None
        return zoo_plans.plan_toml(self.config.model, layout.strategy, layout.degree)

    def strategies(self) -> tuple[str, ...]:
        return (*zoo_plans.STRATEGIES, *PLANNED)

    def layout(self, strategy: str, degree: int) -> Layout:
        if strategy in PLANNED:
            return Layout(strategy, degree, (degree,))
        return Layout(strategy, degree, zoo_plans.mesh(strategy, degree))

    def cannot_run(self, strategy: str) -> str | None:
        if strategy in PLANNED:
            return PLANNED[strategy]
        if strategy.startswith("cfg") and self.config.batch != 2:
            return f"{self.name} uses embedded guidance (a batch of one): no CFG parallel"
        return None

    def refusal(self, layout: Layout) -> str | None:
        s, n = layout.strategy, layout.degree
        kw = self.config.kwargs
        heads = kw["heads"]
        if s == "usp" and (n % 2 or n < 4):
            return f"usp: degree {n} is no even number of at least 4"
        split = {"ulysses": n, "cfg_ulysses": n, "usp": n // 2, "tp": n}.get(s)
        if split is not None and heads % split:
            return f"{heads} heads: not divisible by {split}"
        if s == "tp":
            widths = {"ffn": kw.get("ffn") or 4 * kw.get("dim", heads * kw.get("head_dim", 0))}
            bad = [f"{name} {w}" for name, w in widths.items() if w % n]
            if bad:
                return f"{', '.join(bad)}: not divisible by {n}"
        if s in ("ulysses", "cfg_ulysses", "ring", "usp"):
            return self._tokens_refusal(n)
        return None

    def _tokens_refusal(self, n: int) -> str | None:
        if self.config.model == "cogvideox":  # pads each token set to a multiple of n
            return None
        video = self.variable * self.tokens_per_frame
        if video % n:
            return f"{video} video tokens: not divisible by {n}"
        if self.config.model == "hunyuan_video" and self.config.text_tokens % n:
            return f"{self.config.text_tokens} text tokens: not divisible by {n}"
        return None


@dataclass
class UserModel(SearchModel):
    """A user's ``pkg.module:factory`` traced whole: its ``--input`` specs with ``T`` in the
    dimension that scales, and a map from the strategies' roles to its layer names."""

    factory: str
    factory_kwargs: dict[str, Any]
    templates: tuple[str, ...]
    variable: int
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    steps: int = 1

    def __post_init__(self) -> None:
        parse_factory(self.factory)
        module, _, attribute = self.factory.partition(":")
        self.name = f"{module.rsplit('.', 1)[-1]}_{attribute.rsplit('.', 1)[-1]}"
        specs = [parse_input(self._substitute(template, 2)) for template in self.templates]
        # the weights in the floating inputs' type (as trace-module --dtype takes it)
        self.dtype = next((s.dtype for s in specs if s.dtype in MODEL_DTYPES), "float32")
        if not any(self._variable_dims(t) for t in self.templates):
            raise UsageError(f"--input: no input has the dimension {VARIABLE} that --shape sets "
                             f"(e.g. --input x=2x{VARIABLE}x64:float32 --shape 4096)")

    @staticmethod
    def _substitute(template: str, t: int) -> str:
        name, _, rest = template.partition("=")
        shape, _, dtype = rest.rpartition(":")
        return f"{name}={'x'.join(str(t) if d == VARIABLE else d for d in shape.split('x'))}:{dtype}"

    @staticmethod
    def _variable_dims(template: str) -> list[int]:
        shape = template.partition("=")[2].rpartition(":")[0]
        return [i for i, d in enumerate(shape.split("x")) if d == VARIABLE]

    def parts(self) -> tuple[str, ...]:
        return ("base",)

    def counts(self) -> dict[str, int]:
        return {}

    def kwargs(self, part: str, layout: Layout) -> dict[str, Any]:
        return dict(self.factory_kwargs)

    def inputs(self, t: int) -> list[str]:
        return [self._substitute(template, t) for template in self.templates]

    def strategies(self) -> tuple[str, ...]:
        return tuple(USER_STRATEGIES)

    def layout(self, strategy: str, degree: int) -> Layout:
        return Layout(strategy, degree, (1, degree))

    def cannot_run(self, strategy: str) -> str | None:
        if strategy not in USER_STRATEGIES:
            return (f"{strategy} needs a model written for it (the zoo's video DiTs); a user model "
                    f"runs {', '.join(USER_STRATEGIES)}")
        missing = [role for role in USER_STRATEGIES[strategy] if not self.roles.get(role)]
        if missing:
            return f"{strategy} needs the role map {', '.join('--' + r.replace('_', '-') for r in missing)}"
        return None

    def refusal(self, layout: Layout) -> str | None:
        n = layout.degree
        for template in self.templates:
            spec = parse_input(self._substitute(template, self.variable))
            if layout.strategy == "dp" and spec.shape and spec.shape[0] % n:
                return f"input {spec.name}: batch {spec.shape[0]} not divisible by {n}"
            if layout.strategy == "ulysses" and any(spec.shape[d] % n for d in self._variable_dims(template)):
                return f"input {spec.name}: {VARIABLE} = {self.variable} not divisible by {n}"
        return None

    def plan(self, layout: Layout) -> str | None:
        if layout.strategy == "none":
            return None
        text = f"[mesh]\nshape = [1, {layout.degree}]\naxes = [\"x\", \"y\"]\n\n"
        return text + {"tp": self._tp, "ulysses": self._ulysses, "dp": self._dp}[layout.strategy]()

    @staticmethod
    def _pattern(name: str, suffix: str = "") -> str:
        return f"re:(.*\\.)?{re.escape(name)}{suffix}"

    def _tp(self) -> str:
        text = ""
        for name in self.roles["column"]:
            text += _rule("parameters", "pattern", self._pattern(name, r"\.weight"), '["y", "none"]')
        for name in self.roles["row"]:
            text += _rule("parameters", "pattern", self._pattern(name, r"\.weight"), '["none", "y"]')
        return text

    def _ulysses(self) -> str:
        text = self._split_inputs(lambda dims, rank: dims)
        for name in self.roles["qkv"]:
            text += _rule("activations", "module", self._pattern(name), '["none", "y", "none"]',
                          then='["none", "none", "y"]')
        for name in self.roles["attn_out"]:
            text += _rule("activations", "module", self._pattern(name), '["none", "none", "y"]',
                          then='["none", "y", "none"]', where="input")
        return text

    def _dp(self) -> str:
        return self._split_inputs(lambda dims, rank: [0] if rank else [])

    def _split_inputs(self, chosen: Callable[[list[int], int], list[int]]) -> str:
        text = ""
        for template in self.templates:
            spec = parse_input(self._substitute(template, 2))
            dims = chosen(self._variable_dims(template), len(spec.shape))[:1]
            if dims:
                entries = ", ".join('"y"' if d == dims[0] else '"none"' for d in range(len(spec.shape)))
                text += _rule("inputs", "name", spec.name, f"[{entries}]")
        return text


def _rule(section: str, key: str, pattern: str, spec: str, *, then: str | None = None,
          where: str | None = None) -> str:
    """One ``[[section]]`` table of a plan (a column layer's bias stays whole: GSPMD slices it
    to the split output)."""
    text = f"[[{section}]]\n{key} = '{pattern}'\nspec = {spec}\n"
    text += f"then = {then}\n" if then else ""
    return text + (f'where = "{where}"\n' if where else "") + "\n"


def zoo_model(name: str, shape: str) -> ZooModel:
    """A video DiT by its configuration's name (``configs.MODELS``; ``wan21`` is the 14B) at
    ``FRAMESxHEIGHTxWIDTH``."""
    config = MODELS.get({"wan21": "wan21_14b", "cogvideox": "cogvideox_5b"}.get(name, name))
    if config is None:
        raise UsageError(f"--model {name}: expected a zoo video DiT ({', '.join(MODELS)}) or an "
                         "import path pkg.module:factory")
    match = re.fullmatch(r"(\d{1,5})x(\d{1,5})x(\d{1,5})", shape or "")
    if match is None:
        raise UsageError(f"--shape {shape}: expected FRAMESxHEIGHTxWIDTH, e.g. 129x720x1280")
    frames, height, width = (int(v) for v in match.groups())
    if frames < 1 or (frames - 1) % config.vae_stride[0]:
        raise UsageError(f"--shape {shape}: {frames} frames; the VAE expects 1 + a multiple of "
                         f"{config.vae_stride[0]} (e.g. 49, 81, 129)")
    return ZooModel(config, frames, height, width)


def enumerate_layouts(model: SearchModel, devices: int, strategies: Sequence[str] | None = None,
                      *, all_devices: bool = True) -> tuple[list[Layout], list[tuple[str, str]]]:
    """The layouts of ``strategies`` (default: every one the model runs) on ``devices`` (with
    ``all_devices``, only those using every device; else any that fits), and those refused
    with the reason. A strategy the model cannot run at all is an error when asked for."""
    chosen = list(strategies) if strategies is not None else list(model.strategies())
    known = tuple(dict.fromkeys((*zoo_plans.STRATEGIES, *PLANNED, *USER_STRATEGIES)))
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        raise UsageError(f"--strategies {unknown[0] if unknown else '(none)'}: expected some of {', '.join(known)}")
    if strategies is not None:
        for strategy in chosen:
            reason = model.cannot_run(strategy)
            if reason is not None:
                raise UsageError(f"--strategies {strategy}: {model.name} cannot run it ({reason})")
    layouts, refused = [], []
    for strategy in chosen:
        reason = model.cannot_run(strategy)
        if reason is not None:
            refused.append((strategy, reason))
            continue
        for degree in range(1, devices + 1):
            layout = _layout_or_none(model, strategy, degree)
            if layout is None or layout.devices > devices or (all_devices and layout.devices != devices):
                continue
            if layout.devices == 1 and strategy not in ("cfg",):
                continue  # one device is the ``none`` layout's
            why = model.refusal(layout)
            (refused.append((layout.label, why)) if why else layouts.append(layout))
    if not all_devices or devices == 1:
        layouts.insert(0, Layout("none", 1, (1,)))
    return layouts, refused


def _layout_or_none(model: SearchModel, strategy: str, degree: int) -> Layout | None:
    if strategy == "cfg" and degree != 2:
        return None
    try:
        return model.layout(strategy, degree)
    except ValueError:  # usp at an odd degree: no mesh
        return None


# -- the calibration polynomial ----------------------------------------------------------------------
def calibration_values(target: int, modulus: int, count: int = CALIBRATION_POINTS) -> tuple[int, ...]:
    """``count`` values of the variable other than ``target``, each congruent to it modulo
    ``modulus`` (the layout's devices: every split and pad of ``c t`` by a divisor of the
    devices is then the plan's), at least :data:`MIN_CALIBRATION_VALUE`, smallest first."""
    value = target % modulus or modulus
    found: list[int] = []
    while len(found) < count:
        if value >= MIN_CALIBRATION_VALUE and value != target:
            found.append(value)
        value += modulus
    return tuple(found)


def interpolate_value(points: Sequence[int], values: Sequence[int], target: int) -> tuple[int, bool]:
    """The polynomial of degree ``len(points) - 1`` through ``(points, values)`` at ``target``
    (Lagrange, exact in fractions), rounded to an integer; and whether it was one."""
    total = Fraction(0)
    for i, (xi, yi) in enumerate(zip(points, values, strict=True)):
        term = Fraction(yi)
        for j, xj in enumerate(points):
            if j != i:
                term *= Fraction(target - xj, xi - xj)
        total += term
    return round(total), total.denominator == 1


class _Interpolator:
    """Interpolates the integers of aligned structures (kernel documents at the calibration
    values); counts the inexact ones."""

    def __init__(self, points: Sequence[int], target: int) -> None:
        self.points, self.target = tuple(points), target
        self.inexact = self.values = 0

    def __call__(self, items: Sequence[Any]) -> Any:
        first = items[0]
        if isinstance(first, bool) or first is None or isinstance(first, float):
            return first
        if isinstance(first, str):
            self.inexact += any(item != first for item in items)
            return first
        if isinstance(first, int):
            value, exact = interpolate_value(self.points, items, self.target)
            self.values += 1
            self.inexact += not exact
            return max(value, 0)
        if isinstance(first, (list, tuple)):
            if any(not isinstance(item, (list, tuple)) or len(item) != len(first) for item in items):
                raise ValueError("the calibration programs differ in a kernel's fields")
            return type(first)(self(column) for column in zip(*items))
        if isinstance(first, dict):
            if any(not isinstance(item, dict) or item.keys() != first.keys() for item in items):
                raise ValueError("the calibration programs differ in a record's fields")
            return {key: self([item[key] for item in items]) for key in first}
        raise TypeError(f"cannot interpolate {type(first).__name__}")


def interpolate(documents: Sequence[Any], points: Sequence[int], target: int) -> tuple[Any, int, int]:
    """Aligned documents at ``points`` -> the document at ``target``, inexact and all values."""
    walker = _Interpolator(points, target)
    return walker(documents), walker.inexact, walker.values


# -- figures of a part ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartFigures:
    """One part's program on the system: one call's seconds (kernels, and collectives among
    them) and one device's memory (weights; inputs and scalars; peak of live activations with
    the attentions fused)."""

    step_s: float
    comm_s: float
    weight_bytes: int
    other_bytes: int
    peak_live_bytes: int


@dataclass(frozen=True)
class Estimate:
    """A layout's whole model (the parts scaled): the sampling loop's seconds and one device's
    memory; ``inexact``: integers of the calibrations that were no polynomial of degree 2."""

    loop_s: float
    comm_s: float
    memory_bytes: float
    inexact: int = 0
    values: int = 0


def whole_model(figures: Mapping[str, PartFigures], counts: Mapping[str, int], steps: int,
                inexact: int = 0, values: int = 0) -> Estimate:
    """The parts scaled by the layer counts (``configs.scaled``; the peak: the largest part's)."""
    def additive(get: Callable[[PartFigures], float]) -> float:
        return scaled({part: get(f) for part, f in figures.items()}, counts)

    base = figures["base"]
    memory = (additive(lambda f: f.weight_bytes) + base.other_bytes
              + peak({part: f.peak_live_bytes for part, f in figures.items()}))
    return Estimate(steps * additive(lambda f: f.step_s), steps * additive(lambda f: f.comm_s), memory,
                    inexact, values)


# -- the search -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    layout: Layout
    estimate: Estimate | None
    traced: Estimate | None = None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.estimate is None or self.traced is None or not self.traced.loop_s:
            return None
        return self.estimate.loop_s / self.traced.loop_s


@dataclass(frozen=True)
class ModuleSearchResult:
    model: str
    shape: str
    hardware: str
    devices: int
    steps: int
    memory_limit_bytes: float
    budget: int
    outcomes: tuple[Outcome, ...]
    refused: tuple[tuple[str, str], ...]
    traces: int
    seconds: float
    lock_wait_s: float = 0.0

    @property
    def traced(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.traced is not None]

    @property
    def best(self) -> Outcome | None:
        fitting = [o for o in self.traced if o.traced.memory_bytes <= self.memory_limit_bytes]
        return min(fitting, key=lambda o: o.traced.loop_s, default=None)

    @property
    def worst_ratio(self) -> float | None:
        ratios = [o.ratio for o in self.traced if o.ratio is not None]
        return max((max(r, 1 / r) for r in ratios), default=None)


class Tracer:
    """The traces and analyses of a search, cached under ``work``: ``trace(requests)`` runs
    the missing ones in one ``tracing.module_batch`` process under the trace lock; ``figures``
    analyzes a dump on the system (cached beside it, per system)."""

    def __init__(self, work: Path, hardware: str, *, lock: bool = True,
                 progress: Callable[[str], None] = lambda line: None) -> None:
        self.work, self.hardware, self.lock, self.progress = Path(work), hardware, lock, progress
        self.traced = 0
        #: seconds spent waiting for the trace lock (other runs' traces)
        self.lock_wait_s = 0.0

    def trace(self, requests: Sequence[dict[str, Any]], what: str) -> None:
        missing = [r for r in requests if not _done(r)]
        if not missing:
            return
        self.progress(f"tracing {what}: {len(missing)} trace{'s' if len(missing) > 1 else ''} ...")
        self.work.mkdir(parents=True, exist_ok=True)
        listing = self.work / f"requests.{id(self)}.json"
        atomic_write(listing, json.dumps(missing), force=True)
        from planning.train_estimate import trace_lock

        waiting = time.perf_counter()
        try:
            with trace_lock() if self.lock else contextlib.nullcontext():
                self.lock_wait_s += time.perf_counter() - waiting
                code, stderr = self._run(ModuleTraces(listing).command(), missing)
        finally:
            listing.unlink(missing_ok=True)
        if code:
            last = [line for line in stderr.splitlines() if line.startswith("Error:")] or \
                stderr.strip().splitlines()[-1:] or [f"exit code {code}"]
            raise UsageError(f"tracing failed: {last[-1].removeprefix('Error: ')}")
        self.traced += len(missing)

    def _run(self, command: list[str], requests: Sequence[dict[str, Any]]) -> tuple[int, str]:
        """Run the tracing process, saying how many of ``requests`` are done as they finish."""
        import tempfile

        with tempfile.TemporaryFile("w+") as log:  # a pipe would fill with the traces' progress
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True,
                                       env=child_environment(_python_path()))
            try:
                shown = 0
                while process.poll() is None:
                    time.sleep(PROGRESS_POLL_S)
                    done = sum(map(_done, requests))
                    if done != shown:
                        shown = done
                        self.progress(f"  traced {done}/{len(requests)}")
            finally:
                if process.poll() is None:
                    process.kill()
            log.seek(0)
            return process.wait(), log.read()

    def kernels(self, dump: Path, devices: int) -> dict[str, Any]:
        """The dump's kernels on the system (a ``sources_document``), its traced step and memory."""
        target = dump.with_name(f"{dump.stem}.{Path(self.hardware).stem}.kernels.json")
        if target.exists():
            return json.loads(target.read_text())
        from hlo_analyzer.mapping.analysis import AnalysisOptions, analyze_dump
        from hlo_analyzer.mapping.kernel_list import sources_document

        analysis = analyze_dump(str(dump), self.hardware, AnalysisOptions(steps=1, attention_memory="fused"))
        mapping, usage = analysis.mapping, analysis.memory.usage
        document = {"kernels": sources_document(mapping.program.sources, analysis.options.execution),
                    "step_s": mapping.program.latency_s,
                    "comm_s": _comm_seconds(mapping.program),
                    "memory": [usage.weight_bytes, usage.input_bytes + usage.scalar_bytes, usage.peak_live_bytes],
                    "devices": devices}
        atomic_write(target, json.dumps(document) + "\n", force=True)
        return document


def _python_path() -> dict[str, str]:
    import os

    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}


def _done(request: dict[str, Any]) -> bool:
    out, name = Path(request["out"]), request["name"]
    if (out / f"{name}.failed.txt").exists():
        return True
    if request.get("modules"):
        return (out / f"{name}.modules.json").exists()
    return (out / f"{name}.mlir").exists() and (out / f"{name}.json").exists()


def _failure(request: dict[str, Any]) -> str | None:
    path = Path(request["out"]) / f"{request['name']}.failed.txt"
    return path.read_text().strip() if path.exists() else None


def _comm_seconds(program: Any) -> float:
    from hlo_analyzer.mapping.results import NETWORK_KIND

    return sum(op.latency_s for op in program.ops if op.kind == NETWORK_KIND)


def _request(model: SearchModel, layout: Layout, part: str, t: int, out: Path) -> dict[str, Any]:
    return {"factory": model.factory, "kwargs": model.kwargs(part, layout), "inputs": model.inputs(t),
            "plan": model.plan(layout), "dtype": model.dtype, "name": f"{layout.tag}_{part}_T{t}", "out": str(out)}


def _out(work: Path, model: SearchModel, layout: Layout) -> Path:
    """Where a layout's dumps live: keyed by the model, its keyword arguments and the inputs'
    shape apart from the variable (the same calibrations serve every value of it)."""
    import hashlib

    key = json.dumps([model.factory, model.kwargs("base", layout), model.inputs(0), model.plan(layout), model.dtype],
                     sort_keys=True, default=str)
    return work / "module-search" / f"{model.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def calibration_requests(model: SearchModel, layout: Layout, work: Path) -> list[dict[str, Any]]:
    out = _out(work, model, layout)
    return [_request(model, layout, part, t, out) for part in model.parts()
            for t in calibration_values(model.variable, layout.devices)]


def full_requests(model: SearchModel, layout: Layout, work: Path) -> list[dict[str, Any]]:
    out = _out(work, model, layout)
    return [_request(model, layout, part, model.variable, out) for part in model.parts()]


def estimate_layout(model: SearchModel, layout: Layout, tracer: Tracer, system: Any) -> Estimate:
    """The layout's estimate from its calibration traces (module docstring)."""
    from hlo_analyzer.mapping.kernel_list import sources_from_document
    from hlo_analyzer.mapping.program import map_kernels
    from hlo_analyzer.mapping.results import MappingOptions

    requests = calibration_requests(model, layout, tracer.work)
    failed = next((f for f in map(_failure, requests) if f), None)
    if failed:
        raise UsageError(failed)
    points = calibration_values(model.variable, layout.devices)
    figures, inexact, values = {}, 0, 0
    for part in model.parts():
        docs = [tracer.kernels(Path(r["out"]) / f"{r['name']}.mlir", layout.devices)
                for r in requests if r["name"].startswith(f"{layout.tag}_{part}_T")]
        document, bad, count = interpolate([d["kernels"] for d in docs], points, model.variable)
        memory, bad_m, count_m = interpolate([d["memory"] for d in docs], points, model.variable)
        inexact, values = inexact + bad + bad_m, values + count + count_m
        sources, execution = sources_from_document(document)
        program = map_kernels(sources, system.chip, system, MappingOptions(execution=execution))
        figures[part] = PartFigures(program.latency_s, _comm_seconds(program), *memory)
    return whole_model(figures, model.counts(), model.steps, inexact, values)


def traced_layout(model: SearchModel, layout: Layout, tracer: Tracer) -> Estimate:
    """The layout's full-size parts, analyzed and scaled by the layer counts."""
    requests = full_requests(model, layout, tracer.work)
    tracer.trace(requests, f"the full-size parts of {layout.label}")
    failed = next((f for f in map(_failure, requests) if f), None)
    if failed:
        raise UsageError(failed)
    figures = {}
    for part, request in zip(model.parts(), requests, strict=True):
        doc = tracer.kernels(Path(request["out"]) / f"{request['name']}.mlir", layout.devices)
        figures[part] = PartFigures(doc["step_s"], doc["comm_s"], *doc["memory"])
    return whole_model(figures, model.counts(), model.steps)


def search_model(model: SearchModel, shape: str, hardware: str, layouts: Sequence[Layout],
                 refused: Sequence[tuple[str, str]], tracer: Tracer, *, devices: int,
                 memory_limit_bytes: float | None = None, budget: int = DEFAULT_BUDGET,
                 clock: Callable[[], float] | None = None) -> ModuleSearchResult:
    """Estimate every layout, trace the ``budget`` best by estimate that fit (and the next ones
    while none of the traced fits), and answer the fastest traced one that fits."""
    clock = clock or time.perf_counter
    started = clock()
    limit = memory_limit_bytes or resolve_system(hardware, devices).system.chip.dram_capacity_bytes
    requests = [r for layout in layouts for r in calibration_requests(model, layout, tracer.work)]
    tracer.trace(requests, f"the calibration parts ({len(layouts)} layouts x {len(model.parts())} parts x "
                 f"{CALIBRATION_POINTS} values of T)")
    outcomes = []
    for index, layout in enumerate(layouts, 1):
        tracer.progress(f"estimating {layout.label} ({index}/{len(layouts)})")
        system = resolve_system(hardware, layout.devices).system
        try:
            outcomes.append(Outcome(layout, estimate_layout(model, layout, tracer, system)))
        except (UsageError, ValueError) as error:
            outcomes.append(Outcome(layout, None, error=str(error)))
    ranked = sorted((o for o in outcomes if o.estimate is not None), key=lambda o: o.estimate.loop_s)
    chosen = [o for o in ranked if o.estimate.memory_bytes <= limit][:budget] or ranked[:budget]
    final = {o.layout: o for o in outcomes}
    tracer.trace([r for o in chosen for r in full_requests(model, o.layout, tracer.work)],
                 f"the full-size parts of the best {len(chosen)} layouts by estimate")
    for outcome in chosen:
        try:
            final[outcome.layout] = Outcome(outcome.layout, outcome.estimate,
                                            traced_layout(model, outcome.layout, tracer))
        except UsageError as error:
            final[outcome.layout] = Outcome(outcome.layout, outcome.estimate, error=str(error))
    order = sorted(final.values(), key=lambda o: (o.estimate is None, o.estimate.loop_s if o.estimate else 0))
    return ModuleSearchResult(model.name, shape, hardware, devices, model.steps, limit, budget,
                              tuple(order), tuple(refused), tracer.traced, clock() - started,
                              tracer.lock_wait_s)


def check_roles(model: UserModel, tracer: Tracer) -> None:
    """Every name of the role map names a layer of the model (one line naming the first that
    does not); the model's factory builds."""
    out = tracer.work / "module-search" / "names"
    key = json.dumps([model.factory, model.factory_kwargs], sort_keys=True, default=str)
    import hashlib

    request = {"modules": True, "factory": model.factory, "kwargs": model.factory_kwargs,
               "name": hashlib.sha256(key.encode()).hexdigest()[:12], "out": str(out)}
    tracer.trace([request], "the model's layer names")
    failed = _failure(request)
    if failed:
        raise UsageError(failed)
    names = json.loads((out / f"{request['name']}.modules.json").read_text())["modules"]
    for role, wanted in model.roles.items():
        for name in wanted:
            if not any(n == name or n.endswith(f".{name}") for n in names):
                sample = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names})[:12])
                raise UsageError(f"--{role.replace('_', '-')} {name}: no layer of {model.factory} is "
                                 f"named {name} (its layers' names: {sample}, ...)")
