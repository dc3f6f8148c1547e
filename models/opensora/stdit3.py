"""OpenSora v1.2 STDiT3, re-implemented for tracing with torch-xla.

Everything is written with plain tensor ops so that a lazy trace sees every operation:

* attention is `softmax(q @ k^T * scale [+ mask]) @ v`, no fused kernels;
* LayerNorm and RMSNorm are written out with `torch.rsqrt` (nn.LayerNorm lowers to
  batch-norm-training, which hides the norm from the block segmenter and makes GSPMD insert an
  all-gather when the batch axis is sharded);
* no buffers: position embeddings, RoPE frequencies and the cross-attention mask are computed from
  `torch.arange` on the fly, so a model built on `meta` and materialised elsewhere has no stale state;
* shapes depend only on input shapes (no `.item()`, no branching on tensor values).

Forward pass, batch B, hidden h, TOKEN caption tokens per sample::

    embed:     z (B, C_in, T_lat, H_lat, W_lat) -> Conv3d patches + 2-D sin/cos position -> x (B, N, h)
               t, fps -> sinusoidal -> MLPs -> t_emb (B, h) -> t_block -> t_mlp (B, 6h)
               y (B, 1, TOKEN, C_cap) -> caption MLP -> (1, B*TOKEN, h)
    blocks:    for i in 0..depth-1: spatial_blocks[i], then temporal_blocks[i]
    finalize:  LayerNorm + modulate(t_emb) + Linear -> unpatchify -> (B, C_out, T_lat, H_lat, W_lat)

Token order: x holds the N = T*S tokens of a sample frame-major (token t*S + s, OpenSora's order,
the default) or space-major (token s*T + t); see `models.opensora.token_order`.  `embed` makes
frame-major tokens and reorders them when asked for space-major, `StageState.token_order` says
which order x is in between stages, each block reshapes or transposes x for its attention
accordingly, and `finalize` returns to frame-major in its unpatchify permute.  The result is the same
in both orders; a sequence-parallel strategy picks the one whose major factor its devices divide.

Sharding hook: `STDiT3Block`, `Attention`, `MultiHeadCrossAttention` and `Mlp` each carry an
`annotate` attribute, a callable `(point, tensor) -> tensor` that is the identity by default and is
called at the points of `ANNOTATION_POINTS` (their layouts are listed there). A parallel strategy
replaces it with one that calls `xs.mark_sharding`. `Attention.attention_fn` and
`MultiHeadCrossAttention.attention_fn` hold the attention kernel `(q, k, v, mask, scale) -> out` on
(batch, heads, L, head_dim) tensors; a strategy may swap in a ring form.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.opensora.config import STDiT3Config
from models.opensora.errors import StageRangeError
from models.opensora.library_calls import library_call, self_attention_is_flash
from models.opensora.token_order import (
    FRAME_MAJOR,
    TokenOrder,
    check_token_order,
    major_axis_is_temporal,
    reorder_tokens,
    token_axes,
)

__all__ = [
    "ANNOTATION_POINTS",
    "CROSS_ATTENTION_MASK_VALUE",
    "AnnotateFn",
    "Attention",
    "AttentionFn",
    "BlockLinear",
    "FUSED_LAYOUTS",
    "FUSED_PROJECTIONS",
    "CaptionEmbedder",
    "LayerNorm",
    "Mlp",
    "MultiHeadCrossAttention",
    "PatchEmbed3D",
    "RMSNorm",
    "RotaryEmbedding",
    "STDiT3",
    "STDiT3Block",
    "SizeEmbedder",
    "StageState",
    "T2IFinalLayer",
    "TimestepEmbedder",
    "block_diagonal_mask",
    "fused_rows_to_head_major",
    "no_annotation",
    "plain_attention",
]

AnnotateFn = Callable[[str, Tensor], Tensor]
AttentionFn = Callable[[Tensor, Tensor, Tensor, "Tensor | None", float], Tensor]

ANNOTATION_POINTS: dict[str, str] = {
    # STDiT3Block (B = batch, N = T*S tokens per sample, h = hidden)
    "x": "STDiT3Block: (B, N, h) at the block input and after each of its three residual adds "
         "(tokens in the state's token order)",
    "select_grad": "STDiT3Block: (B, N, h) the inputs and the result of the official path's per-frame "
                   "select (t_mask_select); a strategy pins only their gradients, as the residual stream",
    # Attention (self-attention). Spatial: B' = B*T, L = S. Temporal: B' = B*S, L = T.  With
    # the block's ``batch_apart`` set, the attention over the minor token factor keeps the batch
    # and the major factor apart: B' stands for the two axes (B, major) there.
    "attn_in": "Attention: (B', L, h) input, tokens already grouped for this block's attention",
    "qkv": "Attention: (B', L, 3h) fused qkv projection output, before the split into heads",
    "q": "Attention: (B', heads, L, head_dim) right before the attention kernel (after norm, RoPE)",
    "k": "Attention: (B', heads, L, head_dim) right before the attention kernel (after norm, RoPE)",
    "v": "Attention: (B', heads, L, head_dim) right before the attention kernel",
    "attn_out": "Attention: (B', L, h) kernel output with heads merged, before proj",
    "proj_out": "Attention: (B', L, h) after proj",
    # MultiHeadCrossAttention: all samples flattened into one sequence
    "cross_q_tokens": "MultiHeadCrossAttention: (B, N, heads, head_dim) q_linear output per "
                      "sample, before the samples are flattened into one sequence",
    "cross_q": "MultiHeadCrossAttention: (1, heads, B*N, head_dim); (B, heads, N, head_dim) with "
               "the block's batch_apart",
    "cross_k": "MultiHeadCrossAttention: (1, heads, B*TOKEN, head_dim)",
    "cross_v": "MultiHeadCrossAttention: (1, heads, B*TOKEN, head_dim)",
    "cross_out": "MultiHeadCrossAttention: (1, B*N, h) kernel output with heads merged, before "
                 "proj; (B, N, h) with the block's batch_apart",
    # Mlp
    "attn_kernel_out": "Attention: (B', heads, L, head_dim) attention kernel output",
    # MultiHeadCrossAttention inputs and outputs in the residual layout
    "cross_in": "MultiHeadCrossAttention: (B, N, h) video-token input, before q_linear",
    "cross_cond": "MultiHeadCrossAttention: (1, B*TOKEN, h) caption input, before kv_linear",
    "cross_kv": "MultiHeadCrossAttention: (1, B*TOKEN, 2h) fused caption K/V projection output",
    "cross_kernel_out": "MultiHeadCrossAttention: (1, heads, B*N, head_dim) kernel output; "
                        "(B, heads, N, head_dim) with the block's batch_apart",
    "cross_proj_out": "MultiHeadCrossAttention: (B, N, h) after proj",
    "mlp_in": "Mlp: (B, N, h) input, before fc1",
    "mlp_hidden": "Mlp: (B, N, mlp_ratio*h) after fc1 and GELU",
    "mlp_out": "Mlp: (B, N, h) after fc2",
    # STDiT3
    "final_in": "STDiT3.finalize: (B, N, h) input of the final layer (norm, modulation, linear)",
}

#: Row order of the fused qkv / kv projections.  OpenSora's weights order their rows
#: (parts, heads, head_dim) ("opensora"); "head_major" orders them (heads, parts, head_dim), so a
#: contiguous split of the rows hands every device whole heads of q, k and v.  A model with
#: head-major projections computes the same function once its weights are reordered with
#: `fused_rows_to_head_major`.
FUSED_LAYOUTS = ("opensora", "head_major")
#: The block parameters with fused rows and their number of parts.
FUSED_PROJECTIONS = {"attn.qkv": 3, "cross_attn.kv_linear": 2}

# Additive mask value for caption tokens of other samples. Finite (not -inf) so that a ring or
# blockwise kernel that sees a block with no valid key does not produce NaN; large enough that
# exp() underflows to exactly 0 in float32.
CROSS_ATTENTION_MASK_VALUE = -1.0e9


def no_annotation(point: str, tensor: Tensor) -> Tensor:
    """The default sharding hook: leaves the tensor as it is."""
    return tensor


def plain_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(q k^T * scale + mask) v on (batch, heads, L, head_dim) tensors.

    Scores and softmax run in float32 as OpenSora does (its non-flash path upcasts the scores),
    then the probabilities return to v's dtype for the value product.
    """
    scores = (q * scale) @ k.transpose(-2, -1)
    scores = scores.float()
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1)
    probs = probs.to(v.dtype)  # on a line of its own: a kernel of its own in PyTorch
    return probs @ v


