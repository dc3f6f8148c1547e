"""The bundled example dumps, reachable from any directory once the project is installed.

    from hlo_trace.examples import example_dump, example_dumps

    example_dump()                                   # the Megatron MLP on a 2x2 mesh, StableHLO
    example_dump("example_mlp_megatron_2x2.hlo.txt")  # the same program as XLA's HLO text

The files are package data of this package (``hlo_trace/examples/``), found through
``importlib.resources`` in an editable and in a regular install. No top-level ``dumps`` package
is installed, so a ``dumps/`` folder in the user's directory (where ``trace-stage`` writes) cannot
shadow them. The tiny STDiT3 stage dumps the tests read stay in the repository's ``dumps/``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hlo_trace.errors import InputFileError

#: The dump the README's quick start analyzes: a Megatron-sharded MLP with a patch-embedding
#: convolution, partitioned by torch-xla for a 2x2 virtual CPU mesh.
DEFAULT_EXAMPLE = "example_mlp_megatron_2x2.stablehlo.mlir"

#: What counts as a dump among the package's files.
_DUMP_SUFFIXES = (".mlir", ".hlo.txt")


def examples_root() -> Path:
    """The installed ``hlo_trace/examples/`` folder."""
    return Path(str(resources.files(__name__)))


def example_dump(name: str = DEFAULT_EXAMPLE) -> Path:
    """Path of one bundled dump, ``name`` relative to the examples folder (see
    :func:`example_dumps`)."""
    path = examples_root() / name
    if not path.is_file() or not name.endswith(_DUMP_SUFFIXES):
        raise InputFileError(f"{name}: no such bundled dump; known: {', '.join(example_dumps())}")
    return path


def example_dumps() -> list[str]:
    """Names of every bundled dump (MLIR and HLO text), relative to the examples folder, sorted."""
    root = examples_root()
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")
                  if path.is_file() and path.name.endswith(_DUMP_SUFFIXES))
