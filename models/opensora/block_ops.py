"""The STDiT3 block op builder: per-block shape dictionary -> list of :class:`~hardware.ops.Op`.

The shape dictionary (:class:`BlockShapes`) has the exact keys of the brief, all *as seen by one
device* after SPMD partitioning; the analyzer's block segmenter reads them off a dump and
:func:`block_shapes_for` derives them from a model config, a video geometry and a strategy.

=================  ===========================================================================
key                meaning (per device)
=================  ===========================================================================
``B_spt``          batch of the spatial self-attention (B*T: frames are batch), excluding heads
``S_Q_spt``        query length of one spatial attention instance (S)
``S_KV_spt``       key/value length of one spatial attention instance (S; for ring attention the
                   total over the ring)
``D_QKV``          input features of the fused qkv projection (and of cross q / kv): h
``H_QKV``          output features of the fused qkv projection on this device (3h, or 3h/n when
                   the heads are split); cross q has ``H_QKV/3`` outputs, cross kv ``2*H_QKV/3``
``N_A``            attention heads on this device
``H_A``            head dim
``D_O_spt``        input features of the spatial attention output projection (h or h/n)
``H_O_spt``        its output features (h)
``B_tmp`` ...      the same five for the temporal self-attention (batch B*S, length T)
``B_cro``          batch of the cross-attention: 1, because OpenSora flattens all samples into one
                   query sequence of B*N tokens and one key sequence of B*TOKEN caption tokens
``S_Q_cro``        cross-attention query length (B*N, divided when the batch/sequence is split)
``S_KV_cro``       cross-attention key length: all B*TOKEN caption tokens on every device (the
                   flattened key sequence is not split with the batch; the mask is not exploited)
``D_O_cro``        input / ``H_O_cro`` output features of the cross-attention output projection
``D_FU, H_FU``     input / output features of the MLP up projection fc1 (h, 4h or 4h/n)
``D_FD, H_FD``     input / output features of the MLP down projection fc2 (4h or 4h/n, h)
``L``              number of STDiT3 blocks (spatial + temporal pairs) these shapes describe
``Q``              bytes per element (2 for bf16)
=================  ===========================================================================

Token counts of the projections follow from volume conservation: the q projection's output
elements equal the attention's q elements (an all-to-all moves but never changes a device's
volume), so ``tokens = B * N_A * S_Q * H_A / (H_QKV/3)``; the output projection reads
``B * N_A * S_Q * H_A / D_O`` tokens; the MLP and the vector ops on the residual stream see the
tokens of the cross-attention output projection. This makes one dictionary describe Megatron,
2-D TP, DS-Ulysses, ring attention and DP alike. A split that is not even rounds up (GSPMD pads
every shard to the largest), e.g. DS-Ulysses' kv projection over 2*300 caption tokens on 16
devices sees 38 rows.

Vector operation counts per element follow reference note 004 ("Computation Disassembly") where
they are consistent; see the ``*_OPS_PER_*`` constants.
"""

from __future__ import annotations

from collections.abc import Mapping as MappingType
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from hardware.ops import Op, OpType

__all__ = [
    "BLOCK_SHAPE_KEYS",
    "GATE_RESIDUAL_OPS_PER_ELEMENT",
    "GELU_TANH_OPS_PER_ELEMENT",
    "LAYERNORM_OPS_PER_ELEMENT",
    "MASK_ADD_OPS_PER_SCORE",
    "MODULATE_OPS_PER_ELEMENT",
    "RESIDUAL_ADD_OPS_PER_ELEMENT",
    "RMSNORM_OPS_PER_ELEMENT",
    "ROPE_OPS_PER_ELEMENT",
    "SOFTMAX_OPS_PER_SCORE",
    "STRATEGIES",
    "BlockShapes",
    "block_shapes_for",
    "build_stdit_block_ops",
]

#: LayerNorm without affine: subtract mean, square, accumulate, multiply by rsqrt (004: "RMSNorm 4BSh").
LAYERNORM_OPS_PER_ELEMENT = 4
#: t2i_modulate ``x * (1 + scale) + shift`` (004: 2BSh).
MODULATE_OPS_PER_ELEMENT = 2
#: RMSNorm of q or k over the head dim: square, accumulate, multiply by rsqrt, multiply by weight (004: 4).
RMSNORM_OPS_PER_ELEMENT = 4
#: Rotary embedding ``x*cos + rotate_half(x)*sin``: two multiplies and an add (004: RoPE(K) 3).
ROPE_OPS_PER_ELEMENT = 3
#: Softmax of a score incl. the ``* scale``: scale, max, subtract, exp, sum, divide (004: "Softmax+DropOut 6").
SOFTMAX_OPS_PER_SCORE = 6
#: The cross-attention's block-diagonal mask is added to every score before the softmax.
MASK_ADD_OPS_PER_SCORE = 1
#: ``x + gate * y`` (004: Gate_ResAdd 2BSh).
GATE_RESIDUAL_OPS_PER_ELEMENT = 2
#: Cross-attention residual ``x + y`` has no gate.
RESIDUAL_ADD_OPS_PER_ELEMENT = 1
#: GELU(tanh) ``0.5x(1+tanh(c(x+0.044715x^3)))``: cube (2), multiply-add (2), scale, tanh, add,
#: multiply (x0.5x): 8. Reference 004 lists a smaller count that does not scale with the 4h width.
GELU_TANH_OPS_PER_ELEMENT = 8

