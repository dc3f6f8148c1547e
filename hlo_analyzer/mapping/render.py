"""Rendering of the ``--hw`` sections as data: JSON-ready dicts and CSV records (their text lines:
``hlo_analyzer.table``), and :class:`HardwareSections`, the sections as the Report holds them
(``hlo_analyzer.report.Sections``)."""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from hardware import model_assumptions
from hlo_analyzer.mapping.results import FLASH_KIND, GEMM_KIND
from hlo_analyzer.mapping.sections import (
    BlockLabels,
    BlocksSection,
    MappingSection,
    PairGroup,
    TransformerSection,
)
from hlo_analyzer.report import NEEDS_SECTIONS, Report
from hlo_analyzer.rows import OpRow
from hlo_trace.errors import UsageError


@dataclass(frozen=True)
class HardwareSections:
    """What ``--hw`` adds to a Report (``hlo_analyzer.report.Sections``), each None where it was
    not found or not asked for: ``blocks``, an STDiT3 stage's pairs; ``mapping``, the hardware
    mapping; ``transformer``, a generic transformer's blocks (when no STDiT3 pairs are found)."""

    blocks: BlocksSection | None = None
    mapping: MappingSection | None = None
    transformer: TransformerSection | None = None

    def json_sections(self, *, kernels: bool = True) -> dict[str, Any]:
        return sections_dict(self, kernels=kernels)

    def splice_json(self, text: str) -> str:
        return splice_kernels(text, self)

    def records(self, by: str, rows: Sequence[OpRow], source: str) -> list[dict[str, Any]]:
        return block_rows(self, rows, source) if by == "block" else kernel_rows(self, source)


def hardware_sections(report: Report) -> HardwareSections:
    """The ``--hw`` sections of ``report`` (empty ones where none were added)."""
    sections = report.sections
    return sections if isinstance(sections, HardwareSections) else HardwareSections()


# -- JSON -------------------------------------------------------------------------------------------
def blocks_dict(blocks: BlocksSection) -> dict[str, Any]:
    return {
        "shapes": blocks.shapes.as_dict(),
        "pairs": blocks.pairs,
        "consistent": blocks.consistent,
        "labels": [b.to_dict() for b in blocks.blocks],
    }


def transformer_dict(transformer: TransformerSection) -> dict[str, Any]:
    return {
        "blocks": len(transformer.blocks),
        "consistent": transformer.consistent,
        "shapes": [dict(shapes) for shapes in transformer.shapes],
        "labels": [b.to_dict() for b in transformer.blocks],
    }


def labelled_blocks(sections: HardwareSections) -> tuple[BlockLabels, ...]:
    """Every block's labelled GEMMs: an STDiT3 stage's, or a generic transformer's."""
    if sections.blocks is not None:
        return sections.blocks.blocks
    if sections.transformer is not None:
        return sections.transformer.blocks
    return ()


def block_time_records(sections: HardwareSections) -> list[dict[str, Any]]:
    """Time per block (``--by block``): one record per block with its kind, and one for the
    work outside the blocks (``block`` None); empty without ``--hw`` or without blocks."""
    mapping = sections.mapping
    if mapping is None:
        return []
    kinds = {labels.index: labels.kind for labels in labelled_blocks(sections)}
    block_of = mapping.block_of or (None,) * len(mapping.program.ops)
    flops: dict[int | None, int] = {}
    for op, block in zip(mapping.program.ops, block_of):
        if op.kind in (GEMM_KIND, FLASH_KIND):
            flops[block] = flops.get(block, 0) + op.flops
    groups = mapping.blocks or (PairGroup(None, mapping.program.latency_s,
                                          tuple(mapping.program.seconds_by_kind().items()),
                                          len(mapping.program.ops)),)
    return [_block_time(group, kinds, flops) for group in groups]


