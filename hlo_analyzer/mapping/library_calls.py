"""Library calls of an eagerly run PyTorch model, recovered from a torch-xla dump.

PyTorch run eagerly launches one kernel per library call, not one per HLO op: ``x.mean()``
lowers to five HLO ops and is one reduction kernel; ``F.gelu(approximate="tanh")`` is nine ops
and one kernel. torch-xla writes on every op (``XLA_HLO_DEBUG=1``) the torch call that made it
(``aten__mean``, ``aten__tanh_gelu.34/aten__mul``: the first path component names the call,
numbered when torch-xla numbers it, after any IR scope the tracer pushed: a training step's
forward is ``hlo_trace_forward.3/aten__mul.5/aten__mul``) and one source frame (``stdit3.py:219``). The ops of one
call share both and are joined by data edges: :func:`call_groups` finds them as the connected
components of the ops with the same call and frame.

A model can say that a whole function is one library kernel (``models.opensora.library_calls``;
the tracer lists those functions' source lines in the sidecar as ``library_calls``): then every
op made on those lines is one call of that kind, whatever torch call made it. Kinds with a
meaning here: ``linear`` (its element-wise ops are the epilogue of the GEMM they read: cuBLASLt's
bias epilogue), ``flash_attention`` (the attention whose result reaches these lines, directly or
through a ring attention's combining ops, is one fused kernel: the official code calls flash-attn
or xformers there), ``copy`` (its data movement is one copy kernel), ``transposed_tokens`` (a view
that leaves the model's residual stream channel-major in every stage: ``hlo_analyzer.mapping.torch_layouts``).
Any other kind (``layer_norm``) is one memory-bound kernel over its ops. An op without a location
is a call of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from hlo_analyzer.dataflow import CONSTANT_OPS

__all__ = ["ATTENTION_CALL", "COPY_CALL", "LINEAR_CALL", "TRANSPOSED_TOKENS_CALL", "Call", "CallRegion", "call_groups",
           "folded_constants", "sidecar_call_regions", "sidecar_traced_pytorch"]

LINEAR_CALL, ATTENTION_CALL, COPY_CALL = "linear", "flash_attention", "copy"
TRANSPOSED_TOKENS_CALL = "transposed_tokens"
#: torch-xla's name of a dtype cast it inserts (``x.float()`` gets it too).
CAST_CALL = "xla__cast"
#: torch-xla names a torch call ``namespace__op`` (``aten__mul``, ``xla__cast``, ``prim__Constant``);
#: an IR scope pushed around calls (``tracing.training.ir_scope``: the training step's forward and
#: optimizer) is a plain name before them in the op's name path.
CALL_SEPARATOR = "__"


@dataclass(frozen=True)
class CallRegion:
    """Source lines (inclusive) of a model function that is one library call of ``kind``."""

    kind: str
    file: str
    first_line: int
    last_line: int


@dataclass(frozen=True)
class Call:
    """One library call: its kind (a region's kind, else the torch call's name without its
    ``aten__`` prefix and number, e.g. ``softmax``, ``tanh_gelu``, ``cast``) and its nodes."""

    kind: str
    nodes: tuple[int, ...]
    in_region: bool


def sidecar_call_regions(document: Any) -> tuple[CallRegion, ...]:
    """The ``library_calls`` of a tracer sidecar (none when it has none or they are malformed)."""
    entries = document.get("library_calls") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return ()
    regions = []
    for entry in entries:
        try:
            region = CallRegion(str(entry["kind"]), str(entry["file"]), int(entry["first_line"]),
                                int(entry["last_line"]))
        except (KeyError, TypeError, ValueError):
            return ()
        regions.append(region)
    return tuple(regions)


def sidecar_traced_pytorch(document: Any) -> bool:
    """Whether a sidecar is ``trace-module``'s (a PyTorch model traced by torch-xla, whose op
    locations give its library calls): it names the model's factory and torch-xla's version.
    (``trace-stage``'s sidecars say so by their ``library_calls``; the bundled dumps that
    predate those keep the compiled-graph default.)"""
    if not isinstance(document, dict):
        return False
    model, versions = document.get("model"), document.get("versions")
    return (isinstance(model, dict) and "factory" in model
            and isinstance(versions, dict) and "torch_xla" in versions)


def _call_key(location: str) -> tuple[str, str]:
    """(torch call name, source frame) of a formatted location ``names @ file:line``: the first
    component of the name path that names a torch call (``namespace__op``, :data:`CALL_SEPARATOR`),
    past any IR scope the tracer pushed around it (``hlo_trace_forward.3/aten__mul.5/aten__mul``:
    ``aten__mul.5``, the call, not the training step's forward scope); the first component
    when none does."""
    names, _, frame = location.partition(" @ ")
    components = names.split("/")
    return next((c for c in components if CALL_SEPARATOR in c), components[0]), frame


def _kind_of(call: str) -> str:
    """``aten__tanh_gelu.34`` -> ``tanh_gelu``; ``xla__cast`` -> ``cast``."""
    name = call.split(".", 1)[0]
    for prefix in ("aten__", "xla__"):
        name = name.removeprefix(prefix)
    return name or "op"


def _region_of(frame: str, regions: Sequence[CallRegion]) -> int | None:
    file, _, line = frame.rpartition(":")
    if not line.isdigit():
        return None
    number = int(line)
    for index, region in enumerate(regions):
        if region.file == file and region.first_line <= number <= region.last_line:
            return index
    return None


def _join_promotion_casts(graph: nx.DiGraph, keys: dict[int, Any]) -> None:
    """torch-xla computes a bfloat16 multiply in float32 and writes the casts around it as
    ``xla__cast`` ops on the multiply's source line; PyTorch does the same inside the one kernel.
    A cast outside a region that shares its frame with the call it reads (else the call that
    reads it) joins that call; a cast on a line of its own (``x.float()``) stays a kernel."""
    attributes_of = graph.nodes
    for node, key in list(keys.items()):
        if key[0] != "call" or key[1] != CAST_CALL:
            continue
        neighbours = [p for p in attributes_of[node]["operands"] if p is not None]
        neighbours += sorted(graph.successors(node))
        for other in neighbours:
            other_key = keys.get(other)
            if other_key is not None and other_key[0] == "call" and other_key[1] != CAST_CALL \
                    and other_key[2] == key[2]:
                keys[node] = other_key
                break


#: Ops that repeat one value over a tensor (:func:`_scalar_splat`).
_SPLAT_OPS = frozenset({"broadcast", "broadcast_in_dim"})


def _scalar_splat(attributes: dict[str, Any]) -> bool:
    """A scalar repeated over a tensor (a layer norm's epsilon, a Python number torch-xla passes
    as an argument): part of no call, so that a splat that torch-xla makes once and several calls
    read (every layer norm of a stage reads one) joins none of them; each reads it as the
    scalar it is."""
    return attributes["name"] in _SPLAT_OPS and attributes["operand_shapes"] == ((),)


def _scalar_arithmetic(attributes: dict[str, Any]) -> bool:
    """An op on scalars alone (``eps * alpha`` of a Python number torch-xla passed as an
    argument, a rank-0 value): PyTorch computes it on the host and passes the result to the
    kernel. A tensor of one element is a tensor on the GPU (a device's slice (1, 1) of the
    timestep of a batch split over the devices): an op on it is a kernel, as on the whole batch."""
    def scalar(shape: Sequence[int]) -> bool:
        return len(shape) == 0

    return all(map(scalar, attributes["result_shapes"])) and all(map(scalar, attributes["operand_shapes"]))


#: Values that each device knows before it runs: its index in the partitioned program. GSPMD
#: computes the offset of a device's slice from it (a ``dynamic_slice`` of a table of offsets
#: by ``partition_id``); PyTorch on that GPU knows its offsets on the host.
DEVICE_CONSTANT_OPS = frozenset({"partition_id", "replica_id"})


def folded_constants(graph: nx.DiGraph) -> set[int]:
    """Constants and everything computed from constants alone (a ``mean``'s divisor, a view of a
    constant that XLA shares between calls, the offset of a device's slice computed from its
    index): PyTorch folds such values into the kernels that read them (a scalar argument of
    the launch), so they are no kernel and no memory traffic."""
    constant: set[int] = set()
    attributes_of = graph.nodes
    for node in sorted(graph):
        attributes = attributes_of[node]
        operands = attributes["operands"]
        if attributes["name"] in CONSTANT_OPS or attributes["name"] in DEVICE_CONSTANT_OPS or \
                (operands and None not in operands and constant.issuperset(operands)):
            constant.add(node)
    return constant


def call_groups(graph: nx.DiGraph, nodes: Collection[int], regions: Sequence[CallRegion],
                owners: dict[int, int] | None = None) -> list[Call]:
    """The library calls among ``nodes`` (module docstring), in program order of their first node.

    Constants, values computed from constants alone (:func:`folded_constants`), arithmetic on
    scalars alone and splats of a scalar (:func:`_scalar_splat`) belong to no call;
    ``owners`` (the block pair of each node, ``hlo_analyzer.pairs``) keeps a call within one pair,
    as the model's calls are. Two nodes are in one call when one reads the other and both
    have the same key: the region their source line lies in, else their torch call and frame.
    """
    attributes_of = graph.nodes
    keys: dict[int, Any] = {}
    constant = folded_constants(graph)
    for node in sorted(nodes):
        attributes = attributes_of[node]
        if node in constant or _scalar_arithmetic(attributes) or _scalar_splat(attributes):
            continue
        location = attributes.get("location", "")
        if not location:
            keys[node] = ("node", node)
            continue
        call, frame = _call_key(location)
        region = _region_of(frame, regions)
        keys[node] = ("region", region, regions[region].kind) if region is not None else ("call", call, frame)
    _join_promotion_casts(graph, keys)
    parent: dict[int, int] = {}

    def find(node: int) -> int:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    owner = (owners or {}).get
    for node in sorted(keys):
        find(node)
        for producer in attributes_of[node]["operands"]:
            if producer is not None and keys.get(producer) == keys[node] and owner(producer) == owner(node):
                a, b = find(producer), find(node)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    members: dict[int, list[int]] = {}
    for node in sorted(keys):
        members.setdefault(find(node), []).append(node)
    calls = []
    for group in members.values():
        key = keys[group[0]]
        if key[0] == "region":
            calls.append(Call(key[2], tuple(group), True))
        elif key[0] == "call":
            calls.append(Call(_kind_of(key[1]), tuple(group), False))
        else:
            calls.append(Call(attributes_of[group[0]]["name"], tuple(group), False))
    return calls
