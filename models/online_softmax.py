"""One step of the online softmax that ring attention folds its key/value blocks with (torch):
the running maximum, sum and output of the blocks seen so far, updated with one more block."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

State = tuple[Tensor, Tensor, Tensor]  # running maximum, running sum (..., q), output


def fold(state: State | None, scores: Tensor, values_of: Callable[[Tensor], Tensor],
         expand: Callable[[Tensor], Tensor]) -> State:
    """``state`` after one more block: ``scores`` (..., q, k) in float, ``values_of(probs)`` the
    block's unnormalised output, ``expand`` a (..., q) statistic broadcast to the output."""
    block_max = scores.amax(dim=-1)
    new_max = block_max if state is None else torch.maximum(state[0], block_max)
    probs = torch.exp(scores - new_max[..., None])
    block = values_of(probs)
    if state is None:
        return new_max, probs.sum(dim=-1), block
    correction = torch.exp(state[0] - new_max)
    return new_max, state[1] * correction + probs.sum(dim=-1), state[2] * expand(correction) + block