@library_call("flash_attention")
def merge_heads_flash(out: Tensor, length: int, hidden: int) -> Tensor:
    """(*B', heads, L, head_dim) -> (*B', L, h) after an attention OpenSora runs as one fused kernel
    (flash-attn, or xformers' memory-efficient attention for the masked cross-attention), which
    writes (B', L, heads, head_dim) itself: a view. Its lines mark the attention that feeds them as
    that one kernel for ``--exec torch`` (``models.opensora.library_calls``)."""
    return out.transpose(-3, -2).reshape(*out.shape[:-3], length, hidden)


@library_call("copy")
def merge_heads_copy(out: Tensor, length: int, hidden: int) -> Tensor:
    """(*B', heads, L, head_dim) -> (*B', L, h): OpenSora's ``x.transpose(1, 2).reshape(B, N, C)``
    after its non-flash attention, a copy in PyTorch."""
    return out.transpose(-3, -2).reshape(*out.shape[:-3], length, hidden)


@library_call("copy")
def swap_token_axes_copy(x: Tensor, batch: int, major: int, minor: int,
                         merge_batch: bool = True) -> Tensor:
    """(B, major*minor, h) -> (B*minor, major, h), or back with the axes given swapped: an einops
    rearrange of the token axes, which PyTorch runs as a copy.  ``merge_batch=False`` gives
    (B, minor*major, h) instead (the same data; the batch stays an axis of its own)."""
    hidden = x.shape[-1]
    swapped = x.reshape(batch, major, minor, hidden).transpose(1, 2)
    if merge_batch:
        return swapped.reshape(batch * minor, major, hidden)
    return swapped.reshape(batch, minor * major, hidden)


