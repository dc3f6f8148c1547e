"""The order of the video tokens of one sample in the hidden state x (B, N = T*S, h).

* ``frame_major`` (the default, OpenSora's own order): token ``t*S + s``, all S spatial tokens
  of frame 0, then frame 1, ...  The spatial attention's (B*T, S, h) is a plain reshape; the
  temporal one needs a transpose.
* ``space_major``: token ``s*T + t``, the T frames of spatial position 0, then position 1, ...
  The temporal attention's (B*S, T, h) is a plain reshape; the spatial one needs a transpose.

Why a second order: a Linear flattens (B, N, h) to (B*N, h), so a device can hold only a
contiguous range of the token axis.  Split over devices, that range is a range of frames in
frame-major order and a range of spatial positions in space-major order; a sequence-parallel
strategy picks the order whose major factor its devices divide (see
``tracing/strategies/ds_ulysses.py``).  Per-token work (norms, Linears, MLP, the flattened
cross-attention) does not care about the order, so a forward pass gives the same result in both.

This module does not import torch; its functions take and return torch tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["FRAME_MAJOR", "SPACE_MAJOR", "TOKEN_ORDERS", "TokenOrder", "check_token_order",
           "major_axis_is_temporal", "reorder_tokens", "token_axes"]

TokenOrder = Literal["frame_major", "space_major"]
FRAME_MAJOR: TokenOrder = "frame_major"
SPACE_MAJOR: TokenOrder = "space_major"
TOKEN_ORDERS: tuple[TokenOrder, ...] = (FRAME_MAJOR, SPACE_MAJOR)


def check_token_order(order: str) -> TokenOrder:
    """``order`` if it is a known token order; ValueError otherwise."""
    if order not in TOKEN_ORDERS:
        raise ValueError(f"unknown token order {order!r}: expected one of {', '.join(TOKEN_ORDERS)}")
    return order  # type: ignore[return-value]


def token_axes(order: str, T: int, S: int) -> tuple[int, int]:
    """(major, minor) factor of the token axis: (T, S) frame-major, (S, T) space-major."""
    return (T, S) if check_token_order(order) == FRAME_MAJOR else (S, T)


def major_axis_is_temporal(order: str) -> bool:
    """Whether T is the major factor of the token axis (frame-major).  The attention over the
    major factor is the one that needs a transpose of x, and the one whose sequence is split
    when the token axis is split contiguously over devices."""
    return check_token_order(order) == FRAME_MAJOR


def reorder_tokens(x: Tensor, source: str, target: str, T: int, S: int) -> Tensor:
    """x (B, T*S, ...) with tokens in ``source`` order -> the same tokens in ``target`` order.

    Returns ``x`` itself (no op in the graph) when the orders agree, so the default
    frame-major model traces exactly the graph it traced before token orders existed.
    """
    if check_token_order(source) == check_token_order(target):
        return x
    major, minor = token_axes(source, T, S)
    batch, tokens, *rest = x.shape
    # (B, major, minor, ...) -> (B, minor, major, ...): the other factor becomes major.
    return x.reshape(batch, major, minor, *rest).transpose(1, 2).reshape(batch, tokens, *rest)
