"""The library kernels OpenSora's official code calls where ``models.opensora.stdit3`` writes plain
ops, for running the model eagerly on a GPU (the benchmarks) or recording what it allocates
(``tracing.allocations``): docs/gpu.md, "The official inference path"."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from models.opensora.config import STDiT3Config
from models.opensora.stdit3 import Attention, BlockLinear, LayerNorm, MultiHeadCrossAttention


def official_kernels(model: nn.Module, config: STDiT3Config) -> None:
    """Give ``model`` (a block, or the whole STDiT3) the library kernels the official code calls
    where the model writes plain ops: ``BlockLinear`` as ``nn.Linear`` (one GEMM with its bias; the
    profiler also records ``aten::linear``'s shapes, not those of ``aten::einsum``'s tensor list),
    ``LayerNorm`` as ``F.layer_norm``, SDPA where the official code calls flash attention, and the
    cross-attention per sample as xformers' block-diagonal mask runs it."""

    def sdpa(q, k, v, mask, scale):  # noqa: ANN001, ANN202, ARG001 - self-attention: no mask
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    def cross_per_sample(q, k, v, mask, scale):  # noqa: ANN001, ANN202, ARG001
        # each sample's queries against its own caption keys, no mask tensor:
        # q (1, heads, B*N, hd), k and v (1, heads, B*L, hd) -> (1, heads, B*N, hd)
        batch = k.shape[-2] // config.model_max_length
        per_sample = [part[0].unflatten(1, (batch, -1)).transpose(0, 1) for part in (q, k, v)]
        out = F.scaled_dot_product_attention(*per_sample, scale=scale)
        return out.transpose(0, 1).flatten(1, 2).unsqueeze(0)

    def layer_norm(module, x):  # noqa: ANN001, ANN202
        return F.layer_norm(x, (config.hidden_size,), eps=module.eps)

    for module in model.modules():
        if isinstance(module, Attention):
            module.flash_fn = sdpa
        elif isinstance(module, MultiHeadCrossAttention):
            module.flash_fn = cross_per_sample
        elif isinstance(module, BlockLinear):
            module.forward = types.MethodType(nn.Linear.forward, module)
        elif isinstance(module, LayerNorm):
            module.forward = types.MethodType(layer_norm, module)


def flash_attention_2(on_gpu: bool) -> contextlib.AbstractContextManager:
    """SDPA restricted to FlashAttention-2, the kernels of the flash-attn package the official
    code calls (by itself SDPA picks cuDNN's attention on Hopper); any backend on the CPU."""
    if not on_gpu:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


@contextlib.contextmanager
def flash_attention_2_on_meta() -> Iterator[None]:
    """On the ``meta`` device SDPA falls back to its plain product (scores written out) whatever
    backend is asked for; this calls the FlashAttention-2 op itself, which allocates what it does
    on a GPU: the output and float32 log-sum-exp rows."""
    plain = F.scaled_dot_product_attention

    def flash(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):  # noqa: ANN001, ANN202
        if attn_mask is not None or dropout_p:
            return plain(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, scale=scale)[0]

    F.scaled_dot_product_attention = flash
    try:
        yield
    finally:
        F.scaled_dot_product_attention = plain
