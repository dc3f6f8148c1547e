"""Memory of a program whose attentions run as fused (flash) kernels: the memory model of
``hlo_analyzer.memory`` with every attention's score GEMMs and softmax held in on-chip tiles
(``hlo_analyzer.dataflow.attention_internals``), as flash-attention's tiling holds them: the
peak counts q, k, v and the output, never the (heads x S_Q x S_KV) scores that the written-out
program materializes (at 100k tokens, a terabyte).
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxlib.mlir import ir

from hlo_analyzer.dataflow import attention_internals, build_dataflow
from hlo_analyzer.memory import InputSignature, MemoryUsage, measure_memory


def flash_memory(module: ir.Module, inputs: Sequence[InputSignature] | None = None, *,
                 capacity_bytes: float | None = None) -> MemoryUsage:
    """The memory of ``module`` with its attentions fused (module docstring)."""
    return measure_memory(module, inputs, capacity_bytes=capacity_bytes,
                          held_in_tiles=attention_internals(build_dataflow(module)))
