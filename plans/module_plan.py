"""What ``trace-module`` traces, read and checked before torch is imported (no torch here).

* The model: an import path ``pkg.module:factory`` and keyword arguments from a TOML file
  (:func:`parse_factory`, :func:`load_kwargs`).
* The inputs: ``NAME=SHAPE:DTYPE`` specs, ``ids=2x16:int64`` (:func:`parse_input`), passed to the
  module's ``forward`` by name in the order given.
* The sharding plan (:class:`ModulePlan`): a named mesh, partition specs for parameters by name
  pattern, for inputs by name and for activations (a module's output or input, by module-name
  pattern: the tracer marks them with ``mark_sharding`` from forward hooks), from a TOML file
  (:func:`load_plan`) and/or a shorthand strategy (:data:`SHORTHANDS`: ``dp``, ``megatron``,
  ``sp``) whose rules read the usual module names of a transformer (:func:`shorthand_rules`).
  A file's rules come before the shorthand's: the first rule that matches a name wins.

A partition spec is one entry per tensor dimension: a mesh axis name, a list of axis names
(split over their product) or ``"none"`` (TOML has no null). docs/trace_module.md has the format.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_trace.documents import load_toml
from hlo_trace.errors import UsageError, shown
from hlo_trace.numbers import brief

Spec = tuple  # tuple[str | tuple[str, ...] | None, ...]

#: Element types an input may have (torch dtype names).
INPUT_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "bool")
#: Element types of the model's floating parameters and activations.
MODEL_DTYPES = ("float32", "bfloat16", "float16")
#: Largest device count of a mesh (the virtual CPU devices torch-xla can make here).
MAX_DEVICES = 64
#: Largest input dimension and element count accepted (a trace holds no buffer, but the
#: program's shapes must stay sane). The element count allows PipeFusion's K/V buffers of a
#: full-size video (HunyuanVideo at 720p, 3 attentions on 8 stages: 8.8e9 elements).
MAX_DIMENSION = 1 << 31
MAX_ELEMENTS = 1 << 34
UNSPLIT = "none"
WHERE = ("output", "input")

#: Shorthand strategies: name -> what it does (docs/trace_module.md).
SHORTHANDS = {
    "dp": "data parallel over every device: each input split on its first (batch) dimension, "
          "weights replicated",
    "megatron": "1-D tensor parallel over every device: attention projections in and MLP up "
                "projections split by output features (column), attention output and MLP down "
                "projections by input features (row), their outputs all-reduced; inputs "
                "replicated",
    "sp": "sequence parallel (DeepSpeed-Ulysses) over every device: inputs split on their second "
          "(sequence) dimension, weights replicated; q/k/v projection outputs resharded to "
          "heads (all-to-all) and the attention output back to the sequence",
}

#: Module names (the last part of a qualified name) that the shorthands treat as column- and
#: row-parallel linears, and those that project into and out of attention.
COLUMN_NAMES = ("q_proj", "k_proj", "v_proj", "qkv", "c_attn", "query", "key", "value",
                "gate_proj", "up_proj", "fc1", "c_fc", "w1", "w3")
ROW_NAMES = ("o_proj", "out_proj", "proj", "c_proj", "down_proj", "fc2", "w2", "dense")
ATTENTION_IN_NAMES = ("q_proj", "k_proj", "v_proj", "qkv", "c_attn", "query", "key", "value")
#: A module is inside an attention when a part of its qualified name contains one of these.
ATTENTION_PARENTS = ("attn", "attention")


class PlanError(UsageError):
    """A plan, model path or input spec that cannot be traced."""


@dataclass(frozen=True)
class Rule:
    """A partition spec for the names a pattern matches (fnmatch, or a regex ``re:...``)."""

    pattern: str
    spec: Spec
    where: str = "output"  # activations only: mark the module's output or its (first) input
    origin: str = ""  # the file (or shorthand) it comes from, for messages
    #: activations only: hand on a copy marked ``then`` (a reshard pinned at this point: GSPMD
    #: exchanges the tensor from ``spec`` to ``then`` here, not where it likes)
    then: Spec | None = None

    def matches(self, name: str) -> bool:
        if self.pattern.startswith("re:"):
            return re.fullmatch(self.pattern[3:], name) is not None
        return fnmatch.fnmatchcase(name, self.pattern)


@dataclass(frozen=True)
class ModulePlan:
    """A mesh and the rules of a sharding plan; ``shorthand`` names the strategy it came from."""

    mesh_shape: tuple[int, ...]
    axes: tuple[str, ...]
    parameters: tuple[Rule, ...] = ()
    inputs: tuple[Rule, ...] = ()
    activations: tuple[Rule, ...] = ()
    shorthand: str | None = None
    #: Shorthand rules that apply only where the model has such names (no error when unmatched).
    optional: frozenset[str] = frozenset()

    @property
    def devices(self) -> int:
        return math.prod(self.mesh_shape)

    @property
    def label(self) -> str:
        return "x".join(map(str, self.mesh_shape))

    @property
    def axis_sizes(self) -> dict[str, int]:
        return dict(zip(self.axes, self.mesh_shape))

    def parameter_spec(self, name: str) -> Spec | None:
        return _first_spec(self.parameters, name)

    def input_spec(self, name: str) -> Spec | None:
        return _first_spec(self.inputs, name)

    def activation_rules(self, module_name: str) -> list[Rule]:
        """The activation rules for a module: the first match per ``where``."""
        chosen: dict[str, Rule] = {}
        for rule in self.activations:
            if rule.where not in chosen and rule.matches(module_name):
                chosen[rule.where] = rule
        return list(chosen.values())

    def to_dict(self) -> dict[str, Any]:
        def rules(items: tuple[Rule, ...]) -> list[dict[str, Any]]:
            return [{"pattern": r.pattern, "spec": spec_json(r.spec), "where": r.where,
                     "then": spec_json(r.then), "from": r.origin} for r in items]

        return {"mesh": {"shape": list(self.mesh_shape), "axes": list(self.axes)},
                "shorthand": self.shorthand, "parameters": rules(self.parameters),
                "inputs": rules(self.inputs), "activations": rules(self.activations)}


def _first_spec(rules: tuple[Rule, ...], name: str) -> Spec | None:
    rule = next((r for r in rules if r.matches(name)), None)
    return rule.spec if rule is not None else None


def spec_json(spec: Spec | None) -> list | None:
    if spec is None:
        return None
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


# -- the model and its inputs ----------------------------------------------------------------------
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_FACTORY = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}(\.{_IDENTIFIER})*")


def parse_factory(text: str) -> tuple[str, str]:
    """``pkg.module:factory`` -> (module, attribute path)."""
    if not _FACTORY.fullmatch(text):
        raise PlanError(f"model {brief(text)}: expected an import path pkg.module:factory, "
                        "e.g. models.zoo.gpt2:gpt2")
    module, _, attribute = text.partition(":")
    return module, attribute


def load_kwargs(path: str | None) -> dict[str, Any]:
    """The factory's keyword arguments: the top-level keys of a TOML file (none: {})."""
    if path is None:
        return {}
    return load_toml(path, "a TOML file of keyword arguments for the model factory")


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}


