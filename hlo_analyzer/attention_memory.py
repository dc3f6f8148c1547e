"""Memory of a program whose attentions run as fused (flash) kernels: the memory model of
``hlo_analyzer.memory`` with every attention's score GEMMs and softmax held in on-chip tiles
(``hlo_analyzer.dataflow.attention_internals``), as flash-attention's tiling holds them: the
peak counts q, k, v and the output, never the (heads x S_Q x S_KV) scores that the written-out
program materializes (at 100k tokens, a terabyte). ``analyze-hlo --attention-memory fused`` reports it.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
from jaxlib.mlir import ir

from hlo_analyzer.dataflow import attention_internals, build_dataflow
from hlo_analyzer.memory import InputSignature, MemoryUsage, measure_memory


def flash_memory(module: ir.Module, inputs: Sequence[InputSignature] | None = None, *,
                 capacity_bytes: float | None = None, graph: nx.DiGraph | None = None) -> MemoryUsage:
    """The memory of ``module`` with its attentions fused (module docstring); ``graph``: its
    dataflow graph where one was built (``analyze-hlo --hw``), else it is built here."""
    held = attention_internals(graph if graph is not None else build_dataflow(module))
    return measure_memory(module, inputs, capacity_bytes=capacity_bytes, held_in_tiles=held)