def block_diagonal_mask(batch: int, queries_per_sample: int, keys_per_sample: int,
                        device: torch.device | None = None) -> Tensor:
    """Additive float32 mask (1, 1, batch*queries, batch*keys): 0 where query and key belong to
    the same sample, CROSS_ATTENTION_MASK_VALUE elsewhere. Built from iota comparisons so the graph
    holds no large constant and no data-dependent shape."""
    query_sample = torch.arange(batch * queries_per_sample, device=device) // queries_per_sample
    key_sample = torch.arange(batch * keys_per_sample, device=device) // keys_per_sample
    same = query_sample[:, None] == key_sample[None, :]
    zero = torch.zeros((), dtype=torch.float32, device=device)
    masked = torch.full((), CROSS_ATTENTION_MASK_VALUE, dtype=torch.float32, device=device)
    return torch.where(same, zero, masked)[None, None]


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN modulation of OpenSora (t2i_modulate): x * (1 + scale) + shift."""
    return x * (1 + scale) + shift


#: Diffusion timesteps of OpenSora v1.2's rectified-flow scheduler: its text-to-video loop builds
#: the temporal mask as ``mask * NUM_TIMESTEPS >= t`` with an all-ones mask (rflow/__init__.py).
NUM_TIMESTEPS = 1000


def temporal_mask(t: Tensor, frames: int) -> Tensor:
    """(B,) timesteps -> OpenSora's ``x_mask`` (B, frames) of plain text-to-video: every frame is
    noised (True). Computed from ``t`` as the scheduler does, so no compiler folds it away."""
    return (t[:, None] <= NUM_TIMESTEPS).expand(t.shape[0], frames)


def t_mask_select(x_mask: Tensor, x: Tensor, masked_x: Tensor, T: int, S: int,
                  token_order: TokenOrder) -> Tensor:
    """OpenSora's ``t_mask_select``: per frame, ``x`` where ``x_mask`` (B, T) is set, else
    ``masked_x``; both (B, N, h) in ``token_order``. One ``torch.where`` over the whole tensor."""
    batch, tokens, hidden = x.shape
    major, minor = token_axes(token_order, T, S)
    mask = x_mask[:, :, None, None] if token_order == FRAME_MAJOR else x_mask[:, None, :, None]
    selected = torch.where(mask, x.reshape(batch, major, minor, hidden),
                           masked_x.reshape(batch, major, minor, hidden))
    return selected.reshape(batch, tokens, hidden)


def fused_rows_to_head_major(tensor: Tensor, parts: int, heads: int) -> Tensor:
    """Reorder the rows of a fused projection's weight (parts*h, h) or bias (parts*h,) from
    OpenSora's (parts, heads, head_dim) order to (heads, parts, head_dim)."""
    rest = tensor.shape[1:]
    head_dim = tensor.shape[0] // (parts * heads)
    return (tensor.reshape(parts, heads, head_dim, *rest).transpose(0, 1)
            .reshape(tensor.shape))


def split_fused(fused: Tensor, parts: int, heads: int, layout: str) -> tuple[Tensor, ...]:
    """(*B', L, parts*h) projection output -> `parts` tensors (*B', heads, L, head_dim), reading
    the rows in `layout` order (see FUSED_LAYOUTS); B' is one or more batch axes."""
    *lead, length, width = fused.shape
    head_dim = width // (parts * heads)
    n = len(lead)
    batch_dims = tuple(range(n))
    if layout == "head_major":  # (*B', L, heads, parts, hd) -> (parts, *B', heads, L, hd)
        return fused.reshape(*lead, length, heads, parts, head_dim).permute(
            n + 2, *batch_dims, n + 1, n, n + 3).unbind(0)
    if layout == "opensora":  # (*B', L, parts, heads, hd) -> (parts, *B', heads, L, hd)
        return fused.reshape(*lead, length, parts, heads, head_dim).permute(
            n + 1, *batch_dims, n + 2, n, n + 3).unbind(0)
    raise ValueError(f"fused layout {layout!r}: expected one of {FUSED_LAYOUTS}")


class BlockLinear(nn.Linear):
    """nn.Linear on a 3-D (or 4-D) input written as one einsum, ``abi,oi->abo`` + bias.

    nn.Linear flattens (a, b, i) to (a*b, i); when a strategy splits b but not all of a, the
    merged axis is no tile of the devices and GSPMD gathers the input and runs the product
    unsplit on every device.  The einsum keeps both axes, so the same weights give the same
    result and the product stays split.

    ``weight_point``: when set (by the owning module), the weight is read through the
    annotation hook at that point, so a strategy can lay out the copy the product reads (and
    with it the products of the backward).
    """

    weight_point: str | None = None
    annotate: AnnotateFn = staticmethod(no_annotation)

    @library_call("linear")  # one cuBLASLt GEMM, the bias added in its epilogue
    def forward(self, x: Tensor) -> Tensor:
        axes = "abcd"[:x.dim() - 1]
        weight = self.weight if self.weight_point is None else self.annotate(self.weight_point,
                                                                             self.weight)
        out = torch.einsum(f"{axes}i,oi->{axes}o", x, weight)
        return out + self.bias if self.bias is not None else out


