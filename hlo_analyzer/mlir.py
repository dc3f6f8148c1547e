"""The one place that touches the MLIR bindings shipped in jaxlib.

It owns the MLIR context (dialect registration), detects what kind of dump a file holds, and wraps
jaxlib's private conversion entry points (HLO text -> StableHLO, StableHLO -> MHLO), so that a
jaxlib upgrade breaks one module and not the whole project.
"""

from __future__ import annotations

import codecs
import enum
import logging
import os
import re
import threading
from collections.abc import Iterator

from jaxlib.mlir import ir, passmanager
from jaxlib.mlir._mlir_libs import _jax_mlir_ext  # imported here, never first in a forked child
from jaxlib.mlir.dialects import chlo, func, mhlo, sdy, stablehlo

from hlo_trace.documents import check_input_file
from hlo_trace.errors import InputFileError, UnsupportedIRError, shown
from hlo_trace.isolate import ChildLimitExceeded, call_in_child, other_threads_run
from hlo_trace.numbers import brief, parse_int

log = logging.getLogger(__name__)

_MLIR_BYTECODE_MAGIC = b"ML\xefR"


class DumpKind(enum.Enum):
    """What a dump holds, judged from its content rather than its file name."""

    MLIR_TEXT = "mlir-text"  # StableHLO and/or MHLO text
    MLIR_BYTECODE = "mlir-bytecode"
    HLO_TEXT = "hlo-text"  # XLA's HloModule text, e.g. an after_spmd-partitioning dump


_thread_state = threading.local()
_mhlo_passes_registered = False


def load_native_libraries() -> None:
    """Import the native libraries of jaxlib that the analysis and the converters load only when
    first needed (XLA's client: sharding strings, HLO text): a command imports them first,
    where an interrupt cannot leave them half-initialised (``hlo_trace.cli.native_imports``)."""
    from jaxlib import _hlo, _jax, xla_client  # noqa: F401


def new_context() -> ir.Context:
    """A context that knows func, stablehlo, mhlo, chlo and sdy (a Shardy dump parses too)."""
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


def use_fresh_context(*, threads: bool = True) -> None:
    """Give this thread a new default context (after ``os.fork``: the parent's context keeps a
    thread pool whose threads did not fork, so it must not be used, nor destroyed, here).

    ``threads=False`` turns MLIR's multithreading off in it (no thread pool: a module it holds
    can be read in a process forked from this one; the parser verifies functions one by one)."""
    old = getattr(_thread_state, "context", None)
    if old is not None:
        _forked_away.append(old)  # kept alive: its destructor would join threads that are gone
    context = new_context()
    if not threads:
        context.enable_multithreading(False)
    _thread_state.context = context


_forked_away: list[ir.Context] = []


def _stripped_lines(text: str | bytes) -> Iterator[str]:
    """The lines of ``text`` (ended by ``\n`` or ``\r``, as MLIR's lexer ends a comment),
    stripped, one at a time: a 100 MB dump is not split whole to find its first line. ``text``
    may be ASCII bytes, whose lines are decoded as they come."""
    newline, carriage_return = ("\n", "\r") if isinstance(text, str) else (b"\n", b"\r")
    start = 0
    while start < len(text):
        end = text.find(newline, start)  # type: ignore[arg-type]
        end = len(text) if end < 0 else end
        for line in text[start:end].split(carriage_return):  # type: ignore[arg-type]
            yield (line if isinstance(line, str) else line.decode("ascii")).strip()
        start = end + 1


def detect_kind(data: bytes, origin: str = "<input>") -> DumpKind:
    """Tell MLIR text, MLIR bytecode and HLO text apart by their first meaningful line."""
    if data.startswith(_MLIR_BYTECODE_MAGIC):
        return DumpKind.MLIR_BYTECODE
    return _text_kind(_decode(data, origin), origin)


#: Bytes read from the start of an input file to tell whether it can be a dump at all.
SNIFF_BYTES = 1024
#: The longest start of a first meaningful line that ``_text_kind`` recognises.
_LONGEST_START = max(len(start) for start in ("HloModule", "module", "func.func", '"builtin.module"',
                                              "sdy.mesh"))


