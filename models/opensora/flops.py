"""Exact analytic parameter and GEMM-FLOP counts of the STDiT3 graph in `stdit3.py`.

A GEMM here is every matrix product the forward pass performs: the Linear layers, the attention
score (q k^T) and value (p v) products, and the Conv3d patch embedding (a GEMM over patches). One
product of an (M x K) by a (K x N) matrix costs 2*M*N*K FLOPs; bias adds, norms, softmax and other
element-wise work are not GEMMs and are not counted here.

With batch B, hidden h, N = T*S video tokens per sample and TOKEN caption tokens per sample, one
block pair (spatial + temporal block) costs::

    56*B*N*h^2                (qkv 6, proj 2, cross q 2, cross proj 2, fc1 8, fc2 8; twice)
  + 8*B*TOKEN*h^2             (cross kv: 4 per cross-attention, two cross-attentions)
  + 4*B*N*h*(S + T)           (spatial and temporal scores and values)
  + 4 * 2*(B*N)*(B*TOKEN)*h   (cross scores and values over the flattened, masked sequences)

for mlp_ratio 4. The last term is what OpenSora's flattened cross-attention costs when written as
plain attention: the full (B*N) x (B*TOKEN) score matrix is computed and then masked, so it is B
times the per-sample cost 4*B*N*TOKEN*h that the reference note assumes.

No torch needed.
"""

from __future__ import annotations

from models.opensora.config import STDiT3Config
from models.opensora.inputs import VideoShape, geometry

__all__ = ["block_pair_gemm_flops", "gemm_flops", "parameter_breakdown", "parameter_count"]


def _linear_params(fan_in: int, fan_out: int) -> int:
    return fan_in * fan_out + fan_out  # weight + bias


def parameter_breakdown(config: STDiT3Config) -> dict[str, int]:
    """Learned parameters per module: the 5 embeddings, one spatial block, one temporal block,
    all blocks, the final layer and the total."""
    h = config.hidden_size
    hd = config.head_dim
    freq = config.frequency_embedding_size
    timestep_mlp = _linear_params(freq, h) + _linear_params(h, h)
    block = (
        _linear_params(h, 3 * h)  # attn.qkv
        + (2 * hd if config.qk_norm else 0)  # attn.q_norm, attn.k_norm weights
        + _linear_params(h, h)  # attn.proj
        + _linear_params(h, h)  # cross_attn.q_linear
        + _linear_params(h, 2 * h)  # cross_attn.kv_linear
        + _linear_params(h, h)  # cross_attn.proj
        + _linear_params(h, config.mlp_hidden)  # mlp.fc1
        + _linear_params(config.mlp_hidden, h)  # mlp.fc2
        + 6 * h  # scale_shift_table
    )
    counts = {
        "x_embedder": config.in_channels * config.patch_volume * h + h,  # Conv3d weight + bias
        "t_embedder": timestep_mlp,
        "fps_embedder": timestep_mlp,
        "y_embedder": _linear_params(config.caption_channels, h) + _linear_params(h, h),
        "t_block": _linear_params(h, 6 * h),
        "spatial_block": block,  # RoPE has no parameters, so both kinds are the same size
        "temporal_block": block,
        "blocks": 2 * config.depth * block,
        "final_layer": 2 * h + _linear_params(h, config.final_out_features),
    }
    counts["total"] = sum(counts[k] for k in (
        "x_embedder", "t_embedder", "fps_embedder", "y_embedder", "t_block", "blocks",
        "final_layer"))
    return counts


def parameter_count(config: STDiT3Config) -> int:
    """All learned parameters of `STDiT3(config)`."""
    return parameter_breakdown(config)["total"]