def _block_time(group: PairGroup, kinds: dict[int, str], flops: dict[int | None, int]) -> dict[str, Any]:
    return {"block": group.pair, "kind": "outside the blocks" if group.pair is None else kinds.get(group.pair, ""),
            "kernels": group.kernels, "latency_s": group.latency_s, "matrix_flops": flops.get(group.pair, 0),
            "seconds_by_kind": dict(group.seconds_by_kind)}


#: Stands for the kernel list in the document that ``Report.to_json`` encodes; :func:`splice_kernels`
#: puts the list's text in its place.
KERNELS_PLACEHOLDER = "\0kernels"


def kernel_records(mapping: MappingSection) -> list[dict[str, Any]]:
    """One record per kernel: its block pair (STDiT3) and its block (``MappingSection.block_of``;
    None outside the blocks or without any)."""
    block_of = mapping.block_of or (None,) * len(mapping.program.ops)
    return [{"position": op.position, "pair": pair, "block": block, "name": op.name, "kind": op.kind,
             "shapes": op.shapes, "latency_s": op.latency_s, "utilization": op.utilization, "bound": op.bound,
             "compute_s": op.compute_s, "dram_s": op.dram_s, "noc_s": op.noc_s, "flops": op.flops,
             "dram_bytes": op.dram_bytes, "hlo_positions": list(op.positions)}
            for op, pair, block in zip(mapping.program.ops, mapping.pair_of, block_of)]


def _system_dict(mapping: MappingSection) -> dict[str, Any]:
    system = mapping.system.system
    return {"name": system.name, "chip": system.chip.name, "chips": system.chip_count,
            "dump_devices": mapping.system.devices, "topology": system.topology,
            "grid": f"{system.topology_rows}x{system.topology_cols}",
            # a single chip has no network: infinite bandwidth, written as null (JSON has no inf)
            "link_bandwidth_bytes_per_s": (None if math.isinf(system.link_bandwidth_bytes_per_s)
                                           else system.link_bandwidth_bytes_per_s),
            "hop_latency_s": system.hop_latency_s, "assumed": mapping.system.assumption}


def _reference_dict(mapping: MappingSection) -> dict[str, Any] | None:
    reference = mapping.reference
    if reference is None:
        return None
    return {"label": "one pair rebuilt from the ideal shape dictionary (comparison only; totals come "
                     "from the traced ops)",
            "pair_latency_s": reference.latency_s,
            "ops": [{"name": m.op_name, "type": m.op_type, "latency_s": m.latency_s,
                     "utilization": m.utilization, "bound": m.bound, "flops": m.flops}
                    for m in reference.mappings]}


def mapping_dict(mapping: MappingSection, *, kernels: bool = True) -> dict[str, Any]:
    """The mapping section; with ``kernels`` false the kernel list is ``KERNELS_PLACEHOLDER``."""
    totals = mapping.totals
    options = mapping.options
    return {
        "hardware": mapping.hardware,
        "chip": mapping.program.chip,
        "chips": mapping.system.system.chip_count,
        "system": _system_dict(mapping),
        "model": model_assumptions(mapping.system.system).as_dict(),
        "execution": options.execution,
        "options": {"dram_efficiency": options.dram_efficiency, "exp_ops": options.exp_ops,
                    "cross_attention": mapping.program.cross_attention,
                    "caption_tokens": options.caption_tokens,
                    "per_sample_attentions": mapping.program.per_sample_attentions},
        "distinct_mappings": mapping.program.distinct_mappings,
        "kernels": kernel_records(mapping) if kernels else KERNELS_PLACEHOLDER,
        "pairs": [{"pair": g.pair, "latency_s": g.latency_s, "kernels": g.kernels,
                   "seconds_by_kind": dict(g.seconds_by_kind)} for g in mapping.pairs],
        "blocks": [{"block": g.pair, "latency_s": g.latency_s, "kernels": g.kernels,
                    "seconds_by_kind": dict(g.seconds_by_kind)} for g in mapping.blocks],
        "reference": _reference_dict(mapping),
        "classes": [{"class": c.name, "kernels": c.kernels, "seconds": c.seconds,
                     "bound_seconds": c.bound_seconds, "ratio": c.ratio, "provenance": c.provenance}
                    for c in mapping.classes],
        "totals": totals.to_dict(),
    }


