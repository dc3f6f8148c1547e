"""The bundled example dumps, reachable from any directory once the project is installed.

    from hlo_trace.examples import example_dump, example_dumps

    example_dump()                       # the Megatron MLP on a 2x2 mesh, StableHLO
    example_dump("stablehlo/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir")

The files live in the repository's ``dumps/`` folder, which is installed as the package ``dumps``
(package data), so ``importlib.resources`` finds them in an editable and in a regular install.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hlo_trace.errors import InputFileError

#: The dump the README's quick start analyzes: a Megatron-sharded MLP with a patch-embedding
#: convolution, partitioned by torch-xla for a 2x2 virtual CPU mesh.
DEFAULT_EXAMPLE = "example_mlp_megatron_2x2.stablehlo.mlir"


def examples_root() -> Path:
    """The installed ``dumps/`` folder."""
    return Path(str(resources.files("dumps")))


def example_dump(name: str = DEFAULT_EXAMPLE) -> Path:
    """Path of one bundled dump, ``name`` relative to ``dumps/`` (see :func:`example_dumps`)."""
    path = examples_root() / name
    if not path.is_file():
        raise InputFileError(f"{name}: no such bundled dump; known: {', '.join(example_dumps())}")
    return path


def example_dumps() -> list[str]:
    """Names of every bundled MLIR dump, relative to ``dumps/``, sorted."""
    root = examples_root()
    return sorted(str(path.relative_to(root)) for path in root.rglob("*.mlir"))