def _gemm(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def block_pair_gemm_flops(config: STDiT3Config, T: int, S: int, batch: int = 2) -> dict[str, int]:
    """GEMM FLOPs of every matrix product of one block pair, keyed `<part>.<product>`.

    Parts: `spatial_attn`, `temporal_attn` (self-attention), `spatial_cross`, `temporal_cross`,
    `spatial_mlp`, `temporal_mlp`.
    """
    h = config.hidden_size
    rows = batch * T * S  # video tokens of the whole batch
    caption_rows = batch * config.model_max_length
    ops: dict[str, int] = {}
    for kind, seq in (("spatial", S), ("temporal", T)):
        # (B*N/seq) sequences of length seq; heads*head_dim = h, so per-head products sum to h.
        ops[f"{kind}_attn.qkv"] = _gemm(rows, 3 * h, h)
        ops[f"{kind}_attn.score"] = _gemm(rows, seq, h)
        ops[f"{kind}_attn.value"] = _gemm(rows, h, seq)
        ops[f"{kind}_attn.proj"] = _gemm(rows, h, h)
        ops[f"{kind}_cross.q"] = _gemm(rows, h, h)
        ops[f"{kind}_cross.kv"] = _gemm(caption_rows, 2 * h, h)
        # Flattened: all B*N queries against all B*TOKEN keys, then masked.
        ops[f"{kind}_cross.score"] = _gemm(rows, caption_rows, h)
        ops[f"{kind}_cross.value"] = _gemm(rows, h, caption_rows)
        ops[f"{kind}_cross.proj"] = _gemm(rows, h, h)
        ops[f"{kind}_mlp.fc1"] = _gemm(rows, config.mlp_hidden, h)
        ops[f"{kind}_mlp.fc2"] = _gemm(rows, h, config.mlp_hidden)
    return ops


def gemm_flops(config: STDiT3Config, shape: str | VideoShape, batch: int = 2,
               official: bool = False) -> dict:
    """GEMM FLOPs of one forward pass for a video shape; ``official``: OpenSora's text-to-video
    path (``STDiT3.embed``), which embeds the timestep 0 as well: ``t_embedder`` and ``t_block``
    run twice.

    Returns a dict with:

    * `per_block`: one block pair, by module kind: `spatial_self_attention`,
      `temporal_self_attention`, `cross_attention` (both), `mlp` (both), `total`;
    * `block_ops`: every product of one block pair (see `block_pair_gemm_flops`);
    * `embedding_modules`: `x_embedder`, `t_embedder`, `fps_embedder`, `y_embedder`, `t_block`;
    * `forward`: the whole forward pass by kind: `embeddings`, the four block kinds summed over
      all `depth` pairs, `blocks`, `final_layer`, `total`;
    * `depth`, `batch`, `T`, `S`, `N`, `token`: the sizes used.
    """
    geo = geometry(config, shape)
    h = config.hidden_size
    T, S, N = geo.T, geo.S, geo.N
    ops = block_pair_gemm_flops(config, T, S, batch)

    def part(prefix: str) -> int:
        return sum(v for k, v in ops.items() if k.startswith(prefix))

    per_block = {
        "spatial_self_attention": part("spatial_attn."),
        "temporal_self_attention": part("temporal_attn."),
        "cross_attention": part("spatial_cross.") + part("temporal_cross."),
        "mlp": part("spatial_mlp.") + part("temporal_mlp."),
    }
    per_block["total"] = sum(per_block.values())
    assert per_block["total"] == sum(ops.values())

    freq = config.frequency_embedding_size
    embedding_modules = {
        # Conv3d as a GEMM: one row per (padded) patch, K = in_channels * patch volume.
        "x_embedder": _gemm(batch * N, h, config.in_channels * config.patch_volume),
        "t_embedder": (_gemm(batch, h, freq) + _gemm(batch, h, h)) * (2 if official else 1),
        "fps_embedder": _gemm(batch, h, freq) + _gemm(batch, h, h),  # fps repeated to the batch
        "y_embedder": _gemm(batch * geo.token, h, config.caption_channels)
        + _gemm(batch * geo.token, h, h),
        "t_block": _gemm(batch, 6 * h, h) * (2 if official else 1),
    }
    forward = {"embeddings": sum(embedding_modules.values())}
    for kind in ("spatial_self_attention", "temporal_self_attention", "cross_attention", "mlp"):
        forward[kind] = config.depth * per_block[kind]
    forward["blocks"] = config.depth * per_block["total"]
    forward["final_layer"] = _gemm(batch * N, config.final_out_features, h)
    forward["total"] = forward["embeddings"] + forward["blocks"] + forward["final_layer"]
    return {
        "per_block": per_block,
        "block_ops": ops,
        "embedding_modules": embedding_modules,
        "forward": forward,
        "depth": config.depth, "batch": batch, "T": T, "S": S, "N": N, "token": geo.token,
    }
