"""The pipeline configuration: which blocks each stage holds, on which devices, under which strategy.

Vocabulary (as in the original toolchain's notes):

* ``mesh_shape (X, Y)``: the whole logical device mesh, axes named ``x`` and ``y``;
* ``submeshes [(nx, ny, loc_x, loc_y), ...]``: the part of the mesh each stage runs on, an
  ``nx x ny`` rectangle whose corner is at ``(loc_x, loc_y)``; by default every stage gets the
  whole mesh (a stage is traced alone, so it is the same program either way);
* ``stage_ids [(first, last), ...]``: the block pairs of each stage, inclusive; stage 0 also
  holds the 5 embeddings and the last stage the final layer.

A configuration comes from CLI options or a TOML file such as::

    config = "full"            # model config: full, tiny or a model TOML file
    shape = "204_640_360"
    strategy = "megatron"
    mesh_shape = [2, 8]
    stage_ids = [[0, 13], [14, 27]]
    submeshes = [[2, 8, 0, 0], [2, 8, 0, 0]]   # optional
    dtype = "bfloat16"         # optional
    batch = 2                  # optional: classifier-free guidance batch

This module imports no torch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from hlo_trace.documents import load_toml
from hlo_trace.errors import UsageError, shown
from hlo_trace.numbers import brief, parse_int
from models.opensora.config import STDiT3Config, get_config
from models.opensora.flops import parameter_count
from models.opensora.inputs import geometry, parse_shape

#: Names the CLI and TOML accept for the element type of weights and activations.
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32",
          "f32": "float32", "float16": "float16", "fp16": "float16"}

MESH_AXES = ("x", "y")

#: Pipeline-file keys that only ``analyze-pipeline`` reads; the tracer accepts and ignores them.
ANALYSIS_KEYS = frozenset({"warmup_steps", "schedule"})


class PipelineConfigError(UsageError):
    """A pipeline configuration that cannot be traced (bad mesh, stage split, submesh, ...)."""


@dataclass(frozen=True)
class Submesh:
    """An ``nx x ny`` rectangle of the mesh with its corner at ``(loc_x, loc_y)``."""

    nx: int
    ny: int
    loc_x: int = 0
    loc_y: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nx, self.ny)

    @property
    def size(self) -> int:
        return self.nx * self.ny

    def global_device_ids(self, mesh_shape: tuple[int, int]) -> list[list[int]]:
        """Device ids of this rectangle in the whole mesh (row-major ids over (X, Y))."""
        _, mesh_y = mesh_shape
        return [[(self.loc_x + i) * mesh_y + (self.loc_y + j) for j in range(self.ny)]
                for i in range(self.nx)]


@dataclass(frozen=True)
class PipelineConfig:
    """Everything that decides the traced program of a stage."""

    model_config_name: str
    model: STDiT3Config
    shape: str
    strategy: str
    mesh_shape: tuple[int, int]
    stage_ids: tuple[tuple[int, int], ...]
    submeshes: tuple[Submesh, ...]
    dtype: str = "bfloat16"
    batch: int = 2
    patches: int = 1  # PipeFusion: > 1 traces a stage on one of this many height patches
    ring_degree: int | None = None  # usp: ring degree over mesh axis y (None: the default)
    ulysses_degree: int | None = None  # usp: Ulysses degree over mesh axis y
    #: ``official``: OpenSora v1.2's text-to-video path (temporal mask, timestep-0 modulation,
    #: STDiT3.embed); ``clean``: without it (the same result, fewer element-wise ops)
    inference_path: str = "official"
    #: (spatial, temporal): run the self-attentions with (True) or without (False) the fused
    #: kernel whatever their sizes (``STDiT3.force_self_attention_flash``); None: OpenSora's
    #: rule at this shape. The plan search's calibrations trace a small shape with the choice
    #: the rule makes at the plan's shape (``planning.plan_estimate``).
    self_attention_flash: tuple[bool, bool] | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def num_stages(self) -> int:
        return len(self.stage_ids)

    @property
    def num_devices(self) -> int:
        return self.mesh_shape[0] * self.mesh_shape[1]

    @property
    def mesh_label(self) -> str:
        return f"{self.mesh_shape[0]}x{self.mesh_shape[1]}"

    @property
    def stage_ids_label(self) -> str:
        return ",".join(f"{first}-{last}" for first, last in self.stage_ids)

    def submesh(self, stage: int) -> Submesh:
        return self.submeshes[stage]

    def dump_name(self, stage: int) -> str:
        """``<model>_<shape>_<strategy>_<mesh>_stage<k>_pairs<first>-<last>``: the file name of a
        stage's dump (the model is the config name or the TOML file's stem).

        The block pairs make two stage splits distinct: stage 0 of ``0-13,14-27`` and of
        ``0-6,7-27`` are different programs. (A stage's pair range also fixes whether it holds
        the embeddings, first pair 0, or the final layer, the last pair.) usp degrees given
        explicitly are named too (``_ring2``, ``_ulysses4``): two degrees are two programs.
        """
        model = Path(self.model_config_name).stem if self.model_config_name.endswith(".toml") \
            else self.model_config_name
        mesh = self.submesh(stage)
        first, last = self.stage_ids[stage]
        patch = f"_patch1of{self.patches}" if self.patches > 1 else ""
        path = "" if self.inference_path == INFERENCE_PATHS[0] else f"_{self.inference_path}"
        degrees = "".join(f"_{name}{value}" for name, value in (
            ("ring", self.ring_degree), ("ulysses", self.ulysses_degree)) if value is not None)
        flash = "" if self.self_attention_flash is None else "_attention-" + "-".join(
            f"{axis}{'flash' if fused else 'plain'}"
            for axis, fused in zip(("spatial", "temporal"), self.self_attention_flash, strict=True))
        return (f"{model}_{self.shape}_{self.strategy}_{mesh.nx}x{mesh.ny}{degrees}"
                f"_stage{stage}_pairs{first}-{last}{patch}{path}{flash}")

    def to_dict(self) -> dict:
        """JSON-able form for sidecars (enough to rebuild the configuration)."""
        return {
            "config": self.model_config_name,
            "model": self.model.to_dict(),
            "shape": self.shape,
            "strategy": self.strategy,
            "mesh_shape": list(self.mesh_shape),
            "stage_ids": [list(ids) for ids in self.stage_ids],
            "submeshes": [list(dataclasses.astuple(s)) for s in self.submeshes],
            "dtype": self.dtype,
            "batch": self.batch,
            "patches": self.patches,
            "ring_degree": self.ring_degree,
            "ulysses_degree": self.ulysses_degree,
            "inference_path": self.inference_path,
        } | ({} if self.self_attention_flash is None
             else {"self_attention_flash": list(self.self_attention_flash)})


#: Video shape used when none is given: the brief's reference shape for the full model, and a
#: small one for other configs whose T=8 and S=16 split evenly over 2, 4 or 8 devices.
DEFAULT_FULL_SHAPE = "204_640_360"
#: The model's inference paths (PipelineConfig.inference_path); the first is the default.
INFERENCE_PATHS = ("official", "clean")
DEFAULT_SMALL_SHAPE = "28_64_64"


def default_shape(config_name: str) -> str:
    return DEFAULT_FULL_SHAPE if config_name == "full" else DEFAULT_SMALL_SHAPE


def parse_mesh(text: str) -> tuple[int, int]:
    """``"2x8"`` -> (2, 8): ASCII digits and a lower-case ``x``, nothing else."""
    match = re.fullmatch(r"([0-9]+)x([0-9]+)", str(text))
    try:
        if not match:
            raise ValueError
        x, y = (parse_int(size, minimum=1, maximum=MAX_DEVICES) for size in match.groups())
    except ValueError:
        raise PipelineConfigError(f"bad mesh {brief(text)}: expected XxY with X and Y from 1 to "
                                  f"{MAX_DEVICES} in ASCII digits, e.g. 2x8") from None
    return x, y


def parse_stage_ids(text: str) -> tuple[tuple[int, int], ...]:
    """``"0-13,14-27"`` -> ((0, 13), (14, 27)); a single number ``"5"`` means ``5-5``."""
    stages = []
    for part in str(text).split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        try:
            if not match:
                raise ValueError
            first = parse_int(match.group(1), minimum=0, maximum=MAX_BLOCKS)
            last = (first if match.group(2) is None
                    else parse_int(match.group(2), minimum=0, maximum=MAX_BLOCKS))
        except ValueError:
            raise PipelineConfigError(
                f"bad stage ids {brief(text)}: expected FIRST-LAST[,FIRST-LAST...] block pairs "
                f"from 0 to {MAX_BLOCKS} in ASCII digits, e.g. 0-13,14-27") from None
        stages.append((first, last))
    return tuple(stages)


def normalize_dtype(name: str) -> str:
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise PipelineConfigError(
            f"unknown dtype {name!r}: expected one of {sorted(set(DTYPES.values()))}") from None


def build_config(*, config: str = "tiny", shape: str | None = None, strategy: str = "megatron",
                 mesh: str | tuple[int, int] = "2x2", stage_ids: str | None = None,
                 submeshes: list | None = None, dtype: str = "bfloat16",
                 batch: int = 2, patches: int = 1, ring_degree: int | None = None,
                 ulysses_degree: int | None = None, inference_path: str = INFERENCE_PATHS[0],
                 self_attention_flash: tuple[bool, bool] | None = None) -> PipelineConfig:
    """Build and validate a configuration from plain values (CLI strings or TOML values).

    ``stage_ids`` None means one stage holding all blocks.  Strategy-specific checks (heads,
    batch divisibility) are the strategy's job, see :mod:`tracing.strategies`.
    """
    model = get_config(config)
    shape = default_shape(str(config)) if shape is None else shape
    parse_shape(shape)  # raises a one-line ShapeError for a malformed shape
    mesh_shape = parse_mesh(mesh) if isinstance(mesh, str) else _mesh_from_list(mesh)
    ids = (parse_stage_ids(stage_ids) if isinstance(stage_ids, str)
           else ((0, model.depth - 1),) if stage_ids is None
           else tuple(_pair(item, "stage_ids") for item in stage_ids))
    _validate_stage_ids(ids, model.depth)
    if submeshes is None:
        subs = tuple(Submesh(*mesh_shape) for _ in ids)
    else:
        subs = tuple(_submesh(item) for item in submeshes)
    _validate_submeshes(subs, ids, mesh_shape)
    if mesh_shape[0] * mesh_shape[1] > MAX_DEVICES:
        raise PipelineConfigError(f"mesh {mesh_shape[0]}x{mesh_shape[1]}: more than "
                                  f"{MAX_DEVICES} devices")
    if not _is_int(batch) or not 1 <= batch <= MAX_SIZE:
        raise PipelineConfigError(f"batch={batch!r}: expected a positive integer batch size "
                                  f"up to {MAX_SIZE}")
    if isinstance(patches, bool) or not isinstance(patches, int) or patches < 1:
        raise PipelineConfigError(f"patches={patches!r}: expected a positive patch count")
    if inference_path not in INFERENCE_PATHS:
        raise PipelineConfigError(f"inference_path={inference_path!r}: expected one of {', '.join(INFERENCE_PATHS)}")
    if self_attention_flash is not None and (
            len(self_attention_flash) != 2 or not all(isinstance(v, bool) for v in self_attention_flash)):
        raise PipelineConfigError(f"self_attention_flash={brief(self_attention_flash)}: expected two "
                                  "booleans (spatial, temporal)")
    for key, degree in (("ring_degree", ring_degree), ("ulysses_degree", ulysses_degree)):
        if degree is None:
            continue
        if not _is_int(degree) or not 1 <= degree <= MAX_DEVICES:
            raise PipelineConfigError(f"{key}={brief(degree)}: expected a positive integer up "
                                      f"to {MAX_DEVICES}")
        if strategy != "usp":
            raise PipelineConfigError(f"{key}={degree}: the usp strategy's degree; strategy "
                                      f"{strategy} has none")
    return PipelineConfig(model_config_name=str(config), model=model, shape=str(parse_shape(shape)),
                          strategy=strategy, mesh_shape=mesh_shape, stage_ids=ids,
                          submeshes=subs, dtype=normalize_dtype(dtype), batch=int(batch),
                          patches=patches, ring_degree=ring_degree, ulysses_degree=ulysses_degree,
                          inference_path=inference_path,
                          self_attention_flash=None if self_attention_flash is None else tuple(self_attention_flash))


def load_config_file(path: str | Path, **overrides) -> PipelineConfig:
    """Read a pipeline TOML file; ``overrides`` (e.g. from CLI options) win over its values."""
    source = Path(path)
    if not source.exists():
        raise PipelineConfigError(f"{shown(source)}: pipeline file not found")
    data = load_toml(source, "a pipeline file (TOML)")
    known = set(_TOML_TYPES)
    unknown = sorted(set(data) - known - ANALYSIS_KEYS)
    if unknown:
        raise PipelineConfigError(f"{source}: unknown keys {unknown}; expected some of {sorted(known)}")
    for key, value in data.items():
        if key in _TOML_TYPES:
            accepts, expected = _TOML_TYPES[key]
            if not accepts(value):
                raise PipelineConfigError(f"{source}: {key} = {value!r}: expected {expected}")
    values = {"mesh" if key == "mesh_shape" else key: value for key, value in data.items()
              if key not in ANALYSIS_KEYS}
    values.update({key: value for key, value in overrides.items() if value is not None})
    if isinstance(values.get("config"), str) and values["config"].endswith(".toml"):
        # A model file named in a pipeline file is relative to that file.
        model_path = Path(values["config"])
        if not model_path.is_absolute():
            values["config"] = str(source.parent / model_path)
    return build_config(**values)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_list(value, lengths: tuple[int, ...]) -> bool:
    return isinstance(value, list) and len(value) in lengths and all(map(_is_int, value))


#: Types of the pipeline TOML keys: (accepts(value), what the error says is expected). Checked
#: before anything is converted, so that ``batch = 2.5`` is refused, never truncated to 2.
_TOML_TYPES = {
    "config": (lambda v: isinstance(v, str), "a string: full, tiny or a model TOML file"),
    "shape": (lambda v: isinstance(v, str), 'a string FRAMES_WIDTH_HEIGHT, e.g. "204_640_360"'),
    "strategy": (lambda v: isinstance(v, str), 'a strategy name string, e.g. "megatron"'),
    "mesh_shape": (lambda v: isinstance(v, str) or _is_int_list(v, (2,)),
                   'two integers [X, Y] or a string "XxY"'),
    "stage_ids": (lambda v: isinstance(v, str) or (
                      isinstance(v, list) and all(_is_int_list(p, (2,)) for p in v)),
                  'a list of integer pairs [[first, last], ...] or a string "0-13,14-27"'),
    "submeshes": (lambda v: isinstance(v, list) and all(_is_int_list(p, (2, 4)) for p in v),
                  "a list of integer lists [nx, ny, loc_x, loc_y]"),
    "dtype": (lambda v: isinstance(v, str), 'a string, e.g. "bfloat16"'),
    "batch": (_is_int, "a positive integer"),
    "patches": (_is_int, "a positive integer"),
    "ring_degree": (_is_int, "a positive integer (usp)"),
    "ulysses_degree": (_is_int, "a positive integer (usp)"),
    "inference_path": (lambda v: v in INFERENCE_PATHS, " or ".join(f'"{p}"' for p in INFERENCE_PATHS)),
}

#: Most virtual CPU devices one trace may ask for: XLA creates one host device (and its thread
#: pool) each, so a mistyped mesh such as 1000x1000 must be refused, not attempted. 64x the
#: study's 16 devices.
MAX_DEVICES = 1024
#: Largest size (batch) accepted: an int32 dimension; no traced tensor gets near it.
MAX_SIZE = 2**31 - 1
#: Largest block pair index accepted in a stage split (the model's depth bounds it further).
MAX_BLOCKS = MAX_SIZE
#: Most elements one tensor of a traced stage may have: 2**40 (~1.1e12, 2.2 TB in bf16). The
#: largest reference trace (full model, 102_1280_720, batch 2) peaks at 1.24e10 (its spatial
#: attention scores, 2 x 30 x 16 x 3600**2), so this leaves a factor of ~90; beyond it torch
#: overflows its size arithmetic or asks for memory no machine has, after seconds of work.
MAX_TENSOR_ELEMENTS = 2**40
#: Bytes per element of the host tensors a trace really allocates: the inputs are drawn in
#: float32 (models.opensora.inputs.make_inputs) and the weights are created in float32.
HOST_BYTES_PER_ELEMENT = 4


def stage_tensor_elements(model: STDiT3Config, shape: str, batch: int) -> dict[str, int]:
    """Elements of the largest tensors a traced stage holds (global, before sharding), by name:
    the latent input, the token activations, the MLP hidden activation and the scores of the
    three attentions (spatial: one per frame over S tokens; temporal: one per spatial position
    over T; cross: every video token over the caption tokens)."""
    geo = geometry(model, shape)
    heads = model.num_heads
    return {
        "latent input z (batch x channels x latent frames x height x width)":
            batch * model.in_channels * geo.T_lat * geo.H_lat * geo.W_lat,
        "token activations (batch x N x hidden)": batch * geo.N * model.hidden_size,
        "MLP hidden activations (batch x N x mlp hidden)": batch * geo.N * model.mlp_hidden,
        "spatial attention scores (batch x T x heads x S x S)": batch * geo.T * heads * geo.S**2,
        "temporal attention scores (batch x S x heads x T x T)": batch * geo.S * heads * geo.T**2,
        "cross-attention scores (batch x heads x N x caption tokens)":
            batch * heads * geo.N * model.model_max_length,
    }


def host_memory_bytes() -> int | None:
    """This machine's memory, or the address-space limit of this process if lower (None if
    neither is known)."""
    import os
    import resource

    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft)
    return min(limits) if limits else None


def check_trace_size(config: PipelineConfig, *, memory_bytes: int | None = None) -> None:
    """Refuse, before torch allocates anything, a trace whose tensors exceed
    ``MAX_TENSOR_ELEMENTS`` or whose host allocations (inputs and weights, in float32) exceed
    ``memory_bytes`` (default: :func:`host_memory_bytes`). The error names ``--shape`` when
    one sample is already too big, else ``--batch``."""
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    for batch in (1, config.batch):
        option = "--shape" if batch == 1 else "--batch"
        value = config.shape if batch == 1 else config.batch
        tensors = stage_tensor_elements(config.model, config.shape, batch)
        name, elements = max(tensors.items(), key=lambda item: item[1])
        if elements > MAX_TENSOR_ELEMENTS:
            raise PipelineConfigError(
                f"{option} {value}: the stage's {name} would hold {elements:.3g} elements, more "
                f"than the {MAX_TENSOR_ELEMENTS:.3g} (2**40) one traced tensor may hold")
        inputs = sum(elements for key, elements in tensors.items()
                     if key.startswith(("latent", "token")))
        host_bytes = HOST_BYTES_PER_ELEMENT * (inputs + parameter_count(config.model))
        if memory is not None and host_bytes > memory:
            raise PipelineConfigError(
                f"{option} {value}: the stage's inputs and weights need {host_bytes / 1e9:.3g} GB "
                f"of host memory, more than this machine's {memory / 1e9:.3g} GB")


def _validate_stage_ids(ids: tuple[tuple[int, int], ...], depth: int) -> None:
    if not ids:
        raise PipelineConfigError("stage ids: expected at least one stage")
    expected_first = 0
    for index, (first, last) in enumerate(ids):
        if first > last:
            raise PipelineConfigError(f"stage {index}: first block {first} > last block {last}")
        if first != expected_first:
            raise PipelineConfigError(
                f"stage {index} starts at block {first}, expected {expected_first}: stages must "
                f"cover blocks 0..{depth - 1} in order without gaps or overlaps")
        expected_first = last + 1
    if expected_first != depth:
        raise PipelineConfigError(
            f"stage ids {','.join(f'{a}-{b}' for a, b in ids)} cover blocks 0..{expected_first - 1}, "
            f"but the model has {depth} block pairs (0..{depth - 1})")


def _validate_submeshes(subs: tuple[Submesh, ...], ids: tuple, mesh_shape: tuple[int, int]) -> None:
    if len(subs) != len(ids):
        raise PipelineConfigError(
            f"{len(subs)} submeshes for {len(ids)} stages: expected one submesh per stage")
    for index, sub in enumerate(subs):
        if (min(sub.nx, sub.ny) < 1 or sub.loc_x < 0 or sub.loc_y < 0
                or sub.loc_x + sub.nx > mesh_shape[0] or sub.loc_y + sub.ny > mesh_shape[1]):
            raise PipelineConfigError(
                f"stage {index}: submesh {sub.nx}x{sub.ny} at ({sub.loc_x}, {sub.loc_y}) does not "
                f"fit in the {mesh_shape[0]}x{mesh_shape[1]} mesh")


def _pair(item, what: str) -> tuple[int, int]:
    if not isinstance(item, (list, tuple)) or len(item) != 2 or not all(map(_is_int, item)):
        raise PipelineConfigError(f"{what}: expected pairs of integers [first, last], got {item!r}")
    return item[0], item[1]


def _mesh_from_list(item) -> tuple[int, int]:
    if not isinstance(item, (list, tuple)) or len(item) != 2 or not all(map(_is_int, item)):
        raise PipelineConfigError(f"mesh_shape {item!r}: expected two integers [X, Y]")
    x, y = item
    if min(x, y) < 1:
        raise PipelineConfigError(f"mesh_shape {item!r}: expected two positive sizes")
    return x, y


def _submesh(item) -> Submesh:
    if not isinstance(item, (list, tuple)) or len(item) not in (2, 4) or not all(map(_is_int, item)):
        raise PipelineConfigError(f"submesh {item!r}: expected integers [nx, ny, loc_x, loc_y]")
    return Submesh(*item)