def sections_dict(sections: HardwareSections, *, kernels: bool = True) -> dict[str, Any]:
    """The ``--hw`` sections (``kernels`` false: the kernel list left as a placeholder)."""
    document: dict[str, Any] = {}
    if sections.blocks is not None:
        document["blocks"] = blocks_dict(sections.blocks)
    if sections.transformer is not None:
        document["transformer"] = transformer_dict(sections.transformer)
    if sections.mapping is not None:
        document["mapping"] = mapping_dict(sections.mapping, kernels=kernels)
    return document


def splice_kernels(text: str, sections: HardwareSections) -> str:
    """``text``, ``json.dumps(document, indent=1, sort_keys=True)`` of a document whose kernel
    list is the placeholder (``sections_dict(..., kernels=False)``), with the list written in
    its place exactly as that call would have written it (the pure-Python encoder that
    indentation needs costs seconds on 100k kernels; :func:`indented_records_json` does not)."""
    if sections.mapping is None:
        return text
    marker = '"kernels": ' + json.dumps(KERNELS_PLACEHOLDER)
    start = text.index(marker)
    assert text.find(marker, start + 1) < 0, "the kernel placeholder appears twice"
    level = start - (text.rindex("\n", 0, start) + 1)
    records = indented_records_json(kernel_records(sections.mapping), level)
    return f'{text[:start]}"kernels": {records}{text[start + len(marker):]}'


def indented_records_json(records: list[dict[str, Any]], level: int) -> str:
    """A list of flat dicts exactly as ``json.dumps(..., indent=1, sort_keys=True)`` writes it
    as a value ``level`` spaces deep (the indentation of its key's line), fast
    (:class:`_IndentedRecords`)."""
    return _IndentedRecords(level).text(records)


def _float_json(value: float) -> str:
    """A float as json writes it (``allow_nan``: NaN and infinities as JavaScript spells them)."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _true_false(value: bool) -> str:
    return "true" if value else "false"


def _null(value: None) -> str:
    return "null"


_INT = frozenset({int})


class _StringTexts(dict[str, str]):
    """str -> its JSON text, encoded on first use (kernels repeat a few names and shapes)."""

    def __missing__(self, value: str) -> str:
        text = self[value] = encode_basestring_ascii(value)
        return text


class _FloatTexts(dict[float, str]):
    """float -> its JSON text, written on first use (kernels repeat a few latencies). Zeros
    are not kept: 0.0 and -0.0 are one key but two texts."""

    def __missing__(self, value: float) -> str:
        text = _float_json(value)
        if value:
            self[value] = text
        return text


class _IndentedRecords:
    """A list of flat dicts as ``json.dumps(indent=1, sort_keys=True)`` writes it nested
    ``level`` spaces deep: strings, numbers, booleans, None and lists of ints written directly,
    anything else through json itself (re-indented to its depth).

    A dict is one ``%`` template per distinct (keys, value types), filled with each value's text;
    the texts of strings and floats are kept, as most values repeat."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._getters: dict[tuple[str, ...], Callable[[dict[str, Any]], tuple[Any, ...]]] = {}
        self._layouts: dict[tuple[Any, ...], tuple[str, tuple[Callable[[Any], str], ...]]] = {}
        self._writers: dict[type, Callable[[Any], str]] = {
            str: _StringTexts().__getitem__, int: int.__repr__, float: _FloatTexts().__getitem__,
            bool: _true_false, type(None): _null, list: self._list}
        items = "\n" + " " * (level + 3)
        self._list_text = ("[" + items, "," + items, "\n" + " " * (level + 2) + "]")

    def text(self, records: list[dict[str, Any]]) -> str:
        if not records:
            return "[]"
        pad = "\n" + " " * (self.level + 1)
        return "[" + pad + ("," + pad).join(map(self._record, records)) + "\n" + " " * self.level + "]"

    def _record(self, record: dict[str, Any]) -> str:
        keys = tuple(record)
        getter = self._getters.get(keys)
        if getter is None:
            getter = self._getters[keys] = _values_getter(sorted(keys))
        values = getter(record)
        types = tuple(map(type, values))
        layout = self._layouts.get((keys, types))
        if layout is None:
            layout = self._layouts[(keys, types)] = self._layout(sorted(keys), types)
        template, writers = layout
        return template % tuple(map(operator.call, writers, values))

    def _layout(self, keys: list[str], types: tuple[type, ...]) -> tuple[str, tuple[Callable[[Any], str], ...]]:
        """The ``%`` template of a dict with these (sorted) keys and value types, and the writer
        of each value."""
        if not keys:
            return "{}", ()
        pad = "\n" + " " * (self.level + 2)
        lines = [pad + encode_basestring_ascii(key).replace("%", "%%") + ": %s" for key in keys]
        template = "{" + ",".join(lines) + "\n" + " " * (self.level + 1) + "}"
        return template, tuple(self._writers.get(kind, self._nested) for kind in types)

    def _list(self, value: list[Any]) -> str:
        """A list value: of ints written directly, of anything else through json."""
        if not value or not set(map(type, value)) <= _INT:
            return self._nested(value)
        opening, separator, closing = self._list_text
        return opening + separator.join(map(int.__repr__, value)) + closing

    def _nested(self, value: Any) -> str:
        """Any value as json writes it at the depth of a dict's value."""
        return json.dumps(value, indent=1, sort_keys=True).replace("\n", "\n" + " " * (self.level + 2))


