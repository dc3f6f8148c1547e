"""PyTorch's strides in an eager run: the tensors a model leaves non-contiguous, and their cost.

A traced program has no strides (XLA picks every layout), but an eager PyTorch run keeps the
strides of each view: a ``transpose`` or ``permute`` makes a non-contiguous view, and an
element-wise kernel (TensorIterator) writes its output in the layout of its first full-size
input, so a non-contiguous tensor stays so through casts and arithmetic. A library call that
needs contiguous rows copies such a tensor first: LayerNorm, the activation of a linear layer,
the operands of a batched matmul (``torch.matmul`` folds the batch axes into one, a copy when they
are permuted). Every other kernel (a GEMM, a library call, a reduction, a concatenation) writes a
contiguous result, except a cuDNN convolution and a nearest upsampling, which keep a channels-last
input's memory format (e.g. diffusers' attention block returns its result as
``out.transpose(-1, -2).reshape(B, C, H, W)``, channels-last, and adds the residual to it: the
VAE decoder's residual stream is channels-last from there on). Two kinds of non-contiguous tensor cost differently:

- :data:`TRANSPOSED`: its last axis moved, e.g. the official STDiT3's patch embedding
  ``x.flatten(2).transpose(1, 2)``, channel-major tokens that its residual stream keeps through
  every block. Its copy reads across rows (kernel class ``transpose_copy``), and an element-wise
  kernel that mixes it with contiguous full-size inputs runs strided (class ``strided``).
- :data:`PERMUTED`: other axes moved, rows intact, e.g. the heads split off q, k and v. Its copy
  is a permuted copy (class ``copy``); kernels that read it run as usual.

A transpose that swaps the last two axes alone and feeds GEMMs alone is how a matmul operand is
transposed (``k^T``): cuBLAS reads it as it is, so it makes nothing non-contiguous. Nor does a
transpose that GSPMD puts after a collective to lay out its result (an all-to-all's received
pieces moved next to the axis they concatenate on, an all-reduced einsum result put in the
einsum's axis order), unless the model's own permute made it: a collective writes a
contiguous buffer (the official all-to-all returns ``torch.cat(...).contiguous()``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from hlo_analyzer.dataflow import BUFFER_RESULT_OPS, FREE_MOVEMENT_OPS, Marker, operand_markers
from hlo_analyzer.tensors import SAME_SHAPE_OPS

__all__ = ["COPY_CLASS", "PERMUTED", "TRANSPOSED", "layouts", "mixes_transposed", "noncontiguous_behind",
           "transpose_kind"]

TRANSPOSED, PERMUTED = "transposed", "permuted"
#: The kernel class of the copy that makes a tensor of each kind contiguous.
COPY_CLASS = {TRANSPOSED: "transpose_copy", PERMUTED: "copy"}
#: Collectives: each writes a contiguous result.
COLLECTIVE_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                            "collective_broadcast"})
#: torch-xla's name of the torch call that permutes a tensor's axes (``transpose`` and
#: ``permute`` alike).
_PERMUTE_CALL = "aten__permute"
#: Element-wise ops whose output follows the layout of their first full-size input.
_TENSOR_ITERATOR_OPS = SAME_SHAPE_OPS | {"stablehlo.select", "mhlo.select", "stablehlo.clamp", "mhlo.clamp"}


def transpose_kind(permutation: tuple[int, ...], feeds_gemms: bool) -> str | None:
    """The layout a transpose of a contiguous tensor leaves (None: none, the identity, or a swap
    of the last two axes of an operand that GEMMs alone read, which cuBLAS reads as it is)."""
    rank = len(permutation)
    if permutation == tuple(range(rank)):
        return None
    if feeds_gemms and rank >= 2 and permutation == (*range(rank - 2), rank - 1, rank - 2):
        return None
    return TRANSPOSED if permutation[-1] != rank - 1 else PERMUTED


def layouts(attributes_of: dict[int, dict[str, Any]], order: Iterable[int], writes_contiguous: Callable[[int], bool],
            real: dict[int, int], feeds_gemms: Callable[[int], bool],
            seeds: dict[Marker, str] | None = None,
            keeps_channels_last: Callable[[int], Marker | None] = lambda node: None) -> dict[Marker, str]:
    """The non-contiguous values: each node of ``order`` (program order) or argument
    (``("argument", i)``) -> :data:`TRANSPOSED` or :data:`PERMUTED`. ``writes_contiguous(node)``:
    the node belongs to a kernel that writes a contiguous result (a GEMM, a library call, a
    fused attention). ``real``: each node's real elements (``mapping.works.real_elements``: a
    broadcast at its operand's size). ``feeds_gemms(node)``: GEMMs alone read the node's result
    (through views). ``seeds``: values known to be non-contiguous (a stage's residual input).
    ``keeps_channels_last(node)``: the value whose memory format the node's kernel keeps (a
    cuDNN convolution, a nearest upsampling: a channels-last input gives a channels-last
    result, :data:`TRANSPOSED` here), or None."""
    layout: dict[Marker, str] = dict(seeds or {})
    for node in order:
        if node in layout:
            continue
        source = keeps_channels_last(node)
        if source is not None:
            if noncontiguous_behind(attributes_of, source, layout) == TRANSPOSED:
                layout[node] = TRANSPOSED
            continue
        if writes_contiguous(node):
            continue
        attributes = attributes_of[node]
        operands = operand_markers(attributes)
        name = attributes["name"]
        if name in BUFFER_RESULT_OPS:  # each result is its operand's tensor, strides kept
            layout.update({("argument", buffer): layout[operand] for buffer, operand
                           in zip(attributes["buffers"], operands) if operand in layout})
        elif name == "transpose":
            inherited = layout.get(operands[0]) if operands else None
            if inherited is None and operands and _lays_out_collective(attributes_of, attributes, operands[0]):
                continue
            kind = inherited or transpose_kind(tuple(attributes.get("permutation", ())), feeds_gemms(node))
            if kind is not None:
                layout[node] = kind
        elif name in FREE_MOVEMENT_OPS:
            if operands and operands[0] in layout:
                layout[node] = layout[operands[0]]
        elif attributes["op"] in _TENSOR_ITERATOR_OPS:
            size = math.prod(attributes["result_shapes"][0])
            first = next((marker for marker, shape in zip(operands, attributes["operand_shapes"])
                          if math.prod(shape) == size and (not isinstance(marker, int) or real.get(marker, size) == size)),
                         None)
            if first in layout:
                layout[node] = layout[first]
    return layout


def _lays_out_collective(attributes_of: dict[int, dict[str, Any]], attributes: dict[str, Any],
                        operand: Marker | None) -> bool:
    """True when a transpose (``attributes``) of ``operand`` is GSPMD's layout of a collective's
    result: it reads the collective through views, and no permute of the model made it."""
    call = attributes.get("location", "").partition(" @ ")[0].split("/", 1)[0].split(".", 1)[0]
    if call == _PERMUTE_CALL:
        return False
    while isinstance(operand, int):
        producer = attributes_of[operand]
        if producer["name"] in COLLECTIVE_OPS:
            return True
        if producer["name"] not in FREE_MOVEMENT_OPS or not producer["operands"]:
            return False
        operand = operand_markers(producer)[0]
    return False


def noncontiguous_behind(attributes_of: dict[int, dict[str, Any]], marker: Marker | None,
                         layout: dict[Marker, str]) -> str | None:
    """The layout of the value ``marker`` (a node or ``("argument", i)``) holds, looking back
    through views (those inside a library call too, which ``layouts`` does not visit): None
    when it is contiguous."""
    while marker is not None:
        if marker in layout:
            return layout[marker]
        if not isinstance(marker, int):
            return None
        attributes = attributes_of[marker]
        if attributes["name"] not in FREE_MOVEMENT_OPS or not attributes["operands"]:
            return None
        marker = operand_markers(attributes)[0]
    return None


def mixes_transposed(attributes_of: dict[int, dict[str, Any]], entering: Iterable[tuple[Marker, tuple[int, ...]]],
                     result_elements: int, layout: dict[Marker, str]) -> bool:
    """True when a kernel's full-size inputs (``entering``: value and read shape) mix a
    :data:`TRANSPOSED` tensor with a contiguous one: TensorIterator then walks one of them across
    its rows (the ``strided`` class)."""
    kinds = {noncontiguous_behind(attributes_of, producer, layout) == TRANSPOSED
             for producer, shape in entering if math.prod(shape) == result_elements}
    return kinds == {True, False}