# --------------------------------------------------------------------------------------------
# Norms and positional encodings
# --------------------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """LayerNorm without affine parameters, written out as mean / variance / rsqrt in float32."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    @library_call("layer_norm")  # one kernel in OpenSora (nn.LayerNorm or apex's fused LayerNorm)
    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        centered = x32 - x32.mean(dim=-1, keepdim=True)
        variance = (centered * centered).mean(dim=-1, keepdim=True)
        return (centered * torch.rsqrt(variance + self.eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (LLaMA style): x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # One statement per line as in OpenSora's LlamaRMSNorm: each is a kernel in PyTorch.
        x32 = x.float()
        variance = x32.pow(2).mean(dim=-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        normed = x32.to(x.dtype)
        return self.weight * normed


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over the sequence axis (-2), adjacent channel pairs rotated
    together, base 10000. Frequencies are recomputed per call (no buffer, no parameter)."""

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.theta = theta

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[-2]
        inv_freq = 1.0 / (self.theta ** (
            torch.arange(0, self.dim, 2, device=x.device, dtype=torch.float32) / self.dim))
        angles = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * inv_freq
        # (L, dim/2) -> (L, dim): each angle serves the two channels of its pair.
        angles = angles[:, :, None].expand(length, self.dim // 2, 2).reshape(length, self.dim)
        pairs = x.float().unflatten(-1, (self.dim // 2, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return (x.float() * angles.cos() + rotated * angles.sin()).to(x.dtype)


def sincos_position_2d(h_patches: int, w_patches: int, dim: int, scale: float, base_size: int,
                       device: torch.device) -> Tensor:
    """(h_patches*w_patches, dim) float32 sin/cos embedding of the patch grid, row-major.

    Half the channels encode the row, half the column; grid coordinates are stretched to a
    `base_size` grid and divided by `scale`, which keeps the embedding comparable across
    resolutions (OpenSora's PositionEmbedding2D behaves the same way).
    """
    quarter = dim // 4
    inv_freq = 1.0 / (10000.0 ** (
        torch.arange(0, quarter, device=device, dtype=torch.float32) / quarter))
    rows = torch.arange(h_patches, device=device, dtype=torch.float32) * (base_size / h_patches / scale)
    cols = torch.arange(w_patches, device=device, dtype=torch.float32) * (base_size / w_patches / scale)
    row_of_token = rows[:, None].expand(h_patches, w_patches).reshape(-1)
    col_of_token = cols[None, :].expand(h_patches, w_patches).reshape(-1)

    def encode(coord: Tensor) -> Tensor:
        angles = coord[:, None] * inv_freq[None, :]
        return torch.cat((angles.sin(), angles.cos()), dim=-1)

    return torch.cat((encode(row_of_token), encode(col_of_token)), dim=-1)


def sinusoidal_embedding(values: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """(n,) -> (n, dim) float32 [cos | sin] embedding of scalars (diffusion timesteps, fps)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, device=values.device, dtype=torch.float32) / half)
    args = values.float()[:, None] * freqs[None, :]
    return torch.cat((torch.cos(args), torch.sin(args)), dim=-1)


# --------------------------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------------------------


class PatchEmbed3D(nn.Module):
    """Conv3d with kernel = stride = patch size; pads T, H, W up to a multiple of the patch."""

    def __init__(self, patch_size: tuple[int, int, int], in_channels: int, hidden: int) -> None:
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.proj = nn.Conv3d(in_channels, hidden, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, z: Tensor) -> Tensor:
        """(B, C, T, H, W) -> (B, N, hidden) with tokens in (t, h, w) row-major order."""
        pt, ph, pw = self.patch_size
        _, _, frames, height, width = z.shape
        pad = (0, -width % pw, 0, -height % ph, 0, -frames % pt)
        if any(pad):  # static: depends on shapes only
            z = F.pad(z, pad)
        return patch_tokens(self.proj(z))


@library_call("transposed_tokens")
def patch_tokens(x: Tensor) -> Tensor:
    """(B, hidden, T, H, W) -> (B, N, hidden) as OpenSora's PatchEmbed3D does it: a view, so in
    PyTorch the tokens stay channel-major, and its residual stream with them (``x + ...`` keeps
    its first input's layout): ``--exec torch`` charges the copies and strided adds that costs."""
    return x.flatten(2).transpose(1, 2)


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of a scalar per sample -> Linear -> SiLU -> Linear."""

    def __init__(self, hidden: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden, bias=True), nn.SiLU(),
                                 nn.Linear(hidden, hidden, bias=True))

    def forward(self, t: Tensor) -> Tensor:
        freq = sinusoidal_embedding(t, self.frequency_embedding_size)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))


class SizeEmbedder(TimestepEmbedder):
    """TimestepEmbedder for a scalar shared by the batch (fps): (k,) values repeated to `batch`."""

    def forward(self, s: Tensor, batch: int) -> Tensor:  # type: ignore[override]
        s = s.reshape(-1)
        if batch % s.shape[0]:
            raise ValueError(f"fps has {s.shape[0]} values, which do not divide batch {batch}")
        s = s.reshape(-1, 1).repeat(batch // s.shape[0], 1).reshape(-1)
        return super().forward(s)


class CaptionMlp(nn.Module):
    """Two-layer GELU(tanh) MLP of the caption embedder (no sharding hook)."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=True)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, out_features, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CaptionEmbedder(nn.Module):
    """Projects T5 caption features (B, 1, TOKEN, C_cap) to (B, 1, TOKEN, hidden)."""

    def __init__(self, caption_channels: int, hidden: int) -> None:
        super().__init__()
        self.y_proj = CaptionMlp(caption_channels, hidden, hidden)

    def forward(self, y: Tensor) -> Tensor:
        return self.y_proj(y)


# --------------------------------------------------------------------------------------------
# Block parts
# --------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head self-attention with optional RMSNorm on q, k and optional RoPE (temporal)."""

    def __init__(self, hidden: int, num_heads: int, qk_norm: bool, eps: float, rope: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = BlockLinear(hidden, 3 * hidden, bias=True)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else nn.Identity()
        self.rope = RotaryEmbedding(self.head_dim) if rope else None
        self.proj = BlockLinear(hidden, hidden, bias=True)
        self.annotate: AnnotateFn = no_annotation
        self.attention_fn: AttentionFn = plain_attention
        # Where OpenSora calls its fused attention kernel (a GPU run may put SDPA here).
        self.flash_fn: AttentionFn = plain_attention
        # PipeFusion: (k, v) of a patch -> full-sequence (k, v) (the stale buffer of the previous
        # step with the patch's fresh k, v written in); None: attend within x only.
        self.kv_hook: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
        self.fused_layout = "opensora"
        # Whether the fused kernel runs: None applies OpenSora's rule to this call's sizes
        # (``self_attention_is_flash``); True or False forces it (``STDiT3.force_self_attention_flash``).
        self.flash: bool | None = None

    def forward(self, x: Tensor) -> Tensor:
        """(*B', L, h) -> (*B', L, h); B' is one batch axis, or two (see ``batch_apart``)."""
        x = self.annotate("attn_in", x)
        *lead, length, hidden = x.shape
        batch = math.prod(lead)
        # each (B', heads, L, hd)
        q, k, v = split_fused(self.annotate("qkv", self.qkv(x)), 3, self.num_heads,
                              self.fused_layout)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        if self.kv_hook is not None:
            k, v = self.kv_hook(k, v)
        q, k, v = self.annotate("q", q), self.annotate("k", k), self.annotate("v", v)
        # OpenSora runs flash attention only when the sequence is longer than the batch (its
        # Attention.forward: "flash attn is not memory efficient for small sequences"); otherwise
        # the plain product and float32 softmax, whose output transpose + reshape is a copy.
        flash = self_attention_is_flash(length, batch) if self.flash is None else self.flash
        kernel = self.flash_fn if flash and self.attention_fn is plain_attention else self.attention_fn
        out = self.annotate("attn_kernel_out", kernel(q, k, v, None, self.scale))
        merge = merge_heads_flash if flash else merge_heads_copy
        out = merge(out, length, hidden)
        out = self.annotate("attn_out", out)
        return self.annotate("proj_out", self.proj(out))


class MultiHeadCrossAttention(nn.Module):
    """Cross-attention of video tokens to caption tokens, all samples flattened into one sequence
    with a block-diagonal mask (each sample sees only its own caption), as OpenSora does."""

    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden // num_heads
        self.scale = self.head_dim ** -0.5
        self.q_linear = BlockLinear(hidden, hidden, bias=True)
        self.kv_linear = BlockLinear(hidden, 2 * hidden, bias=True)
        self.kv_linear.weight_point = "cross_kv_weight"
        self.proj = BlockLinear(hidden, hidden, bias=True)
        self.annotate: AnnotateFn = no_annotation
        self.attention_fn: AttentionFn = plain_attention
        # Where OpenSora calls its fused attention kernel (a GPU run may put SDPA here).
        self.flash_fn: AttentionFn = plain_attention
        self.fused_layout = "opensora"
        # Queries (B, heads, N, hd) against the (1, heads, B*TOKEN, hd) caption keys with a
        # (B, 1, N, B*TOKEN) mask instead of one (1, heads, B*N, hd) sequence: the same scores
        # and FLOPs, for layouts where B*N is no tile (see STDiT3Block.batch_apart).
        self.batch_apart = False

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        """x (B, N, h), cond (1, B*TOKEN, h) -> (B, N, h)."""
        batch, tokens, hidden = x.shape
        keys = cond.shape[1]
        x, cond = self.annotate("cross_in", x), self.annotate("cross_cond", cond)
        q = self.annotate("cross_q_tokens",
                          self.q_linear(x).reshape(batch, tokens, self.num_heads, self.head_dim))
        mask = block_diagonal_mask(batch, tokens, keys // batch, device=x.device)
        if self.batch_apart:
            q, mask = q.transpose(1, 2), mask.reshape(batch, 1, tokens, keys)
        else:
            q = q.reshape(1, batch * tokens, self.num_heads, self.head_dim).transpose(1, 2)
        # each (1, heads, B*TOKEN, hd)
        kv = self.annotate("cross_kv", self.kv_linear(cond))
        k, v = split_fused(kv, 2, self.num_heads, self.fused_layout)
        q = self.annotate("cross_q", q)
        k, v = self.annotate("cross_k", k), self.annotate("cross_v", v)
        # OpenSora: one xformers memory_efficient_attention call with a block-diagonal mask.
        attention_fn = self.flash_fn if self.attention_fn is plain_attention else self.attention_fn
        out = self.annotate("cross_kernel_out", attention_fn(q, k, v, mask, self.scale))
        if self.batch_apart:  # (B, heads, N, hd) -> (B, N, h)
            out = self.annotate("cross_out", merge_heads_flash(out, tokens, hidden))
            return self.annotate("cross_proj_out", self.proj(out))
        out = self.annotate("cross_out", merge_heads_flash(out, batch * tokens, hidden))
        return self.annotate("cross_proj_out", self.proj(out.reshape(batch, tokens, hidden)))


class Mlp(nn.Module):
    """fc1 (h -> ratio*h), GELU(tanh), fc2 (ratio*h -> h)."""

    def __init__(self, hidden: int, mlp_hidden: int) -> None:
        super().__init__()
        self.fc1 = BlockLinear(hidden, mlp_hidden, bias=True)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = BlockLinear(mlp_hidden, hidden, bias=True)
        self.annotate: AnnotateFn = no_annotation

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.annotate("mlp_hidden", self.act(self.fc1(self.annotate("mlp_in", x))))
        return self.annotate("mlp_out", self.fc2(hidden))


class STDiT3Block(nn.Module):
    """One spatial or temporal block: gated self-attention, cross-attention, gated MLP.

    Spatial blocks attend over the S tokens of each frame (batch B*T); temporal blocks attend over
    the T frames at each spatial position (batch B*S) and apply RoPE to q and k.
    """

    def __init__(self, config: STDiT3Config, temporal: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.temporal = temporal
        self.norm1 = LayerNorm(config.norm_eps)
        self.attn = Attention(h, config.num_heads, config.qk_norm, config.norm_eps, rope=temporal)
        self.cross_attn = MultiHeadCrossAttention(h, config.num_heads)
        self.norm2 = LayerNorm(config.norm_eps)
        self.mlp = Mlp(h, config.mlp_hidden)
        self.scale_shift_table = nn.Parameter(torch.randn(6, h) / h ** 0.5)
        self.annotate: AnnotateFn = no_annotation
        # Attend over the minor token factor on (B, major, minor, h) instead of (B*major, minor,
        # h): the same arithmetic, but a strategy that splits the major factor and not the batch
        # (a sequence split with B/X > 1) keeps a tiled layout (the merged B*major is no tile).
        self.batch_apart = False

    def forward(self, x: Tensor, y: Tensor, t_mlp: Tensor, T: int, S: int,
                token_order: TokenOrder = FRAME_MAJOR, x_mask: Tensor | None = None,
                t0_mlp: Tensor | None = None) -> Tensor:
        """x (B, N=T*S, h) in `token_order`, y (1, B*TOKEN, h), t_mlp (B, 6h) -> (B, N, h).

        With ``x_mask`` (B, T) and ``t0_mlp`` (B, 6h), OpenSora's official text-to-video path:
        LayerNorm + modulation, and the gates, computed again with the timestep-0 modulation and
        selected per frame (``t_mask_select``); the result is the same for an all-ones mask."""
        batch, tokens, hidden = x.shape
        x = self.annotate("x", x)
        modulation = self.scale_shift_table[None] + t_mlp.reshape(batch, 6, hidden)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation.chunk(6, dim=1)
        masked = x_mask is not None and t0_mlp is not None
        if masked:
            zero = (self.scale_shift_table[None] + t0_mlp.reshape(batch, 6, hidden)).chunk(6, dim=1)

        def select(value: Tensor, zero_value: Tensor) -> Tensor:
            value, zero_value = self.annotate("select_grad", value), self.annotate("select_grad", zero_value)
            return self.annotate("select_grad", t_mask_select(x_mask, value, zero_value, T, S, token_order))

        h_attn = modulate(self.norm1(x), shift_msa, scale_msa)
        if masked:
            h_attn = select(h_attn, modulate(self.norm1(x), zero[0], zero[1]))
        h_attn = self._self_attention(h_attn, T, S, token_order).reshape(batch, tokens, hidden)
        gated = gate_msa * h_attn
        if masked:
            gated = select(gated, zero[2] * h_attn)
        x = self.annotate("x", x + gated)

        x = self.annotate("x", x + self.cross_attn(x, y))

        h_mlp = modulate(self.norm2(x), shift_mlp, scale_mlp)
        if masked:
            h_mlp = select(h_mlp, modulate(self.norm2(x), zero[3], zero[4]))
        h_mlp = self.mlp(h_mlp)
        gated = gate_mlp * h_mlp
        if masked:
            gated = select(gated, zero[5] * h_mlp)
        return self.annotate("x", x + gated)

    def _self_attention(self, x: Tensor, T: int, S: int, token_order: TokenOrder) -> Tensor:
        """Self-attention over S (spatial) or T (temporal) of x (B, N, h) in `token_order`.

        The token axis is (major, minor) = (T, S) frame-major or (S, T) space-major.  Attending
        over the minor factor is a plain reshape to (B*major, minor, h); attending over the major
        factor needs the transpose (B, major, minor, h) -> (B*minor, major, h) and back.
        Returns the attention output in a shape that reshapes to (B, N, h) in `token_order`.
        """
        batch, _, hidden = x.shape
        major, minor = token_axes(token_order, T, S)
        # PipeFusion's stale K/V buffers (attn.kv_hook) hold the merged (B', heads, L, hd) layout.
        apart = self.batch_apart and self.attn.kv_hook is None
        if self.temporal != major_axis_is_temporal(token_order):  # sequence = minor factor
            if apart:
                return self.attn(x.reshape(batch, major, minor, hidden))
            return self.attn(x.reshape(batch * major, minor, hidden))
        # OpenSora's rearranges "B (T S) C -> (B S) T C" and back each copy the tensor.
        x = self.attn(swap_token_axes_copy(x, batch, major, minor))
        # Back to (B, N, h) without merging B and the (split) major factor (see batch_apart).
        return swap_token_axes_copy(x, batch, minor, major, merge_batch=not apart)


class T2IFinalLayer(nn.Module):
    """LayerNorm, modulation by the timestep embedding, Linear h -> prod(patch) * C_out."""

    def __init__(self, hidden: int, out_features: int, eps: float) -> None:
        super().__init__()
        self.norm_final = LayerNorm(eps)
        self.linear = nn.Linear(hidden, out_features, bias=True)
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden) / hidden ** 0.5)

    def forward(self, x: Tensor, t: Tensor, x_mask: Tensor | None = None, t0: Tensor | None = None,
                T: int = 0, S: int = 0, token_order: TokenOrder = FRAME_MAJOR) -> Tensor:
        shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
        out = modulate(self.norm_final(x), shift, scale)
        if x_mask is not None and t0 is not None:  # OpenSora's official path (STDiT3Block.forward)
            shift_zero, scale_zero = (self.scale_shift_table[None] + t0[:, None]).chunk(2, dim=1)
            out = t_mask_select(x_mask, out, modulate(self.norm_final(x), shift_zero, scale_zero), T, S,
                                token_order)
        return self.linear(out)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass
class StageState:
    """What flows between pipeline stages. Plain tensors and ints, so a tracer can build one from
    recorded shapes without running the earlier stages."""

    x: Tensor  # (B, N, h) video tokens, in `token_order`
    y: Tensor  # (1, B*TOKEN, h) embedded caption, all samples flattened
    t: Tensor  # (B, h) timestep + fps embedding (the final layer's modulation input)
    t_mlp: Tensor  # (B, 6h) shift/scale/gate of every block
    T: int  # temporal tokens
    S: int  # spatial tokens per frame
    H_lat: int  # latent height before padding (the output is cropped back to it)
    W_lat: int  # latent width before padding
    T_lat: int | None = None  # latent frames before padding; None: T * patch_t (no padding)
    token_order: TokenOrder = FRAME_MAJOR  # order of the T*S tokens of a sample in x
    # OpenSora's official text-to-video path (STDiT3.embed(official=True)); None: the clean graph
    t0: Tensor | None = None  # (B, h) timestep-0 embedding (the final layer's masked modulation)
    t0_mlp: Tensor | None = None  # (B, 6h) timestep-0 shift/scale/gate of every block
    x_mask: Tensor | None = None  # (B, T) bool: frames that are noised (all of them here)

    def __post_init__(self) -> None:
        check_token_order(self.token_order)

    @property
    def N(self) -> int:
        return self.T * self.S

    def reordered(self, token_order: TokenOrder) -> StageState:
        """This state with x in `token_order` (itself when x already is)."""
        if token_order == self.token_order:
            return self
        x = reorder_tokens(self.x, self.token_order, token_order, self.T, self.S)
        return dataclasses.replace(self, x=x, token_order=token_order)

    def tensors(self) -> dict[str, Tensor]:
        """The tensor fields by name (x, y, t, t_mlp; and t0, t0_mlp, x_mask when set)."""
        fields = {"x": self.x, "y": self.y, "t": self.t, "t_mlp": self.t_mlp}
        official = {"t0": self.t0, "t0_mlp": self.t0_mlp, "x_mask": self.x_mask}
        return fields | {name: value for name, value in official.items() if value is not None}


class STDiT3(nn.Module):
    """OpenSora v1.2 STDiT3 backbone. Children in stage order: the 5 embeddings (`x_embedder`,
    `t_embedder`, `fps_embedder`, `y_embedder`, `t_block`), `spatial_blocks` / `temporal_blocks`
    (pair i = block i), `final_layer`."""

    def __init__(self, config: STDiT3Config) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.x_embedder = PatchEmbed3D(config.patch_size, config.in_channels, h)
        self.t_embedder = TimestepEmbedder(h, config.frequency_embedding_size)
        self.fps_embedder = SizeEmbedder(h, config.frequency_embedding_size)
        self.y_embedder = CaptionEmbedder(config.caption_channels, h)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(h, 6 * h, bias=True))
        self.spatial_blocks = nn.ModuleList(
            STDiT3Block(config, temporal=False) for _ in range(config.depth))
        self.temporal_blocks = nn.ModuleList(
            STDiT3Block(config, temporal=True) for _ in range(config.depth))
        self.final_layer = T2IFinalLayer(h, config.final_out_features, config.norm_eps)
        self.annotate: AnnotateFn = no_annotation

    # Stage structure -----------------------------------------------------------------------

    def embedding_modules(self) -> list[nn.Module]:
        """The 5 embedding modules that stage 0 holds, in forward order."""
        return [self.x_embedder, self.t_embedder, self.fps_embedder, self.y_embedder, self.t_block]

    def force_self_attention_flash(self, spatial: bool, temporal: bool) -> None:
        """Run the spatial and the temporal self-attentions with (True) or without (False) the
        fused kernel whatever their sizes: a small trace standing for a larger shape makes the
        choice OpenSora's rule makes at that shape (the plan search's calibrations)."""
        for spatial_block, temporal_block in self.block_pairs():
            spatial_block.attn.flash, temporal_block.attn.flash = spatial, temporal

    def block_pairs(self) -> list[tuple[STDiT3Block, STDiT3Block]]:
        """(spatial, temporal) block of each of the `depth` pairs."""
        return list(zip(self.spatial_blocks, self.temporal_blocks))

    # Forward pieces ------------------------------------------------------------------------

    def embed(self, z: Tensor, y: Tensor, t: Tensor, fps: Tensor,
              token_order: TokenOrder = FRAME_MAJOR, official: bool = False) -> StageState:
        """z (B, C_in, T_lat, H_lat, W_lat), y (B, 1, TOKEN, C_cap), t (B,), fps (1,) -> the
        state with x in `token_order`. ``official``: OpenSora v1.2's text-to-video path, with the
        temporal mask and the timestep-0 embeddings (``StageState.x_mask``, ``t0``, ``t0_mlp``)."""
        dtype = self.x_embedder.proj.weight.dtype
        batch, _, t_lat, h_lat, w_lat = z.shape
        pt, ph, pw = self.config.patch_size
        T, h_patches, w_patches = -(-t_lat // pt), -(-h_lat // ph), -(-w_lat // pw)
        S = h_patches * w_patches
        hidden = self.config.hidden_size

        x = self.x_embedder(z.to(dtype))  # (B, T*S, h)
        # Resolution-aware scale of the position embedding: pixel side relative to the side
        # the model was trained at. Static Python floats: they come from shapes only.
        pixel_side = math.sqrt(h_lat * w_lat) * self.config.vae_downsample
        pos = sincos_position_2d(h_patches, w_patches, hidden,
                                 scale=pixel_side / self.config.input_sq_size,
                                 base_size=round(S ** 0.5), device=x.device)
        x = (x.reshape(batch, T, S, hidden) + pos.to(dtype)).reshape(batch, T * S, hidden)

        fps_emb = self.fps_embedder(fps, batch)
        t_emb = self.t_embedder(t) + fps_emb
        t_mlp = self.t_block(t_emb)
        official_fields = {}
        if official:
            t0 = self.t_embedder(torch.zeros_like(t)) + fps_emb
            official_fields = {"t0": t0, "t0_mlp": self.t_block(t0), "x_mask": temporal_mask(t, T)}
        y_emb = self.y_embedder(y.to(dtype)).reshape(1, -1, hidden)
        state = StageState(x=x, y=y_emb, t=t_emb, t_mlp=t_mlp, T=T, S=S, H_lat=h_lat, W_lat=w_lat,
                           T_lat=t_lat, **official_fields)  # patches come frame-major: (t, h, w) row-major
        return state.reordered(token_order)

    def run_blocks(self, state: StageState, first: int, last: int) -> StageState:
        """Run block pairs first..last (inclusive) on `state`; x stays in its token order."""
        depth = self.config.depth
        if not (0 <= first <= last < depth):
            raise StageRangeError(
                f"block range {first}..{last}: expected 0 <= first <= last <= {depth - 1}")
        x = state.x
        for index in range(first, last + 1):
            x = self.spatial_blocks[index](x, state.y, state.t_mlp, state.T, state.S,
                                           state.token_order, state.x_mask, state.t0_mlp)
            x = self.temporal_blocks[index](x, state.y, state.t_mlp, state.T, state.S,
                                            state.token_order, state.x_mask, state.t0_mlp)
        return dataclasses.replace(state, x=x)

    def finalize(self, state: StageState) -> Tensor:
        """Final layer and unpatchify: -> (B, C_out, T_lat, H_lat, W_lat)."""
        pt, ph, pw = self.config.patch_size
        t_lat = state.T * pt if state.T_lat is None else state.T_lat
        h_patches, w_patches = -(-state.H_lat // ph), -(-state.W_lat // pw)
        if h_patches * w_patches != state.S:
            raise ValueError(f"state has S={state.S} but latent {state.H_lat}x{state.W_lat} "
                             f"gives {h_patches}x{w_patches} patches")
        x = self.final_layer(self.annotate("final_in", state.x), state.t, state.x_mask, state.t0,
                             state.T, state.S, state.token_order)
        batch = x.shape[0]
        c_out = self.config.out_channels
        # Unpatchify.  The token axis is (T, H, W) frame-major, (H, W, T) space-major; the one
        # permute below puts frames first again, so space-major tokens return to frame-major
        # here, after the final linear (prod(patch)*C_out features per token move, not h), and
        # without a separate transpose whose (T, S) merge GSPMD would all-gather when S is split.
        token_dims = ("T", "H", "W") if state.token_order == FRAME_MAJOR else ("H", "W", "T")
        sizes = {"T": state.T, "H": h_patches, "W": w_patches}
        axis = {dim: 1 + index for index, dim in enumerate(token_dims)}
        x = x.reshape(batch, *(sizes[dim] for dim in token_dims), pt, ph, pw, c_out)
        x = x.permute(0, 7, axis["T"], 4, axis["H"], 5, axis["W"], 6).reshape(
            batch, c_out, state.T * pt, h_patches * ph, w_patches * pw)
        return x[:, :, :t_lat, :state.H_lat, :state.W_lat]

    def forward(self, z: Tensor, y: Tensor, t: Tensor, fps: Tensor,
                token_order: TokenOrder = FRAME_MAJOR, official: bool = False) -> Tensor:
        """The whole model; `token_order` is the order of x inside (the result is the same);
        ``official``: OpenSora's text-to-video path (:meth:`embed`; the same result)."""
        state = self.embed(z, y, t, fps, token_order, official)
        state = self.run_blocks(state, 0, self.config.depth - 1)
        return self.finalize(state)
