"""Layers the three video DiTs share, written with plain tensor ops (torch only).

* ``Mark``: an identity module, a named point in the graph where a sharding plan may mark a
  tensor or re-lay it out (``[[activations]]`` rules of ``trace-module`` match module names).
* ``Linear``: ``nn.Linear`` computed as ``einsum("abi,oi->abo")`` on 3-D inputs, so that a
  sequence split of (batch, tokens, features) stays a tile (``nn.Linear`` flattens batch and
  tokens into one dimension; docs/tracing.md).
* attention on (batch, tokens, heads, head_dim), ``softmax(q k^T / sqrt(d)) v`` written out, and
  the 3-D rotary embedding of video tokens over (frames, height, width).

The official code runs some of these as one library kernel each, and says so to the analysis
(``models.opensora.library_calls``; ``analyze-hlo --exec torch`` charges one kernel per call):
``Linear`` (a GEMM with its bias in the epilogue), ``layer_norm`` (``nn.LayerNorm``) and
``attend`` (flash-attn, or PyTorch's SDPA in CogVideoX). RMSNorm, RoPE and modulation are
written out in the official code too: eager kernels, one per tensor op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.opensora.library_calls import library_call


class Mark(nn.Identity):
    """A named point where a plan may mark the tensor passing through (identity otherwise)."""


class Linear(nn.Linear):
    """``nn.Linear`` that keeps (batch, tokens) apart on 3-D inputs."""

    @library_call("linear")
    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3:
            return super().forward(x)
        out = torch.einsum("abi,oi->abo", x, self.weight)
        return out if self.bias is None else out + self.bias


@library_call("layer_norm")
def layer_norm(x: Tensor, eps: float, weight: Tensor | None = None,
               bias: Tensor | None = None) -> Tensor:
    """LayerNorm over the last dimension, written out (rsqrt); one kernel in the official code
    (``nn.LayerNorm``), its affine parameters applied in it."""
    centred = x - x.mean(-1, keepdim=True)
    out = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight + bias


class LayerNorm(nn.Module):
    """LayerNorm, affine or not, written out."""

    def __init__(self, dim: int, eps: float, *, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.eps, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """x (B, L, h) scaled and shifted per sample by (B, h) vectors."""
    return x * (1 + scale[:, None]) + shift[:, None]


def sinusoidal(t: Tensor, dim: int, *, max_period: float = 10000.0) -> Tensor:
    """The sinusoidal timestep embedding (B,) -> (B, dim): cosines then sines."""
    half = dim // 2
    inverse = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device,
                                                             dtype=torch.float32) / half)
    angles = t.float()[:, None] * inverse[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class Mlp(nn.Module):
    """fc1 -> activation -> fc2 (the names tensor parallelism reads)."""

    def __init__(self, dim: int, hidden: int, out: int | None = None, *,
                 activation: str = "gelu_tanh") -> None:
        super().__init__()
        self.activation = activation
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim if out is None else out)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(activate(self.fc1(x), self.activation))


def activate(x: Tensor, activation: str) -> Tensor:
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if activation == "silu":
        return F.silu(x)
    raise ValueError(f"activation {activation!r}: expected gelu_tanh or silu")


def rope_3d(x: Tensor, grid: tuple[int, int, int], dims: tuple[int, int, int],
            theta: float) -> Tensor:
    """Rotary embedding of video tokens in (frame, row, column) order: x (B, L, heads, D) with
    L = prod(grid); the head dimension is cut into ``dims`` (frame, row, column) parts, each
    rotated in pairs by its coordinate's angles; tokens beyond the grid are not rotated."""
    angles = []
    for axis, (size, dim) in enumerate(zip(grid, dims)):
        inverse = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device,
                                               dtype=torch.float32) / dim)
        position = torch.arange(size, device=x.device, dtype=torch.float32)
        shape = [1, 1, 1, dim // 2]
        shape[axis] = size
        angle = (position[:, None] * inverse[None]).view(shape)
        angles.append(angle.expand(*grid, dim // 2))
    angle = torch.cat(angles, dim=-1).reshape(math.prod(grid), 1, sum(dims) // 2)
    angle = F.pad(angle, (0, 0, 0, 0, 0, x.shape[1] - math.prod(grid)))  # padding: angle 0
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


@library_call("flash_attention")
def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v on (B, L, heads, D): one fused kernel in the official code
    (flash-attn in HunyuanVideo and Wan, PyTorch's SDPA in CogVideoX). ``einsum``'s ops carry
    the frame of torch's Python wrapper; the transpose of the output carries this function's
    line, where the analysis finds the fused kernel (the result of the attention reaches it)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    probs = scores.float().softmax(dim=-1).to(v.dtype)
    return torch.einsum("bhqk,bkhd->bhqd", probs, v).transpose(1, 2)


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d)) v on (B, L, heads, D) tensors, with mark points on q, k, v (as
    they enter) and on the output (as it leaves): where Ulysses turns a sequence split into a
    head split and back.

    With ``ring`` > 1 the attention runs as ring attention does, in global form: the sequence
    cut into ``ring`` blocks (a ring axis that a plan splits over devices), each query block
    meeting the key/value blocks one after another as they rotate around the ring (a shift of
    the split ring axis: a collective-permute), each step one fused attention (``attend_block``:
    output and log-sum-exp, as xDiT's ring attention calls flash-attn per block), the steps merged
    by their log-sum-exp in element-wise ops; the running log-sum-exp and output pass the mark
    points ``ring_lse`` and ``ring_out``, the rotated blocks ``ring_kv`` (a plan pins them to the
    ring split)."""

    def __init__(self, ring: int = 1) -> None:
        super().__init__()
        self.ring = ring
        self.q_in, self.k_in, self.v_in, self.out = Mark(), Mark(), Mark(), Mark()
        if ring > 1:
            self.ring_lse, self.ring_out, self.ring_kv = Mark(), Mark(), Mark()
        #: PipeFusion (``StaleKV``): set by the model for one call, None otherwise
        self.stale: StaleKV | None = None

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = self.q_in(q), self.k_in(k), self.v_in(v)
        if self.stale is not None:
            k, v = self.stale.keys(k, v)
        return self.out(self._ring(q, k, v) if self.ring > 1 else attend(q, k, v))

    def _ring(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (x.unflatten(1, (self.ring, -1)) for x in (q, k, v))  # (B, R, C, H, D)
        out = lse = None
        for step in range(self.ring):
            if step:  # one ring position on (``torch.roll`` lowers to all-to-alls and gathers)
                k, v = (self.ring_kv(torch.cat([x[:, 1:], x[:, :1]], dim=1)) for x in (k, v))
            block_out, block_lse = attend_block(q, k, v)
            if step:  # merge by log-sum-exp: the element-wise ops ring-flash-attn runs per step
                weight = torch.sigmoid(block_lse - lse).transpose(2, 3)[..., None]
                block_out = out - weight * (out - block_out)
                block_lse = lse - F.logsigmoid(lse - block_lse)
            out, lse = self.ring_out(block_out), self.ring_lse(block_lse)
        return out.to(v.dtype).flatten(1, 2)


@library_call("flash_attention")
def attend_block(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """One ring step's attention on (B, R, C, heads, D) blocks: one fused kernel in the official
    code (xDiT's ring attention calls flash-attn per K/V block), which returns the block's
    normalised output (float) and its log-sum-exp (B, R, heads, C)."""
    scores = torch.einsum("brqhd,brkhd->brhqk", q, k).float() * (1.0 / math.sqrt(q.shape[-1]))
    maximum = scores.amax(dim=-1)
    probs = torch.exp(scores - maximum[..., None])
    total = probs.sum(dim=-1)
    out = torch.einsum("brhqk,brkhd->brqhd", probs.to(v.dtype), v).float()
    return out / total.transpose(2, 3)[..., None], maximum + total.log()


class StaleKV:
    """PipeFusion's K/V buffer of one attention: (B, S, heads, D), the keys (values) of all S
    video tokens from the previous diffusion step, kept patch-major. A patch's call writes its fresh K/V over its
    own ``own`` tokens' slot and attends over the result: the fresh (patch, and text where the
    attention is joint) then the stale rest. The traced patch is the first (slot at offset 0:
    every patch has the same shapes); keys' order does not change attention."""

    def __init__(self, k: Tensor, v: Tensor, own: int) -> None:
        self.k, self.v, self.own = k, v, own

    def keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return (torch.cat([k, self.k[:, self.own:]], dim=1),
                torch.cat([v, self.v[:, self.own:]], dim=1))


def install_stale(cores: list[AttentionCore], stale_k: Tensor | None, stale_v: Tensor | None,
                  own: int) -> None:
    """Give each of ``cores`` its layer's K/V buffer, ``stale_k[i]`` and ``stale_v[i]`` of the
    (attentions, B, S, heads, D) inputs, for this call (none: no PipeFusion, no buffers)."""
    if stale_k is None or stale_v is None:
        for core in cores:
            core.stale = None
        return
    if stale_k.shape[0] != len(cores) or stale_v.shape != stale_k.shape:
        raise ValueError(f"stale_k {list(stale_k.shape)} and stale_v {list(stale_v.shape)}: "
                         f"expected equal shapes with {len(cores)} attentions first")
    for core, k, v in zip(cores, stale_k.unbind(0), stale_v.unbind(0)):
        core.stale = StaleKV(k, v, own)


class StageShift(nn.Module):
    """PipeFusion's hand-off in the SPMD form of one pipeline tick: the batch holds ``stages``
    stages' patches (stage-major), and each stage's activation goes to the next one, the last
    stage's to the first (a cyclic shift of the split stage dimension: a collective-permute;
    the mark point ``sent`` pins it to the split)."""

    def __init__(self, stages: int) -> None:
        super().__init__()
        self.stages = stages
        self.sent = Mark()

    def forward(self, x: Tensor) -> Tensor:
        if self.stages == 1:
            return x
        y = x.unflatten(0, (self.stages, -1))
        return self.sent(torch.cat([y[-1:], y[:-1]], dim=0).flatten(0, 1))


def pad_tokens(x: Tensor, multiple: int) -> Tensor:
    """(B, L, ...) padded with zero tokens at the end to a multiple of ``multiple`` tokens (a
    sequence-parallel degree that does not divide L; the padded tokens are attended unmasked:
    at most ``multiple - 1`` more tokens of work)."""
    extra = -x.shape[1] % multiple
    return x if extra == 0 else torch.cat([x, x.new_zeros(x.shape[0], extra, *x.shape[2:])], dim=1)


def heads(x: Tensor, count: int) -> Tensor:
    """(B, L, count * D) -> (B, L, count, D)."""
    return x.unflatten(-1, (count, -1))


def fused_heads(x: Tensor, count: int, parts: int) -> list[Tensor]:
    """A fused projection's output laid out head-major, (heads, parts, D) per token, cut into
    ``parts`` tensors (B, L, heads, D): a contiguous split of its features gives each device
    whole heads of every part."""
    return list(x.unflatten(-1, (count, parts, -1)).unbind(dim=3))


def join(first: Tensor, second: Tensor, chunks: int) -> Tensor:
    """The joint sequence of two token sets (B, L, ...): ``first`` then ``second`` when
    ``chunks`` is 1; else in ``chunks`` runs of (a run of ``first``, a run of ``second``), the
    order in which xDiT's sequence-parallel ranks hold it (each rank joins its own slices).
    Attention does not depend on the order of the keys, so the model's output is the same."""
    if chunks == 1:
        return torch.cat([first, second], dim=1)
    parts = [x.unflatten(1, (chunks, -1)) for x in (first, second)]
    return torch.cat(parts, dim=2).flatten(1, 2)


def unjoin(x: Tensor, first: int, chunks: int) -> tuple[Tensor, Tensor]:
    """``join``'s inverse: the ``first`` tokens of the first set and the rest."""
    if chunks == 1:
        return x[:, :first], x[:, first:]
    runs = x.unflatten(1, (chunks, -1))
    return runs[:, :, :first // chunks].flatten(1, 2), runs[:, :, first // chunks:].flatten(1, 2)