_INPUT = re.compile(rf"({_IDENTIFIER})=(\d+(?:x\d+)*|scalar):(\w+)")


def parse_input(text: str) -> InputSpec:
    """``NAME=SHAPE:DTYPE``: ``ids=2x16:int64``, ``images=4x3x32x32:float32``,
    ``t=scalar:float32``."""
    match = _INPUT.fullmatch(text)
    if not match:
        raise PlanError(f"--input {brief(text)}: expected NAME=SHAPE:DTYPE, e.g. ids=2x16:int64 "
                        f"(DTYPE one of {', '.join(INPUT_DTYPES)})")
    name, shape_text, dtype = match.groups()
    if dtype not in INPUT_DTYPES:
        raise PlanError(f"--input {brief(text)}: dtype {brief(dtype)}; expected one of "
                        f"{', '.join(INPUT_DTYPES)}")
    sizes = [] if shape_text == "scalar" else shape_text.split("x")
    # a size longer than the largest allowed is too large (and int() refuses 4,300 digits)
    shape = tuple(int(d) if len(d) <= len(str(MAX_DIMENSION)) else MAX_DIMENSION + 1 for d in sizes)
    if any(d < 1 or d > MAX_DIMENSION for d in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise PlanError(f"--input {brief(text)}: sizes must be 1 to {MAX_DIMENSION} with at most "
                        f"{MAX_ELEMENTS} elements")
    return InputSpec(name, shape, dtype)


# -- plans ---------------------------------------------------------------------------------------
def parse_mesh(text: str) -> tuple[int, ...]:
    """``2x2`` -> (2, 2)."""
    if not re.fullmatch(r"\d{1,4}(x\d{1,4}){0,3}", text):
        raise PlanError(f"--mesh {brief(text)}: expected sizes joined by x, e.g. 2x2 or 1x4")
    shape = tuple(int(size) for size in text.split("x"))
    _check_mesh(shape, f"--mesh {text}")
    return shape


def _check_mesh(shape: tuple[int, ...], where: str) -> None:
    if any(size < 1 for size in shape) or math.prod(shape) > MAX_DEVICES:
        raise PlanError(f"{where}: every size must be at least 1, and at most {MAX_DEVICES} "
                        "devices in all")


def default_axes(rank: int) -> tuple[str, ...]:
    """The mesh axes when a plan does not name them: x, y (z, w)."""
    return ("x", "y", "z", "w")[:rank]


def load_plan(path: str | None, *, shorthand: str | None, mesh: str | None) -> ModulePlan:
    """The plan of a TOML file and/or a shorthand strategy on a mesh (``--mesh`` wins over the
    file's); see the module docstring and docs/trace_module.md."""
    document: dict[str, Any] = {}
    origin = "the command line"
    if path is not None:
        origin = shown(path)
        document = load_toml(path, "a trace-module sharding plan (TOML)")
        unknown = set(document) - {"mesh", "strategy", "parameters", "inputs", "activations"}
        if unknown:
            raise PlanError(f"{origin}: unknown key {sorted(unknown)[0]!r}; expected mesh, "
                            "strategy, parameters, inputs, activations")
    mesh_shape, axes = _plan_mesh(document.get("mesh"), origin, mesh)
    if shorthand is None and "strategy" in document:
        shorthand = document["strategy"]
        if not isinstance(shorthand, str):
            raise PlanError(f"{origin}: strategy = {brief(shorthand)}: expected a name, one of "
                            f"{', '.join(SHORTHANDS)}")
    if shorthand is not None and shorthand not in SHORTHANDS:
        raise PlanError(f"strategy {brief(shorthand)}: expected one of {', '.join(SHORTHANDS)}")
    if path is None and shorthand is None:
        raise PlanError("no sharding plan: pass --plan FILE or --strategy "
                        f"{'|'.join(SHORTHANDS)} (with --mesh)")
    sections = {key: tuple(_rules(document.get(key, []), key, origin, axes))
                for key in ("parameters", "inputs", "activations")}
    optional: frozenset[str] = frozenset()
    if shorthand is not None:
        short = shorthand_rules(shorthand, axes)
        sections = {key: sections[key] + short[key] for key in sections}
        optional = frozenset(rule.pattern for rules in short.values() for rule in rules)
    return ModulePlan(mesh_shape, axes, sections["parameters"], sections["inputs"],
                      sections["activations"], shorthand, optional)


def _plan_mesh(table: Any, origin: str, mesh: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if table is not None and not isinstance(table, dict):
        raise PlanError(f"{origin}: mesh = {brief(table)}: expected a table with shape and axes")
    table = table or {}
    if set(table) - {"shape", "axes"}:
        raise PlanError(f"{origin}: mesh: unknown key {sorted(set(table) - {'shape', 'axes'})[0]!r}; "
                        "expected shape and axes")
    if mesh is not None:
        shape = parse_mesh(mesh)
    elif "shape" in table:
        shape = table["shape"]
        if not (isinstance(shape, list) and shape and len(shape) <= 4
                and all(isinstance(s, int) and not isinstance(s, bool) for s in shape)):
            raise PlanError(f"{origin}: mesh.shape = {brief(shape)}: expected 1 to 4 sizes, "
                            "e.g. [2, 2]")
        shape = tuple(shape)
        _check_mesh(shape, f"{origin}: mesh.shape")
    else:
        raise PlanError(f"{origin}: no mesh: pass --mesh XxY or give [mesh] shape = [X, Y]")
    axes = table.get("axes")
    if axes is None:
        axes = default_axes(len(shape))
    elif not (isinstance(axes, list) and all(isinstance(a, str) and re.fullmatch(_IDENTIFIER, a)
                                             for a in axes) and len(set(axes)) == len(axes)):
        raise PlanError(f"{origin}: mesh.axes = {brief(axes)}: expected distinct names, "
                        'e.g. ["x", "y"]')
    axes = tuple(axes)
    if len(axes) != len(shape) or UNSPLIT in axes:
        raise PlanError(f"{origin}: mesh axes {list(axes)} do not name the {len(shape)} "
                        f"dimensions of mesh {'x'.join(map(str, shape))} (and may not be "
                        f"{UNSPLIT!r})")
    return shape, axes


def _rules(items: Any, key: str, origin: str, axes: tuple[str, ...]) -> list[Rule]:
    name_key = "module" if key == "activations" else "name" if key == "inputs" else "pattern"
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise PlanError(f"{origin}: {key}: expected [[{key}]] tables with {name_key} and spec")
    rules = []
    for index, item in enumerate(items):
        where = f"{origin}: {key}[{index}]"
        allowed = {name_key, "spec"} | ({"where", "then"} if key == "activations" else set())
        extra = set(item) - allowed
        if extra:
            raise PlanError(f"{where}: unknown key {sorted(extra)[0]!r}; expected "
                            f"{', '.join(sorted(allowed))}")
        pattern = item.get(name_key)
        if not isinstance(pattern, str) or not pattern:
            raise PlanError(f"{where}: {name_key} = {brief(pattern)}: expected a name pattern "
                            "(fnmatch, or re:REGEX)")
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as error:
                raise PlanError(f"{where}: {name_key} {brief(pattern)}: not a regular expression "
                                f"({error})") from None
        position = item.get("where", "output")
        if position not in WHERE:
            raise PlanError(f"{where}: where = {brief(position)}: expected output or input")
        then = parse_spec(item["then"], where, axes) if "then" in item else None
        rules.append(Rule(pattern, parse_spec(item.get("spec"), where, axes), position, origin,
                          then))
    return rules


def parse_spec(value: Any, where: str, axes: tuple[str, ...]) -> Spec:
    """A TOML spec (list of axis name, list of names, or "none") -> a partition spec."""
    if not isinstance(value, list):
        raise PlanError(f"{where}: spec = {brief(value)}: expected a list with one entry per "
                        f'dimension, e.g. ["x", "none"]')
    entries: list[str | tuple[str, ...] | None] = []
    used: list[str] = []
    for entry in value:
        names = entry if isinstance(entry, list) else [entry]
        if not names or not all(isinstance(n, str) for n in names):
            raise PlanError(f"{where}: spec entry {brief(entry)}: expected an axis name, a list "
                            f'of axis names or "{UNSPLIT}"')
        if names == [UNSPLIT]:
            entries.append(None)
            continue
        for name in names:
            if name not in axes:
                raise PlanError(f"{where}: spec names axis {brief(name)}; the mesh's axes are "
                                f"{', '.join(axes)} (\"{UNSPLIT}\" for an unsplit dimension)")
        used += names
        entries.append(tuple(names) if isinstance(entry, list) else names[0])
    if len(used) != len(set(used)):
        raise PlanError(f"{where}: spec {brief(value)} uses a mesh axis twice")
    return tuple(entries)


def shorthand_rules(name: str, axes: tuple[str, ...]) -> dict[str, tuple[Rule, ...]]:
    """The rules of a shorthand strategy over all of ``axes`` (docs/trace_module.md)."""
    every = axes[0] if len(axes) == 1 else tuple(axes)
    origin = f"strategy {name}"
    if name == "dp":
        return {"parameters": (), "activations": (),
                "inputs": (Rule("*", ("batch", every), origin=origin),)}
    if name == "megatron":
        column = tuple(Rule(f"re:(.*\\.)?{n}\\.weight", (every, None), origin=origin)
                       for n in COLUMN_NAMES)
        column += tuple(Rule(f"re:(.*\\.)?{n}\\.bias", (every,), origin=origin)
                        for n in COLUMN_NAMES)
        row = tuple(Rule(f"re:(.*\\.)?{n}\\.weight", (None, every), origin=origin)
                    for n in ROW_NAMES)
        pin = tuple(Rule(f"re:(.*\\.)?{n}", ("replicated",), origin=origin) for n in ROW_NAMES)
        return {"parameters": column + row, "inputs": (), "activations": pin}
    if name == "sp":
        sequence, features = (None, every, None), (None, None, every)
        attention_in = tuple(Rule(f"re:(.*\\.)?{n}", sequence, origin=origin, then=features)
                             for n in ATTENTION_IN_NAMES)
        attention_out = tuple(Rule(f"re:(.*({'|'.join(ATTENTION_PARENTS)}).*\\.)?{n}",
                                   features, where="input", origin=origin, then=sequence)
                              for n in ROW_NAMES)
        return {"parameters": (), "inputs": (Rule("*", ("sequence", every), origin=origin),),
                "activations": attention_in + attention_out}
    raise PlanError(f"strategy {brief(name)}: expected one of {', '.join(SHORTHANDS)}")


def resolve_spec(spec: Spec, shape: tuple[int, ...]) -> Spec:
    """A shorthand's symbolic spec for a tensor of ``shape``: ``("batch", axes)`` splits the
    first dimension, ``("sequence", axes)`` the second, ``("replicated",)`` nothing; a plan's
    spec is returned as it is."""
    if spec and spec[0] == "replicated":
        return (None,) * len(shape)
    if spec and spec[0] in ("batch", "sequence"):
        dim = 0 if spec[0] == "batch" else 1
        if len(shape) <= dim:
            return (None,) * len(shape)
        return tuple(spec[1] if d == dim else None for d in range(len(shape)))
    return spec


def check_spec(spec: Spec, shape: tuple[int, ...], what: str, axis_sizes: dict[str, int]) -> None:
    """One line when ``spec`` does not fit a tensor of ``shape``: its rank, or a dimension the
    devices of its axes do not divide."""
    if len(spec) != len(shape):
        raise PlanError(f"{what}: spec {spec_json(spec)} has {len(spec)} entries for a tensor of "
                        f"shape {list(shape)} ({len(shape)} dimensions)")
    for dim, (size, entry) in enumerate(zip(shape, spec)):
        names = entry if isinstance(entry, tuple) else (entry,) if entry is not None else ()
        parts = math.prod(axis_sizes[n] for n in names)
        if size % parts:
            raise PlanError(f"{what}: dimension {dim} of shape {list(shape)} is {size}, not "
                            f"divisible by the {parts} devices of mesh axes {', '.join(names)}")


def unmatched_rules(rules: tuple[Rule, ...], names: list[str], optional: frozenset[str]) -> list[Rule]:
    """The plan's rules that match none of ``names`` (a shorthand's own are optional)."""
    return [rule for rule in rules if rule.pattern not in optional
            and not any(rule.matches(name) for name in names)]


def dump_stem(factory: str, plan: ModulePlan, mode: str, plan_path: str | None) -> str:
    """The dump's file name without suffix: ``<model>_<plan>_<mesh>[_train]``, the model named
    by its factory (``models.zoo.gpt2:gpt2`` -> ``gpt2``; else ``<module>_<factory>``), the plan
    by its shorthand or its file's name without the model's name in front of it
    (``convnet_megatron.toml`` -> ``megatron``)."""
    module, attribute = parse_factory(factory)
    module_name, factory_name = module.rsplit(".", 1)[-1], attribute.rsplit(".", 1)[-1]
    model = factory_name if module_name == factory_name else f"{module_name}_{factory_name}"
    plan_name = Path(plan_path).stem if plan_path is not None else str(plan.shorthand)
    plan_name = plan_name.removeprefix(f"{model}_") or plan_name
    name = f"{model}_{plan_name}_{plan.label}" + ("_train" if mode == "train" else "")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
