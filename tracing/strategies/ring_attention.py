"""Ring attention: sequence parallel like ds_ulysses (batch on x, sequence on y), but the
self-attention whose sequence is split keeps its split and passes K/V blocks around the ring of
the y devices instead of exchanging the split for heads.  Which attention that is follows the
token order chosen as in ds_ulysses (``SequenceParallel``); the other one runs locally.

GSPMD does not invent a ring (verified with torch_xla 2.9), so the kernel is written in global form:
the sequence axis L is reshaped to (ring, chunk) with the ring axis split; each step attends
every query chunk to the K/V chunk currently beside it (the ring axis is a batch axis of the
einsum: local), folds the block into an online softmax (running max, running sum, rescaled
accumulator, each pinned to the ring split), then rotates K and V by one ring position:
``cat(t[:, :, -1:], t[:, :, :-1])`` along the split ring axis, which GSPMD partitions into one
collective-permute.  (``torch.roll`` is the same shift, but torch-xla 2.9 lowers it in a form
that GSPMD partitions into all-to-alls and all-gathers, measured.)  ring-1 rotations of K and of
V: 2*(ring-1) collective-permutes per split attention.

Layout choices:
* cross-attention: the queries stay token-split; every device projects a 1/Y slice of the
  captions (``cross_cond`` split over y) and K and V are all-gathered over y (one each per
  block), so the masked scores against every caption are local;
* the caption projection still repeats over x (each batch group projects all captions): the
  one term above the model's GEMM count, 4*B*TOKEN*h^2*(X-1)/n per block (0.07% at full size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.strategies.base import Spec, register
from tracing.strategies.ds_ulysses import SequenceParallel

if TYPE_CHECKING:
    from torch import Tensor


def make_ring_attention(mesh, ring_axis: str, batch_axis, ring_size: int, heads_axis=None):
    """A kernel ``(q, k, v, mask, scale) -> out`` on (B', heads, L, hd), L split ring_size ways
    over ``ring_axis`` (heads optionally split over ``heads_axis``)."""
    import torch
    import torch_xla.distributed.spmd as xs

    from models.online_softmax import fold

    block_spec = (batch_axis, heads_axis, ring_axis, None, None)  # (B', heads, ring, chunk, hd)
    stat_spec = (batch_axis, heads_axis, ring_axis, None)  # (B', heads, ring, chunk)

    def pin(t: Tensor, spec) -> Tensor:
        xs.mark_sharding(t, mesh, spec)
        return t

    def ring_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
        if mask is not None:
            raise ValueError("ring attention here serves the unmasked self-attention only")
        batch, heads, length, head_dim = q.shape

        def blocks(t: Tensor) -> Tensor:  # K/V may be longer than q: PipeFusion's full stale K/V
            return pin(t.reshape(batch, heads, ring_size, t.shape[2] // ring_size, head_dim), block_spec)

        def rotate(t: Tensor) -> Tensor:
            return pin(torch.cat((t[:, :, -1:], t[:, :, :-1]), dim=2), block_spec)

        q_blocks, k_blocks, v_blocks = blocks(q * scale), blocks(k), blocks(v)
        state = None
        for step in range(ring_size):
            if step:  # hand K/V to the next ring position: a collective-permute each
                k_blocks, v_blocks = rotate(k_blocks), rotate(v_blocks)
            scores = torch.einsum("bhrqd,bhrkd->bhrqk", q_blocks, k_blocks).float()
            running_max, running_sum, accumulator = fold(
                state, scores,
                lambda probs: torch.einsum("bhrqk,bhrkd->bhrqd", probs.to(v_blocks.dtype),
                                           v_blocks).float(),
                lambda stat: stat[..., None])
            state = (pin(running_max, stat_spec), pin(running_sum, stat_spec),
                     pin(accumulator, block_spec))
        _, running_sum, accumulator = state
        out = (accumulator / running_sum[..., None]).to(v.dtype)
        return out.reshape(batch, heads, length, head_dim)

    return ring_attention


@register
class RingAttention(SequenceParallel):
    name = "ring_attention"
    summary = ("sequence parallel (batch on x, sequence on y); K/V passed around the y ring "
               "(collective-permute), online softmax; caption K/V projected in slices, all-gathered")

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name == "y" and len(shape) == 3:  # the embedded (1, B*TOKEN, h) between stages:
            return (None, "y", None)  # each device projects its slice of the captions
        return super().input_spec(name, shape)

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("q", "k", "v", "attn_kernel_out"):
            if self.sequence_split(temporal):
                return ("x", None, "y", None)
            return (self.tokens, None, None, None)
        if point in ("cross_q", "cross_kernel_out"):  # (1, heads, B*N, hd): token split
            return (None, None, self.tokens, None)
        if point == "cross_cond":  # (1, B*TOKEN, h): a slice of the captions per device
            return (None, "y", None)
        if point in ("cross_k", "cross_v"):  # all-gathered: every caption, every head
            return (None, None, None, None)
        return self.token_spec(point, shape, temporal)

    def attention_fn(self, mesh, temporal: bool):
        if not self.sequence_split(temporal):
            return None  # this attention's sequence is whole on each device
        return make_ring_attention(mesh, "y", "x", self.layout.mesh_shape[1])
