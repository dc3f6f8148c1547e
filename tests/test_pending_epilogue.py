"""A GEMM's epilogue that the sizes decide (``--exec fused``, ``hlo_analyzer.mapping.fusion``):
left pending in a kernel document, decided where the document is read back at the sizes it
holds then, so two programs of one model at two sizes give documents that line up and, rescaled
to a third size, the kernels a mapping at that size finds.

The program: ``(x @ w)`` of ``(64 T, 128) x (128, 256)``, its rows as T frames of 64, times a
table of ``T x 256`` (one row per frame: as RoPE's tables over the frames). The product reads
the GEMM's whole output and writes its shape, so it is the GEMM's epilogue when its side input,
``256 T`` elements, fits in ``EPILOGUE_SIDE_INPUT_ROWS`` = 8 rows of N = 256: up to T = 8."""

from __future__ import annotations

from fractions import Fraction

import pytest
from jax_child import run_jax

from hardware import load_system
from hlo_analyzer.mapping.analysis import AnalysisOptions, analyze_dump
from hlo_analyzer.mapping.fusion import EPILOGUE_SIDE_INPUT_ROWS
from hlo_analyzer.mapping.kernel_list import sources_document, sources_from_document
from hlo_analyzer.mapping.program import map_kernels
from hlo_analyzer.mapping.results import MappingOptions
from planning.plan_estimate import _Rescaler

FRAMES = (4, 8, 12, 16)
ROWS, K, N = 64, 128, 256
GEMM, PRODUCT = "stablehlo.dot_general", "fusion(multiply)"

PROGRAMS = f"""
F16 = jnp.float16
def framed(x, w, table):
    y = (x @ w).reshape(table.shape[0], {ROWS}, {N})
    return (y * table[:, None, :]).reshape(-1, {N})
out = {{}}
for t in {FRAMES!r}:
    args = (jax.ShapeDtypeStruct((t * {ROWS}, {K}), F16), jax.ShapeDtypeStruct(({K}, {N}), F16),
            jax.ShapeDtypeStruct((t, {N}), F16))
    out[t] = jax.jit(framed).lower(*args).as_text()
emit(out)
"""


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[int, str]:
    folder = tmp_path_factory.mktemp("epilogue")
    paths = {}
    for frames, text in run_jax(PROGRAMS).items():
        path = folder / f"framed_T{frames}.mlir"
        path.write_text(text)
        paths[int(frames)] = str(path)
    return paths


def document(path: str, *, defer: bool) -> dict:
    analysis = analyze_dump(path, "tx8", AnalysisOptions(steps=1, execution="fused", defer_epilogues=defer))
    return sources_document(analysis.mapping.program.sources, "fused")


def cost(doc: dict) -> tuple[list[str], float]:
    kernels, execution = sources_from_document(doc)
    system = load_system("tx8")
    return sorted(k.name for k in kernels), map_kernels(kernels, system.chip, system,
                                                        MappingOptions(execution=execution)).latency_s


def test_the_analyzer_fuses_the_product_up_to_eight_frames(dumps):
    assert EPILOGUE_SIDE_INPUT_ROWS == 8
    assert cost(document(dumps[4], defer=False))[0] == [f"{GEMM}+{PRODUCT}"]
    assert cost(document(dumps[8], defer=False))[0] == [f"{GEMM}+{PRODUCT}"]   # 2048 = 8 x 256
    assert cost(document(dumps[12], defer=False))[0] == sorted([GEMM, PRODUCT])


def test_a_deferred_document_holds_the_decision_and_decides_it_at_its_sizes(dumps):
    for frames in (4, 12):
        doc = document(dumps[frames], defer=True)
        [[name, _, _, epilogue, _, _, pending]] = doc["kernels"]  # one kernel whichever way
        assert (name, epilogue) == (GEMM, None)
        assert pending[0] == PRODUCT and pending[2:] == [frames * ROWS * N, [frames * N]]
        # read back at its own sizes: what the analyzer makes of the program
        assert cost(doc) == cost(document(dumps[frames], defer=False))


@pytest.mark.parametrize("frames", [8, 16])
def test_documents_at_two_sizes_rescale_to_the_kernels_of_a_third(dumps, frames):
    """T0 = 4 and 3 T0 = 12 (the first fused, the second not): rescaled to T = 8 the product
    is the epilogue (8 x 256 elements, the limit), at T = 16 a kernel of its own."""
    base, scaled = document(dumps[4], defer=True), document(dumps[12], defer=True)
    rescaler = _Rescaler(Fraction(frames, 4), Fraction(1))
    (names, seconds), (direct_names, direct_seconds) = cost(rescaler(base, scaled)), \
        cost(document(dumps[frames], defer=False))
    assert names == direct_names == ([f"{GEMM}+{PRODUCT}"] if frames == 8 else sorted([GEMM, PRODUCT]))
    assert seconds == pytest.approx(direct_seconds, rel=1e-12)
    assert rescaler.inexact == 0