def _values_getter(keys: list[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A function giving a dict's values for ``keys``, in that order, as a tuple."""
    if len(keys) == 1:
        key = keys[0]
        return lambda record: (record[key],)
    return operator.itemgetter(*keys) if keys else lambda record: ()


# -- records for --by block / --by kernel -------------------------------------------------------------
def block_rows(sections: HardwareSections, rows: Sequence[OpRow], source: str) -> list[dict[str, Any]]:
    """One record per labelled GEMM of each block (an STDiT3 stage's or a generic transformer's);
    ``rows`` are the report's op rows, ``source`` names the dump in the error."""
    blocks = labelled_blocks(sections)
    if not blocks and sections.mapping is None:
        raise UsageError(f"{source}: {NEEDS_SECTIONS['block']}")
    by_position = {row.position: row for row in rows}
    kernel_of = ({position: kernel for kernel in sections.mapping.program.ops
                  for position in kernel.positions} if sections.mapping is not None else None)
    records = []
    for block in blocks:
        for label, positions in block.ops:
            for position in positions:
                row = by_position[position]
                record = {
                    "block": block.index, "kind": block.kind, "label": label,
                    "op": row.op, "operand_shapes": row.operand_shapes,
                    "result_shapes": row.result_shapes, "flops": row.flops,
                    "location": row.location,
                }
                if kernel_of is not None:
                    # the kernel that runs this GEMM (it may run others too: flash attention's
                    # two GEMMs, a GEMM and its epilogue), by its position in --by kernel
                    kernel = kernel_of.get(position)
                    record |= {"kernel": None if kernel is None else kernel.position,
                               "kernel_name": None if kernel is None else kernel.name,
                               "kernel_latency_s": None if kernel is None else kernel.latency_s}
                records.append(record)
    return records


def kernel_rows(sections: HardwareSections, source: str) -> list[dict[str, Any]]:
    """One record per kernel of the mapping section (needs ``--hw``)."""
    if sections.mapping is None:
        raise UsageError(f"{source}: {NEEDS_SECTIONS['kernel']}")
    return kernel_records(sections.mapping)
