"""Rewrite the source locations of dumps so that they hold no path of the machine that traced
them (``tracing.cli.portable_locations``: relative to the repository, ``site-packages/...``),
checking that no byte of their programs changes.

    python3 scripts/portable_dumps.py            # the bundled dumps: dumps/ and hlo_trace/examples/
    python3 scripts/portable_dumps.py FILE...    # these (MLIR text, or HLO text *.hlo.txt / *.txt)

A file is rewritten (atomically) only when a location changes (and its sidecar's
``mlir_bytes`` with it); the program is compared before
and after: for MLIR, the module printed without locations; for HLO text, the text with its
``source_file`` fields removed. A difference stops the script with one line and writes nothing
more. Idempotent: a second run changes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def bundled_dumps() -> list[Path]:
    examples = REPO_ROOT / "hlo_trace" / "examples"
    return sorted([*(REPO_ROOT / "dumps").glob("*/*.mlir"), *examples.glob("*.mlir"),
                   *examples.glob("*.hlo.txt")])


def program_of(path: Path, text: str) -> str:
    """What must not change: the MLIR module without its locations, or the HLO text without
    its source files."""
    if path.suffix == ".txt":
        return re.sub(r' source_file="[^"]*"', "", text)
    from hlo_analyzer.mlir import load_module_text

    return load_module_text(text, str(path)).operation.get_asm(enable_debug_info=False)


def relocate(path: Path) -> int:
    """Rewrite ``path``; the number of location strings changed."""
    from hlo_trace.atomic import atomic_write
    from hlo_trace.errors import UsageError
    from tracing.cli import portable_locations

    text = path.read_text()
    portable = portable_locations(text)
    if portable == text:
        return 0
    if program_of(path, portable) != program_of(path, text):
        raise UsageError(f"{path}: its program would change; nothing written")
    changed = sum(a != b for a, b in zip(text.splitlines(), portable.splitlines(), strict=True))
    atomic_write(path, portable, force=True)
    update_sidecar(path, portable)
    return changed


def update_sidecar(path: Path, text: str) -> None:
    """The tracer's sidecar beside ``path`` records the dump's size (``mlir_bytes``): made the
    rewritten dump's (the sidecar written as the tracer writes it)."""
    import json

    from hlo_trace.atomic import atomic_write

    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        return
    document = json.loads(sidecar.read_text())
    if isinstance(document, dict) and document.get("mlir_bytes") not in (None, len(text.encode())):
        document["mlir_bytes"] = len(text.encode())
        atomic_write(sidecar, json.dumps(document, indent=2, sort_keys=True) + "\n", force=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="dumps (default: the bundled ones)")
    args = parser.parse_args(argv)
    from hlo_trace.errors import UsageError

    try:
        for path in args.files or bundled_dumps():
            changed = relocate(path)
            print(f"{path}: {changed} lines relocated" if changed else f"{path}: unchanged")
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