def sniff_kind(head: bytes, origin: str) -> None:
    """Refuse, from the first bytes of a file, what cannot be a dump: not MLIR bytecode, and
    not UTF-8 text, or text whose first meaningful line starts with none of the dump kinds'
    words (``detect_kind``'s rules). Undecided heads (comments only, a line still too short,
    a character cut at the end) pass: the whole file is read and detected then."""
    if head.startswith(_MLIR_BYTECODE_MAGIC) or _MLIR_BYTECODE_MAGIC.startswith(head):
        return
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        raise InputFileError(f"{origin}: not UTF-8 text and not MLIR bytecode") from None
    complete = len(head) < SNIFF_BYTES
    lines = list(_stripped_lines(text))
    for number, line in enumerate(lines):
        if not line or line.startswith(("//", "#")):
            continue
        is_last = number == len(lines) - 1 and not complete
        if is_last and len(line) < _LONGEST_START:
            return  # the line goes on past the head
        _text_kind(line, origin)
        return


def _decode(data: bytes, origin: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{origin}: not UTF-8 text and not MLIR bytecode") from None


def _text_kind(text: str | bytes, origin: str) -> DumpKind:
    """MLIR text or HLO text, by the first meaningful line (see ``detect_kind``)."""
    for line in _stripped_lines(text):
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
    try:
        return _jax.mlir.hlo_to_stablehlo(hlo_module.as_serialized_hlo_module_proto())
    except Exception as exc:  # XlaRuntimeError: a layout or shape the converter refuses
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise InputFileError(f"{origin}: HLO text does not convert to StableHLO: "
                             f"{lines[0] if lines else type(exc).__name__}") from None


def hlo_header_num_partitions(hlo_text: str, origin: str = "<input>") -> int | None:
    """``num_partitions=N`` from the ``HloModule`` header line (XLA's module config, which the
    HLO -> StableHLO converter does not carry over)."""
    header = hlo_text.lstrip().split("\n", 1)[0]
    for field in header.split(", "):
        key, _, value = field.strip().partition("=")
        if key == "num_partitions":
            try:
                return parse_int(value, minimum=1, maximum=MAX_DEVICES)
            except ValueError as error:
                raise InputFileError(f"{origin}: HloModule num_partitions={brief(value)}: "
                                     f"{error}") from None
    return None


def parse_module(data: bytes | str, origin: str = "<input>",
                 context: ir.Context | None = None) -> ir.Module:
    """Parse any supported dump into an MLIR module (HLO text is converted to StableHLO first)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not raw or raw.isspace():  # (not raw.strip(): no copy of a 100 MB dump)
        raise InputFileError(f"{origin}: file is empty")
    # Text is decoded once, here: the kind is read from it, and it is what the parser takes.
    # ASCII bytes (nearly every dump) are UTF-8 as they are: kept, not copied into a str.
    text: str | bytes
    if raw.startswith(_MLIR_BYTECODE_MAGIC):
        kind, text = DumpKind.MLIR_BYTECODE, ""
    else:
        text = data if isinstance(data, str) else raw if raw.isascii() else _decode(raw, origin)
        kind = _text_kind(text, origin)
    context = context or default_context()
    num_partitions = None
    if kind is DumpKind.HLO_TEXT:
        text = text if isinstance(text, str) else text.decode("ascii")
        num_partitions = hlo_header_num_partitions(text, origin)
        raw = hlo_text_to_stablehlo_bytecode(text, origin)
    elif kind is DumpKind.MLIR_TEXT:
        check_string_escapes(raw, origin)
    else:
        check_bytecode(raw, origin)
    with context:
        try:
            module = ir.Module.parse(text if kind is DumpKind.MLIR_TEXT else raw)
        except ir.MLIRError as exc:
            raise InputFileError(f"{origin}: MLIR does not parse: {_first_diagnostic(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - any failure to parse given text is the input's
            # The bindings' own failures on malformed input (bytecode whose counts make LLVM's
            # SmallVector refuse to grow, a buffer they cannot take): the input's fault too.
            raise InputFileError(f"{origin}: MLIR does not parse: {_reason(exc)}") from None
        module = _upgrade_vhlo(module, raw, context, origin)
        if num_partitions is not None:
            # The converter drops the device count; collectives with empty groups need it.
            module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(32), num_partitions)
        check_device_counts(module, origin)
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


def load_module(path: str | os.PathLike | bytes, context: ir.Context | None = None) -> ir.Module:
    """Load a dump file: StableHLO text or bytecode, MHLO text, or HLO text (the kind is detected
    from the content, not the file name).

    A ``str`` or ``PathLike`` is always a path, whatever it looks like (XLA names its dumps
    ``module_0003...``); ``bytes`` are content (e.g. ``jax.export``'s serialized bytecode).
    Text held in memory goes through :func:`load_module_text`.
    """
    if isinstance(path, (bytes, bytearray)):
        return parse_module(bytes(path), "<bytes>", context)
    return parse_module(read_input_file(path), shown(path), context)


def load_module_text(content: str | bytes, origin: str = "<text>",
                     context: ir.Context | None = None) -> ir.Module:
    """Parse a dump held in memory (MLIR text, MLIR bytecode or HLO text)."""
    return parse_module(content, origin, context)


def read_input_file(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file; a missing file, a directory, a FIFO, a device or an unreadable
    file is one ``InputFileError`` (checked with ``stat`` first, so a FIFO never blocks)."""
    name = shown(path)
    check_input_file(path, "a dump file")
    try:
        with open(path, "rb") as handle:
            sniff_kind(handle.read(SNIFF_BYTES), name)  # a 2 GB non-dump is not read whole
            handle.seek(0)
            return handle.read()
    except (OSError, MemoryError) as exc:
        raise InputFileError(f"{name}: cannot read: {_reason(exc)}") from None


#: Seconds a bytecode parse may take: the fixed part, and per MB of bytecode (a 150k-op
#: program, 1.9 MB, parses in 1.2 s on the reference machine).
BYTECODE_PARSE_S = 10.0
BYTECODE_PARSE_S_PER_MB = 10.0
#: Memory a bytecode parse may take beyond the process's own: the fixed part, and per byte of
#: bytecode (the 150k-op program takes ~70 bytes of IR per byte of bytecode).
BYTECODE_PARSE_BYTES = 2 << 30
BYTECODE_PARSE_BYTES_PER_BYTE = 512


def check_bytecode(raw: bytes, origin: str) -> None:
    """Refuse MLIR bytecode that the bindings cannot hand to Python, or whose parse does not end.

    Its strings (names, locations, string attributes: the string section) must be UTF-8, as
    in text (``check_string_escapes``): jaxlib's bindings fail, or abort the process, when such
    a string is read back as ``str``. And it must parse within a time and memory limit
    (``BYTECODE_PARSE_*``, growing with its size): a malformed count in bytecode makes the
    reader loop or allocate without bound, so it is parsed first in a forked child with those
    limits (``hlo_trace.isolate``), then here. (Not in a process that runs other threads, e.g.
    a JAX program calling ``load_module``: a child forked from it could wait forever on a lock
    one of them held; the commands fork from processes of one thread.)"""
    check_bytecode_strings(raw, origin)
    if other_threads_run():
        return
    megabytes = len(raw) / 1e6
    try:
        call_in_child(_parse_bytecode, raw, origin=origin, what="parsing its MLIR bytecode",
                      time_s=BYTECODE_PARSE_S + BYTECODE_PARSE_S_PER_MB * megabytes,
                      memory_bytes=BYTECODE_PARSE_BYTES + BYTECODE_PARSE_BYTES_PER_BYTE * len(raw))
    except ChildLimitExceeded as exc:
        raise InputFileError(f"{origin}: MLIR bytecode does not parse: {exc.reason} (a "
                             "malformed count?)") from None


def _parse_bytecode(raw: bytes) -> None:
    """In the bounded child: parse (any error is the parse's own, raised again in the parent)."""
    use_fresh_context(threads=False)
    with default_context():
        try:
            ir.Module.parse(raw)
        except MemoryError:  # past the memory limit: the parent says so
            raise
        except Exception:  # noqa: BLE001 - the parent parses again and words the error
            pass


def check_bytecode_strings(raw: bytes, origin: str) -> None:
    """Refuse bytecode whose string section holds a string that is not UTF-8. A file whose
    sections cannot be read is left to the parser (it words that error)."""
    strings = _bytecode_strings(raw)
    if strings is None:
        return
    try:
        strings.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = strings.rfind(b"\0", 0, exc.start) + 1
        end = strings.find(b"\0", exc.start)
        text = strings[start:end if end >= 0 else len(strings)]
        shown_text = text.decode("utf-8", errors="backslashreplace")[:60]
        raise InputFileError(
            f"{origin}: MLIR bytecode string {shown_text!r} is not UTF-8 (names, locations and "
            "string attributes must be UTF-8 text)") from None


#: The string section's id in MLIR bytecode (mlir/Bytecode/Encoding.h).
_STRING_SECTION = 0


def _bytecode_strings(raw: bytes) -> bytes | None:
    """The string data of MLIR bytecode's string section (its strings, each ended by NUL), or
    None when the file's sections cannot be read."""
    try:
        position = len(_MLIR_BYTECODE_MAGIC)
        _, position = _varint(raw, position)  # version
        position = raw.index(b"\0", position) + 1  # producer
        while position < len(raw):
            ident = raw[position]
            length, position = _varint(raw, position + 1)
            if ident & 0x80:  # aligned: the alignment, then padding up to it
                alignment, position = _varint(raw, position)
                if alignment < 1 or alignment > 1 << 16:
                    return None
                position += -position % alignment
            if ident & 0x7F == _STRING_SECTION:
                section = raw[position:position + length]
                count, offset = _varint(section, 0)
                sizes = 0
                for _ in range(count):
                    size, offset = _varint(section, offset)
                    sizes += size
                return section[offset:offset + sizes]
            position += length
    except (IndexError, ValueError):
        return None
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """MLIR bytecode's prefix varint at ``position``: (value, position after it). The first
    byte's trailing zeros say how many bytes follow; a zero byte, that 8 bytes follow."""
    first = data[position]
    if first == 0:
        if position + 9 > len(data):
            raise IndexError(position)
        return int.from_bytes(data[position + 1:position + 9], "little"), position + 9
    count = (first & -first).bit_length()
    if position + count > len(data):
        raise IndexError(position)
    return int.from_bytes(data[position:position + count], "little") >> count, position + count


def check_string_escapes(raw: bytes, origin: str) -> None:
    """Refuse string literals whose ``\\XX`` escapes spell bytes that are not UTF-8.

    The MLIR lexer accepts any byte as ``\\XX`` in a string (a location, a symbol name, a string
    attribute), but jaxlib's Python bindings abort the process when such a string is read back
    as ``str``. Checked on the text, before parsing, in one pass over its backslashes.
    """
    if b"\\" not in raw:
        return
    for match in _ESCAPE_RUN.finditer(raw):
        run = match.group(1)
        if run is None:
            continue  # an escaped backslash or quote
        try:
            bytes.fromhex(run.replace(b"\\", b"").decode("ascii")).decode("utf-8")
        except UnicodeDecodeError:
            line = raw.count(b"\n", 0, match.start()) + 1
            raise InputFileError(
                f"{origin}: line {line}: string escape {run.decode('ascii')} is not UTF-8 "
                "(names, locations and string attributes must be UTF-8 text)") from None


#: An escaped backslash or quote (skipped), or a run of ``\XX`` hex escapes (group 1).
_ESCAPE_RUN = re.compile(rb'\\[\\"]|((?:\\[0-9A-Fa-f]{2})+)')


def check_device_counts(module: ir.Module, origin: str) -> None:
    """``mhlo.num_partitions`` / ``mhlo.num_replicas``, when present, are positive integers
    (a boolean or a float there would read as -1 or fail deep inside the analysis)."""
    attributes = module.operation.attributes
    for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
        if name not in attributes:
            continue
        attribute = attributes[name]
        # jaxlib returns attributes downcast: ``true`` (and ``1 : i1``) is a BoolAttr, not an int.
        value = attribute.value if isinstance(attribute, ir.IntegerAttr) else None
        if value is None or value < 1 or value > MAX_DEVICES:
            raise InputFileError(f"{origin}: module attribute {name} = {attribute}: expected a "
                                 f"positive integer up to {MAX_DEVICES} (e.g. 4 : i32)")


#: Largest device count accepted from a module attribute: a sanity bound far above any machine
#: (the biggest published TPU pods and GPU clusters have ~1e5 chips), so that a mutated attribute
#: cannot make the analysis build per-device tables of billions of entries.
MAX_DEVICES = 1 << 20


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, MemoryError):
        return "out of memory"
    return str(exc) or type(exc).__name__


def _register_mhlo_passes() -> None:
    global _mhlo_passes_registered
    if not _mhlo_passes_registered:
        mhlo.register_mhlo_passes()
        _mhlo_passes_registered = True


def stablehlo_to_mhlo(module: ir.Module) -> ir.Module:
    """Legalize a StableHLO module to MHLO in place (and return it)."""
    _register_mhlo_passes()
    with module.context:
        pipeline = passmanager.PassManager.parse("builtin.module(stablehlo-legalize-to-hlo)")
        pipeline.run(module.operation)
    return module


#: The op that carries an MHLO replica-groups attribute through ``mhlo_replica_groups_to_stablehlo``
#: (the one collective with neither a region nor an operand attribute besides its dimension).
_GROUPS_CARRIER = "mhlo.all_gather"


def mhlo_replica_groups_to_stablehlo(attribute: ir.Attribute) -> ir.Attribute | None:
    """The StableHLO form of an MHLO collective's ``replica_groups`` attribute (e.g.
    ``#mhlo.replica_group_mesh_axes<...>`` -> ``#stablehlo.replica_group_mesh_axes<...>``, which
    the bindings can read: they have no class for the MHLO one), or None when MHLO's own
    legalization (``hlo-legalize-to-stablehlo``) does not convert it.

    The attribute goes through that pass on a module of one ``mhlo.all_gather`` that carries it,
    built with the bindings in the attribute's context. The verifier is off: the carrier's types
    are placeholders, and a mesh it names (``mesh = @mesh``) lives in the dump's module, not in
    this one; the caller resolves it there."""
    _register_mhlo_passes()
    with attribute.context, ir.Location.unknown():
        module = ir.Module.create()
        scalar = ir.RankedTensorType.get([], ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            function = func.FuncOp("carrier", ir.FunctionType.get([scalar], []))
            block = function.add_entry_block()
            with ir.InsertionPoint(block):
                ir.Operation.create(
                    _GROUPS_CARRIER, results=[scalar], operands=[block.arguments[0]],
                    attributes={"all_gather_dim": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0),
                                "replica_groups": attribute})
                func.ReturnOp([])
        pipeline = passmanager.PassManager.parse("builtin.module(hlo-legalize-to-stablehlo)")
        pipeline.enable_verifier(False)
        try:
            pipeline.run(module.operation)
        except ir.MLIRError:
            return None
        converted = next(iter(block.operations)).operation
        if converted.name == _GROUPS_CARRIER or "replica_groups" not in converted.attributes:
            return None
        return converted.attributes["replica_groups"]


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
    """The first error diagnostic of a failed parse, else the first line of its message, else
    the error's type (a parse that failed without saying why is still one line)."""
    diagnostics = getattr(exc, "error_diagnostics", None)
    if diagnostics:
        first = diagnostics[0]
        return f"{first.location}: {first.message}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
