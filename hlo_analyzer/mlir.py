"""The one place that touches the MLIR bindings shipped in jaxlib.

It owns the MLIR context (dialect registration), detects what kind of dump a file holds, and wraps
jaxlib's private conversion entry points (HLO text -> StableHLO, StableHLO -> MHLO), so that a
jaxlib upgrade breaks one module and not the whole project.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from pathlib import Path

from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import chlo, mhlo, sdy, stablehlo

from hlo_trace.errors import InputFileError, UnsupportedIRError

log = logging.getLogger(__name__)

_MLIR_BYTECODE_MAGIC = b"ML\xefR"


class DumpKind(enum.Enum):
    """What a dump holds, judged from its content rather than its file name."""

    MLIR_TEXT = "mlir-text"  # StableHLO and/or MHLO text
    MLIR_BYTECODE = "mlir-bytecode"
    HLO_TEXT = "hlo-text"  # XLA's HloModule text, e.g. an after_spmd-partitioning dump


_thread_state = threading.local()
_mhlo_passes_registered = False


def new_context() -> ir.Context:
    """A context that knows func, stablehlo, mhlo, chlo and sdy (a Shardy dump parses too)."""
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext

    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context = ir.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    stablehlo.register_dialect(context)
    mhlo.register_mhlo_dialect(context)
    chlo.register_dialect(context)
    sdy.register_dialect(context)
    return context


def default_context() -> ir.Context:
    """One context per thread, created on first use (creating one costs ~50 ms)."""
    context = getattr(_thread_state, "context", None)
    if context is None:
        context = new_context()
        _thread_state.context = context
    return context


def detect_kind(data: bytes, origin: str = "<input>") -> DumpKind:
    """Tell MLIR text, MLIR bytecode and HLO text apart by their first meaningful line."""
    if data.startswith(_MLIR_BYTECODE_MAGIC):
        return DumpKind.MLIR_BYTECODE
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{origin}: not UTF-8 text and not MLIR bytecode") from None
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith(("//", "#")):
            continue
        if line.startswith("HloModule"):
            return DumpKind.HLO_TEXT
        if line.startswith(("module", "func.func", '"builtin.module"', "sdy.mesh")):
            return DumpKind.MLIR_TEXT
        break
    raise InputFileError(
        f"{origin}: neither MLIR (expected 'module' or 'func.func') nor HLO text "
        "(expected 'HloModule') at the start"
    )


def hlo_text_to_stablehlo_bytecode(hlo_text: str, origin: str = "<input>") -> bytes:
    """Convert XLA HLO text to StableHLO bytecode through jaxlib's own converter."""
    from jaxlib import _hlo, _jax

    try:
        hlo_module = _hlo.hlo_module_from_text(hlo_text)
    except Exception as exc:  # jaxlib raises XlaRuntimeError/ValueError with a long message
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = next((line for line in lines if "error:" in line), lines[0] if lines else "")
        raise InputFileError(f"{origin}: HLO text does not parse: {detail}") from None
    return _jax.mlir.hlo_to_stablehlo(hlo_module.as_serialized_hlo_module_proto())


def hlo_header_num_partitions(hlo_text: str) -> int | None:
    """``num_partitions=N`` from the ``HloModule`` header line (XLA's module config, which the
    HLO -> StableHLO converter does not carry over)."""
    header = hlo_text.lstrip().split("\n", 1)[0]
    for field in header.split(", "):
        key, _, value = field.strip().partition("=")
        if key == "num_partitions" and value.isdigit():
            return int(value)
    return None


def parse_module(data: bytes | str, origin: str = "<input>",
                 context: ir.Context | None = None) -> ir.Module:
    """Parse any supported dump into an MLIR module (HLO text is converted to StableHLO first)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not raw.strip():
        raise InputFileError(f"{origin}: file is empty")
    kind = detect_kind(raw, origin)
    context = context or default_context()
    num_partitions = None
    if kind is DumpKind.HLO_TEXT:
        hlo_text = raw.decode("utf-8")
        num_partitions = hlo_header_num_partitions(hlo_text)
        raw = hlo_text_to_stablehlo_bytecode(hlo_text, origin)
    with context:
        try:
            module = ir.Module.parse(raw if kind is not DumpKind.MLIR_TEXT else raw.decode())
        except ir.MLIRError as exc:
            raise InputFileError(f"{origin}: MLIR does not parse: {_first_diagnostic(exc)}") from None
        module = _upgrade_vhlo(module, raw, context, origin)
        if num_partitions is not None:
            # The converter drops the device count; collectives with empty groups need it.
            module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(32), num_partitions)
    log.debug("parsed %s as %s", origin, kind.value)
    return module


def _upgrade_vhlo(module: ir.Module, raw: bytes, context: ir.Context, origin: str) -> ir.Module:
    """A portable artifact (``jax.export``'s VHLO bytecode) -> StableHLO, through StableHLO's own
    deserializer; any other VHLO input is refused in one line."""
    if not any(op.operation.name.startswith("vhlo.") for op in module.body.operations):
        return module
    try:
        return stablehlo.deserialize_portable_artifact(context, raw)
    except Exception as exc:  # the bindings raise MLIRError/ValueError with a long message
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedIRError(
            f"{origin}: VHLO module that is not a StableHLO portable artifact "
            f"(expected jax.export's serialized bytecode): {detail}") from None


def load_module(source: str | os.PathLike | bytes, context: ir.Context | None = None) -> ir.Module:
    """Load a dump from a path (str or Path) or from its content (bytes, or text with newlines).

    Accepts StableHLO text or bytecode, MHLO text, and HLO text; the kind is detected from the
    content, not the file name.
    """
    if isinstance(source, bytes):
        return parse_module(source, "<bytes>", context)
    if isinstance(source, str) and ("\n" in source or source.lstrip().startswith(("module", "Hlo"))):
        return parse_module(source, "<text>", context)
    path = Path(source)
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if path.is_dir():
        raise InputFileError(f"{path}: is a directory, expected a dump file")
    return parse_module(path.read_bytes(), str(path), context)


def stablehlo_to_mhlo(module: ir.Module) -> ir.Module:
    """Legalize a StableHLO module to MHLO in place (and return it)."""
    global _mhlo_passes_registered
    if not _mhlo_passes_registered:
        mhlo.register_mhlo_passes()
        _mhlo_passes_registered = True
    with module.context:
        pipeline = passmanager.PassManager.parse("builtin.module(stablehlo-legalize-to-hlo)")
        pipeline.run(module.operation)
    return module


def module_to_text(module: ir.Module) -> str:
    """Full textual form with locations (never elided: elided constants do not parse back)."""
    return module.operation.get_asm(enable_debug_info=True)


def hlo_text_to_mlir_text(hlo_text: str, dialect: str = "stablehlo", origin: str = "<hlo>") -> str:
    """HLO text -> StableHLO or MHLO text, the form the tracer writes as a dump."""
    if dialect not in ("stablehlo", "mhlo"):
        raise UnsupportedIRError(f"dialect {dialect!r}: expected 'stablehlo' or 'mhlo'")
    module = parse_module(hlo_text, origin)
    if dialect == "mhlo":
        module = stablehlo_to_mhlo(module)
    return module_to_text(module)


def _first_diagnostic(exc: ir.MLIRError) -> str:
    diagnostics = getattr(exc, "error_diagnostics", None)
    if diagnostics:
        first = diagnostics[0]
        return f"{first.location}: {first.message}"
    return str(exc).strip().splitlines()[0]
