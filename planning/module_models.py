"""The models and layouts of ``plan-search --model`` (``planning.module_search``): a video DiT
of ``models/zoo/videodit`` at a video shape (``ZooModel``), or a user's ``pkg.module:factory``
with its inputs and a role map (``UserModel``); the layouts (a strategy at a degree on its mesh)
each can run on a number of devices and why the others cannot (``enumerate_layouts``).
Torch-free: what the search traces is written here as ``trace-module`` requests' parts."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hardware.pipeline import pipefusion_step
from hlo_trace.errors import UsageError
from models.zoo.videodit import plans as zoo_plans
from models.zoo.videodit.configs import MODELS, VideoDiT, part_kwargs, parts, peak, scaled
from plans.module_plan import MODEL_DTYPES, parse_factory, parse_input

__all__ = ["DTYPE", "SINGLE", "USER_STRATEGIES", "VARIABLE", "DeviceMemory", "Layout", "SearchModel", "UserModel",
           "ZooModel", "device_memory", "enumerate_layouts", "pipefusion_loop_s", "pipefusion_memory", "stage_counts",
           "tick_inputs", "zoo_model"]

#: The dtype of the traced programs (the official samplers run the transformers in bfloat16).
DTYPE = "bfloat16"
#: One device: no plan (``trace-module``'s dp shorthand on a 1 x 1 mesh).
SINGLE = "none"
#: A user model's strategies and the roles each needs.
USER_STRATEGIES = {"tp": ("column", "row"), "ulysses": ("qkv", "attn_out"), "dp": ()}
#: The MLP's hidden width over the model width where a configuration names no FFN width
#: (HunyuanVideo and CogVideoX: 4, their released configurations; docs/sources.md, "Video DiTs").
MLP_RATIO = 4
#: The variable dimension of a user model's ``--input`` shapes.
VARIABLE = "T"


# -- layouts ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """A strategy at a degree (per CFG branch) on its mesh; ``SINGLE``: one device. Without a
    mesh, the strategy's (``plans.mesh``; a user model's ``dp``: 1 x degree). PipeFusion runs
    as many patches as stages (M = P, as xDiT's examples do)."""

    strategy: str
    degree: int = 1
    mesh: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.mesh:
            mesh = (1,) if self.strategy == SINGLE else (1, self.degree) if self.strategy == "dp" else \
                zoo_plans.mesh(self.strategy, self.degree)
            object.__setattr__(self, "mesh", tuple(mesh))

    @property
    def devices(self) -> int:
        return math.prod(self.mesh)

    @property
    def stages(self) -> int:
        """PipeFusion's stages (and patches); 1 for the other strategies."""
        return self.mesh[0] if self.strategy in zoo_plans.PIPEFUSION_STRATEGIES else 1

    @property
    def label(self) -> str:
        if self.strategy == SINGLE:
            return "one device"
        if self.strategy == "usp":
            return f"usp ring={self.mesh[1]} x ulysses={self.mesh[2]}"
        if self.strategy == "cfg_ulysses":
            return f"cfg=2 x ulysses={self.degree}"
        if self.strategy == "pipefusion_ulysses":
            return f"pipefusion={self.stages} x ulysses={self.degree}"
        return "cfg=2" if self.strategy == "cfg" else f"{self.strategy}={self.degree}"

    @property
    def degrees(self) -> str:
        """The degree of each parallelism, as ``results/videodit/latency.csv`` writes it."""
        if self.strategy == SINGLE:
            return "1"
        if self.strategy in zoo_plans.PIPEFUSION_STRATEGIES:
            ulysses = f" ulysses={self.degree}" if self.strategy == "pipefusion_ulysses" else ""
            return f"pipefusion={self.stages} patches={self.stages}{ulysses}"
        return self.label.replace(" x ", " ").removeprefix("usp ")

    @property
    def tag(self) -> str:
        return SINGLE if self.strategy == SINGLE else f"{self.strategy}{self.degree}"

    @property
    def warmup(self) -> Layout | None:
        """PipeFusion's warm-up step runs the whole latent through the stages, each on its
        devices: the work of one call of the model under this layout (one device; Ulysses over
        a stage's group). None for the other strategies."""
        if self.strategy == "pipefusion":
            return Layout(SINGLE)
        return Layout("ulysses", self.degree) if self.strategy == "pipefusion_ulysses" else None


# -- PipeFusion's tick and loop (docs/videodit.md, "PipeFusion") ---------------------------------
def stage_counts(counts: Mapping[str, int], stages: int) -> dict[str, float]:
    """The blocks of the heaviest stage: ceil(L / P) of the L blocks, the kinds in their
    proportion (HunyuanVideo: dual- and single-stream blocks, about equal in work)."""
    total = sum(counts.values())
    return {kind: count * math.ceil(total / stages) / total for kind, count in counts.items()}


def tick_inputs(config: VideoDiT, kwargs: Mapping[str, Any], inputs: Sequence[str], stages: int,
                video_tokens: int) -> list[str]:
    """The inputs of one PipeFusion tick of a part (factory ``kwargs``) from one call's
    ``inputs``: P stages' patches (M = P) and the K/V buffers of the part's self- or joint
    attentions over the ``video_tokens`` of the whole latent."""
    heads = int(kwargs["heads"])
    head_dim = int(kwargs.get("head_dim") or int(kwargs["dim"]) // heads)
    return zoo_plans.pipefusion_inputs(list(inputs), stages=stages, patches=stages,
                                       attentions=sum(int(kwargs[kind]) for kind in config.blocks),
                                       heads=heads, head_dim=head_dim, row=config.patch[1],
                                       video_tokens=video_tokens)


def pipefusion_loop_s(tick_s: Mapping[str, float], warmup_step_s: float, counts: Mapping[str, int],
                      stages: int, steps: int) -> float:
    """The sampling loop under PipeFusion (P stages, M = P patches): one unpipelined warm-up
    step (each stage on the whole latent: the warm-up layout's step / P, its hand-offs not
    charged) and ``steps - 1`` steps overlapped as xDiT runs them (``hardware.pipeline.
    pipefusion_step``); a stage's tick (one patch, its hand-off included) the heaviest
    stage's: the traced tick's parts (``tick_s`` by part) scaled by :func:`stage_counts`."""
    tick = scaled(tick_s, stage_counts(counts, stages))
    return pipefusion_step([tick] * stages, [0.0] * (stages - 1), [warmup_step_s / stages] * stages,
                           [0.0] * (stages - 1), patches=stages, steps=steps).inference_s


# -- one device's memory ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory of a whole model in bytes: ``resident_bytes`` held for the whole
    loop (weights; PipeFusion's K/V buffers), ``transient_bytes`` one call's (its inputs and
    scalars, and the largest peak of live activations among the parts)."""

    resident_bytes: float
    transient_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.resident_bytes + self.transient_bytes


def device_memory(resident: Mapping[str, float], counts: Mapping[str, float], other_bytes: float,
                  peaks: Mapping[str, float]) -> DeviceMemory:
    """The whole model's memory per device from its parts' (by part): the resident bytes
    scaled by the layer ``counts`` (``configs.scaled``; PipeFusion: the heaviest stage's,
    :func:`stage_counts`), the call's inputs and scalars (``other_bytes``) and the largest
    part's peak of live activations (the blocks run in turn: ``configs.peak``)."""
    return DeviceMemory(scaled(resident, counts), other_bytes + peak(peaks))


def pipefusion_memory(tick: DeviceMemory, warmup_transient_bytes: float) -> DeviceMemory:
    """PipeFusion's memory per device: the heaviest stage's weights and K/V buffers
    (``tick``'s resident bytes, held through every step) and the larger transient of its two
    kinds of step: a tick (one patch through the stage) and the warm-up step, where the
    stage runs its blocks on the whole latent (the transient of the warm-up layout's call,
    ``Layout.warmup``: one device, or Ulysses over the stage's group), filling the buffers it
    already holds."""
    return DeviceMemory(tick.resident_bytes, max(tick.transient_bytes, warmup_transient_bytes))


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

    def layout_inputs(self, part: str, layout: Layout, t: int) -> list[str]:
        """The inputs of ``part``'s trace under ``layout`` (one call's, but for PipeFusion)."""
        return self.inputs(t)

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
        if layout.strategy != SINGLE:
            kwargs.update(zoo_plans.factory_kwargs(layout.strategy, layout.degree))
            if self.config.model == "wan21":  # cross-attention: no joint sequence to order
                kwargs.pop("chunks")
        return kwargs

    def inputs(self, t: int) -> list[str]:
        return self.config.inputs(self._frames(t), self.height, self.width, DTYPE)

    def _frames(self, t: int) -> int:
        """The video frames of ``t`` latent frames."""
        return (t - 1) * self.config.vae_stride[0] + 1

    def layout_inputs(self, part: str, layout: Layout, t: int) -> list[str]:
        if layout.stages == 1:
            return self.inputs(t)
        tokens = self.config.video_tokens(self._frames(t), self.height, self.width) if t > 0 else 0
        return tick_inputs(self.config, self.kwargs(part, layout), self.inputs(t), layout.stages, tokens)

    def plan(self, layout: Layout) -> str | None:
        if layout.strategy == SINGLE:
            return None
        return zoo_plans.plan_toml(self.config.model, layout.strategy, layout.degree)

    def strategies(self) -> tuple[str, ...]:
        return (*zoo_plans.STRATEGIES, *zoo_plans.PIPEFUSION_STRATEGIES)

    def layout(self, strategy: str, degree: int) -> Layout:
        return Layout(strategy, degree)

    def cannot_run(self, strategy: str) -> str | None:
        if strategy.startswith("cfg") and self.config.batch != 2:
            return f"{self.name} uses embedded guidance (a batch of one): no CFG parallel"
        return None

    def refusal(self, layout: Layout) -> str | None:
        s, n = layout.strategy, layout.degree
        kw = self.config.kwargs
        heads = kw["heads"]
        if layout.stages > 1:
            return self._pipefusion_refusal(layout)
        if s == "usp" and (n % 2 or n < 4):
            return f"usp: degree {n} is no even number of at least 4"
        split = {"ulysses": n, "cfg_ulysses": n, "usp": n // 2, "tp": n}.get(s)
        if split is not None and heads % split:
            return f"{heads} heads: not divisible by {split}"
        if s == "tp":
            width = kw.get("dim", heads * kw.get("head_dim", 0))
            widths = {"ffn": kw.get("ffn") or MLP_RATIO * width}
            bad = [f"{name} {w}" for name, w in widths.items() if w % n]
            if bad:
                return f"{', '.join(bad)}: not divisible by {n}"
        if s in ("ulysses", "cfg_ulysses", "ring", "usp"):
            return self._tokens_refusal(n)
        return None

    def _pipefusion_refusal(self, layout: Layout) -> str | None:
        """P stages need P blocks and P patches of token rows; a stage's Ulysses group runs
        the warm-up's whole latent as Ulysses does, and splits the patch's tokens."""
        blocks, rows = sum(self.counts().values()), self.config.latent(self.frames, self.height, self.width)[1]
        rows //= self.config.patch[1]
        if layout.stages > blocks:
            return f"{layout.stages} stages: the model has {blocks} blocks"
        if layout.stages > rows:
            return f"{layout.stages} patches: the latent has {rows} token rows"
        if layout.strategy != "pipefusion_ulysses":
            return None
        warmup = self.refusal(layout.warmup)
        if warmup is not None:
            return f"its warm-up on a stage's {layout.degree} devices: {warmup}"
        patch = self.variable * math.ceil(rows / layout.stages) * (self.tokens_per_frame // rows)
        if self.config.model != "cogvideox" and patch % layout.degree:
            return f"a patch's {patch} video tokens: not divisible by {layout.degree}"
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
        if layout.strategy == SINGLE:
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
    known = tuple(dict.fromkeys((*zoo_plans.STRATEGIES, *zoo_plans.PIPEFUSION_STRATEGIES, *USER_STRATEGIES)))
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
        layouts.insert(0, Layout(SINGLE))
    return layouts, refused


def _layout_or_none(model: SearchModel, strategy: str, degree: int) -> Layout | None:
    if (strategy == "cfg" and degree != 2) or (strategy == "pipefusion_ulysses" and degree == 1):
        return None  # pipefusion_ulysses of 1: pipefusion on 2
    try:
        return model.layout(strategy, degree)
    except ValueError:  # usp at an odd degree: no mesh
        return None