BLOCK_SHAPE_KEYS = ["B_spt", "S_Q_spt", "S_KV_spt", "D_QKV", "H_QKV", "N_A", "H_A", "D_O_spt", "H_O_spt", "B_tmp", "S_Q_tmp", "S_KV_tmp", "D_O_tmp", "H_O_tmp", "B_cro", "S_Q_cro", "S_KV_cro", "D_O_cro", "H_O_cro", "D_FU", "H_FU", "D_FD", "H_FD", "L", "Q"]


@dataclass(frozen=True)
class BlockShapes:
    """The per-block, per-device shape dictionary (keys and meaning in the module docstring)."""

    B_spt: int
    S_Q_spt: int
    S_KV_spt: int
    D_QKV: int
    H_QKV: int
    N_A: int
    H_A: int
    D_O_spt: int
    H_O_spt: int
    B_tmp: int
    S_Q_tmp: int
    S_KV_tmp: int
    D_O_tmp: int
    H_O_tmp: int
    B_cro: int
    S_Q_cro: int
    S_KV_cro: int
    D_O_cro: int
    H_O_cro: int
    D_FU: int
    H_FU: int
    D_FD: int
    H_FD: int
    L: int
    Q: int

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"block shape {field.name} must be a positive integer, got {value!r}")
        if self.H_QKV % 3:
            raise ValueError(f"block shape H_QKV={self.H_QKV} is not a fused q, k, v width (multiple of 3)")

    @classmethod
    def from_dict(cls, values: MappingType[str, Any]) -> BlockShapes:
        """From a mapping with exactly the brief's keys (extra or missing keys are an error)."""
        missing = [k for k in BLOCK_SHAPE_KEYS if k not in values]
        extra = sorted(set(values) - set(BLOCK_SHAPE_KEYS))
        if missing or extra:
            raise ValueError(f"block shape dictionary: missing keys {missing}, unknown keys {extra}")
        return cls(**{k: values[k] for k in BLOCK_SHAPE_KEYS})

    def as_dict(self) -> dict[str, int]:
        """The dictionary, keys in the brief's order."""
        return {k: v for k, v in asdict(self).items()}

    def _tokens(self, batch: int, length: int, features: int) -> int:
        # Uneven shards round up: GSPMD pads every shard to the size of the largest.
        return -(-(batch * self.N_A * length * self.H_A) // features)

    # Token counts (rows) of each projection, by volume conservation (module docstring).
    def projection_tokens(self, branch: str) -> int:
        """Rows of the q (or fused qkv) projection of ``branch`` in ``spt``, ``tmp``, ``cro``."""
        return self._tokens(getattr(self, f"B_{branch}"), getattr(self, f"S_Q_{branch}"), self.H_QKV // 3)

    def output_tokens(self, branch: str) -> int:
        """Rows of the attention output projection of ``branch`` (= rows of the residual stream)."""
        return self._tokens(getattr(self, f"B_{branch}"), getattr(self, f"S_Q_{branch}"), getattr(self, f"D_O_{branch}"))

    def cross_kv_tokens(self) -> int:
        """Rows of the cross-attention kv projection (caption tokens on this device)."""
        return self._tokens(self.B_cro, self.S_KV_cro, self.H_QKV // 3)


class _ModelConfig(Protocol):
    hidden_size: int
    num_heads: int
    mlp_ratio: float
    model_max_length: int
    depth: int


STRATEGIES = ("single", "dp", "megatron", "two_dimension", "ds_ulysses", "ring_attention")


def _exact(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what}: {numerator} does not split evenly into {denominator}")
    return numerator // denominator


def block_shapes_for(
    config: _ModelConfig,
    *,
    frames: int,
    spatial_tokens: int,
    strategy: str = "single",
    mesh: tuple[int, int] = (1, 1),
    batch: int = 2,
    blocks: int | None = None,
    bytes_per_element: int = 2,
) -> BlockShapes:
    """The per-device dictionary for ``config`` (any object with ``hidden_size, num_heads, mlp_ratio,
    model_max_length, depth``), ``frames`` T and ``spatial_tokens`` S after patching, under
    ``strategy`` on a ``mesh`` of (X, Y) devices.

    ``megatron`` splits heads/hidden over all X*Y devices; ``two_dimension`` the batch over X and
    the hidden over Y; ``dp`` the batch over all devices; ``ds_ulysses`` the sequence for the
    projections and the heads for the attention; ``ring_attention`` the sequence (S in spatial,
    T in temporal, queries in cross) with K/V passed round the ring (its cross kv projection is
    counted on all B*TOKEN caption tokens: the dictionary has no separate key for the caption
    shard). Raises ValueError when a split is not even.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    h, heads, token = config.hidden_size, config.num_heads, config.model_max_length
    mlp = round(h * config.mlp_ratio)
    head_dim = _exact(h, heads, "head dim")
    devices = mesh[0] * mesh[1]
    batch_split, hidden_split = 1, 1
    if strategy == "single" and devices != 1:
        raise ValueError(f"strategy 'single' runs on one device, not a {mesh[0]}x{mesh[1]} mesh")
    if strategy == "dp":
        batch_split = devices
    elif strategy == "megatron":
        hidden_split = devices
    elif strategy == "two_dimension":
        batch_split, hidden_split = mesh
    b = _exact(batch, batch_split, "batch")
    t, s = frames, spatial_tokens
    n = t * s
    values: dict[str, int] = {
        "B_spt": b * t, "S_Q_spt": s, "S_KV_spt": s,
        "B_tmp": b * s, "S_Q_tmp": t, "S_KV_tmp": t,
        "B_cro": 1, "S_Q_cro": b * n, "S_KV_cro": batch * token,
        "D_QKV": h, "H_QKV": 3 * _exact(h, hidden_split, "hidden"),
        "N_A": _exact(heads, hidden_split, "heads"), "H_A": head_dim,
        "D_FU": h, "H_FU": _exact(mlp, hidden_split, "mlp hidden"),
        "D_FD": _exact(mlp, hidden_split, "mlp hidden"), "H_FD": h,
        "L": blocks if blocks is not None else config.depth, "Q": bytes_per_element,
    }
    for branch in ("spt", "tmp", "cro"):
        values[f"D_O_{branch}"] = _exact(h, hidden_split, "hidden")
        values[f"H_O_{branch}"] = h
    if strategy == "ds_ulysses":
        values["N_A"] = _exact(heads, devices, "heads")
        _exact(batch * n, devices, "sequence")
    elif strategy == "ring_attention":
        values["S_Q_spt"] = _exact(s, devices, "spatial sequence")
        values["S_Q_tmp"] = _exact(t, devices, "temporal sequence")
        values["S_Q_cro"] = _exact(batch * n, devices, "sequence")
    return BlockShapes.from_dict(values)


def _vector(name: str, inputs: tuple[tuple[int, ...], ...], weight: tuple[int, ...] | None, output: tuple[int, ...],
            ops_per_element: int, q: int, fuse_into: str | None = None) -> Op:
    elements = 1
    for d in output:
        elements *= d
    return Op(name, OpType.VECTOR, inputs, weight, output, ops_per_element * elements, q, fuse_into=fuse_into)


def _gemm(name: str, tokens: int, k: int, n: int, q: int) -> Op:
    return Op(name, OpType.GEMM, ((tokens, k),), (k, n), (tokens, n), 2 * tokens * k * n, q)


def _attention(name: str, batch: int, heads: int, s_q: int, s_kv: int, head_dim: int, q: int, masked: bool) -> Op:
    scores = batch * heads * s_q * s_kv
    per_score = SOFTMAX_OPS_PER_SCORE + (MASK_ADD_OPS_PER_SCORE if masked else 0)
    return Op(
        name,
        OpType.FLASH_ATTENTION,
        ((batch, heads, s_q, head_dim), (batch, heads, s_kv, head_dim), (batch, heads, s_kv, head_dim)),
        None,
        (batch, heads, s_q, head_dim),
        4 * scores * head_dim,
        q,
        vector_flops=per_score * scores,
    )


def build_stdit_block_ops(shapes: BlockShapes | MappingType[str, int]) -> list[Op]:
    """All ops of one STDiT3 block (spatial half, then temporal half), in execution order.

    Each half: LayerNorm, Modulate, fused QKV projection, RMSNorm of q and k, [RoPE of q and k in
    the temporal half], flash attention, output projection, gate + residual add; cross-attention
    (q projection, kv projection of the caption, masked flash attention, output projection,
    residual add); LayerNorm, Modulate, MLP fc1, GELU (marked ``fuse_into`` fc1), fc2, gate +
    residual add. Names are prefixed ``spatial_`` / ``temporal_``.
    """
    dims = shapes if isinstance(shapes, BlockShapes) else BlockShapes.from_dict(shapes)
    q = dims.Q
    q_width = dims.H_QKV // 3
    ops: list[Op] = []
    for prefix, branch in (("spatial", "spt"), ("temporal", "tmp")):
        batch, s_q, s_kv = getattr(dims, f"B_{branch}"), getattr(dims, f"S_Q_{branch}"), getattr(dims, f"S_KV_{branch}")
        d_o, h_o = getattr(dims, f"D_O_{branch}"), getattr(dims, f"H_O_{branch}")
        tokens = dims.projection_tokens(branch)
        residual = (dims.output_tokens(branch), h_o)
        per_head = (tokens * q_width // dims.H_A, dims.H_A)
        ops += [
            _vector(f"{prefix}_LayerNorm", (residual,), None, residual, LAYERNORM_OPS_PER_ELEMENT, q),
            _vector(f"{prefix}_Modulate", (residual,), (2, h_o), residual, MODULATE_OPS_PER_ELEMENT, q),
            _gemm(f"{prefix}_QKV_proj", tokens, dims.D_QKV, dims.H_QKV, q),
            _vector(f"{prefix}_RMSNorm_Q", (per_head,), (1, dims.H_A), per_head, RMSNORM_OPS_PER_ELEMENT, q),
            _vector(f"{prefix}_RMSNorm_K", (per_head,), (1, dims.H_A), per_head, RMSNORM_OPS_PER_ELEMENT, q),
        ]
        if prefix == "temporal":
            ops += [
                _vector(f"{prefix}_RoPE_Q", (per_head,), (2, dims.H_A), per_head, ROPE_OPS_PER_ELEMENT, q),
                _vector(f"{prefix}_RoPE_K", (per_head,), (2, dims.H_A), per_head, ROPE_OPS_PER_ELEMENT, q),
            ]
        ops += [
            _attention(f"{prefix}_FlashAttention", batch, dims.N_A, s_q, s_kv, dims.H_A, q, masked=False),
            _gemm(f"{prefix}_O_proj", dims.output_tokens(branch), d_o, h_o, q),
            _vector(f"{prefix}_Gate_ResAdd", (residual, residual), (1, h_o), residual, GATE_RESIDUAL_OPS_PER_ELEMENT, q),
        ]
        cross_residual = (dims.output_tokens("cro"), dims.H_O_cro)
        ops += [
            _gemm(f"{prefix}_cross_Q_proj", dims.projection_tokens("cro"), dims.D_QKV, q_width, q),
            _gemm(f"{prefix}_cross_KV_proj", dims.cross_kv_tokens(), dims.D_QKV, 2 * q_width, q),
            _attention(f"{prefix}_cross_FlashAttention", dims.B_cro, dims.N_A, dims.S_Q_cro, dims.S_KV_cro, dims.H_A, q, masked=True),
            _gemm(f"{prefix}_cross_O_proj", dims.output_tokens("cro"), dims.D_O_cro, dims.H_O_cro, q),
            _vector(f"{prefix}_cross_ResAdd", (cross_residual, cross_residual), None, cross_residual, RESIDUAL_ADD_OPS_PER_ELEMENT, q),
        ]
        mlp_tokens = dims.output_tokens("cro")
        mlp_in = (mlp_tokens, dims.D_FU)
        hidden = (mlp_tokens, dims.H_FU)
        mlp_out = (mlp_tokens, dims.H_FD)
        ops += [
            _vector(f"{prefix}_mlp_LayerNorm", (mlp_in,), None, mlp_in, LAYERNORM_OPS_PER_ELEMENT, q),
            _vector(f"{prefix}_mlp_Modulate", (mlp_in,), (2, dims.D_FU), mlp_in, MODULATE_OPS_PER_ELEMENT, q),
            _gemm(f"{prefix}_mlp_FC1", mlp_tokens, dims.D_FU, dims.H_FU, q),
            _vector(f"{prefix}_mlp_GELU", (hidden,), None, hidden, GELU_TANH_OPS_PER_ELEMENT, q, fuse_into=f"{prefix}_mlp_FC1"),
            _gemm(f"{prefix}_mlp_FC2", mlp_tokens, dims.D_FD, dims.H_FD, q),
            _vector(f"{prefix}_mlp_Gate_ResAdd", (mlp_out, mlp_out), (1, dims.H_FD), mlp_out, GATE_RESIDUAL_OPS_PER_ELEMENT, q),
        ]
    return ops
