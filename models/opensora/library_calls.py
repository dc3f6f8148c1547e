"""Library calls: which tensor ops of the model PyTorch runs as one kernel when run eagerly.

The model is written with plain tensor ops so that a trace sees every operation (a LayerNorm is
mean, variance and rsqrt; a linear layer an einsum and a bias add). The official OpenSora code
runs some of those groups as one library kernel: ``nn.LayerNorm`` (or apex's fused LayerNorm;
``nn.GroupNorm`` in its VAE),
``nn.Linear`` (a cuBLASLt GEMM with the bias added in its epilogue), ``flash_attn_func`` or
xformers' memory-efficient attention (the model marks the function that reads such an
attention's result: whatever kernel a strategy swaps in, that attention is the fused one), and
the copy that ``reshape`` makes of a permuted tensor. One kind is no kernel but a fact about
layouts: ``transposed_tokens`` marks the view that leaves the tokens channel-major (the patch
embedding's ``x.flatten(2).transpose(1, 2)``), a layout PyTorch keeps along the residual stream
(``hlo_analyzer.mapping.torch_layouts``), in every stage of the model.

A function of the model that is one such call says so with a decorator::

    @library_call("layer_norm")
    def forward(self, x): ...

The decorator only records the function; the function runs unchanged. torch-xla writes the
source line of every op into the dump (``XLA_HLO_DEBUG=1``); the tracer writes the lines of each
recorded function into the sidecar (:func:`call_regions`), and ``analyze-hlo --exec torch``
charges the ops made on those lines as the one kernel (``hlo_analyzer.mapping.library_calls``).
:data:`CALL_KINDS` is the list both sides share.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["CALL_KINDS", "CallRegion", "call_regions", "library_call", "self_attention_is_flash"]

#: The library kernels a model may mark, each one kernel in eager PyTorch, and the view that
#: leaves its residual stream channel-major.
CALL_KINDS = ("layer_norm", "group_norm", "linear", "flash_attention", "copy", "transposed_tokens")

F = TypeVar("F", bound=Callable)


def self_attention_is_flash(length: int, batch: int) -> bool:
    """Whether OpenSora's self-attention calls its fused kernel on a (batch, length) sequence
    batch: only when the sequence is longer than the batch (its ``Attention.forward``: "flash attn
    is not memory efficient for small sequences"); otherwise the plain product, a float32 softmax
    and a copy. The one home of the rule: the model applies it, and the plan search's estimate
    (``planning.plan_estimate``) applies it at a plan's shape to trace its calibrations with the
    kernel the plan's trace will have."""
    return length > batch

_recorded: list[tuple[str, Callable]] = []


@dataclass(frozen=True)
class CallRegion:
    """The source lines (inclusive) of one function that is one library call of ``kind``."""

    kind: str
    file: str          # base name, as the dump's locations give it
    first_line: int
    last_line: int

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "file": self.file, "first_line": self.first_line,
                "last_line": self.last_line}


def library_call(kind: str) -> Callable[[F], F]:
    """Record the decorated function as one call of the library kernel ``kind``."""
    if kind not in CALL_KINDS:
        raise ValueError(f"library call {kind!r}: expected one of {', '.join(CALL_KINDS)}")

    def record(function: F) -> F:
        _recorded.append((kind, function))
        return function

    return record


def call_regions() -> tuple[CallRegion, ...]:
    """The source lines of every recorded function, for the sidecar."""
    regions = []
    for kind, function in _recorded:
        lines, first = inspect.getsourcelines(function)
        regions.append(CallRegion(kind, os.path.basename(inspect.getsourcefile(function) or ""),
                                  first, first + len(lines) - 1))
    return tuple(regions)
