"""Attention kernels that strategies install through the model's ``attention_fn`` hook.

Same arithmetic as ``models.opensora.stdit3.plain_attention`` (scores in float32, optional
additive mask, softmax, probabilities back to v's dtype), written with ``einsum`` so that the
(batch, heads) axes stay separate batch dimensions of one ``dot_general``.  ``q @ k^T`` on 4-D
tensors lowers through a reshape to (batch*heads, L, d); with heads split across devices and
batch not, that merged axis is not a tile, and GSPMD all-gathers q, k and v to undo the split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def einsum_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(q k^T * scale + mask) v on (*batch, heads, L, head_dim) (one or two batch axes),
    head-split friendly."""
    import torch

    batch = "bc"[:q.dim() - 3]
    keys = batch
    if k.dim() == 4 and k.shape[0] == 1 < q.shape[0]:  # one key set for every query batch
        k, v, keys = k[0], v[0], ""
    scores = torch.einsum(f"{batch}hqd,{keys}hkd->{batch}hqk", q * scale, k).float()
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1)
    probs = probs.to(v.dtype)  # on a line of its own, as in plain_attention and OpenSora: a kernel
    return torch.einsum(f"{batch}hqk,{keys}hkd->{batch}hqd", probs, v)
