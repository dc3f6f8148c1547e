"""Analytic per-strategy cost of one OpenSora STDiT3 block pair on n devices (inference forward).

Two sets of communication formulas, labelled:

* **layout** (``layout_collectives``, ``layout_bytes_by_kind``, ``layout_gemm_flops_per_device``):
  the collectives of the layout each strategy of ``tracing/strategies`` actually traces, term by
  term (kind, count, group, message); the traced dumps match them to the byte.
* **notes** (``comm_*``, ``note_communication_per_device``): the reference notes' formulas, which
  assume other layouts (Ulysses and ring over all n devices, every attention's K/V exchanged,
  2-D weights split over X).  docs/model.md says once why the two differ.

Sources of the notes' formulas:

* note 000, "Comparison of Parallelism Methods in ViT" (`reference/000_...`): the per-layer
  activation-memory formulas (TP, Megatron-SP, DS-Ulysses, Ring) and the per-attention
  communication of DS-Ulysses (8*alpha*b*s*h/n bytes) and Ring (K/V passed around the ring);
* note 004, "OpenSora Inference Summary" (`reference/004_...`): the STDiT3 GEMM count, Megatron's
  six all-reduces per block pair, the 2-D tensor-parallel all-gather / reduce-scatter volumes and
  the Ring-Attention volume for the spatial, temporal and cross attentions.

Symbols (as in the notes): B batch (2 with classifier-free guidance), T temporal and S spatial
tokens, N = T*S tokens per sample, h hidden size, a heads, TOKEN caption tokens per sample, n
devices, q bytes per element (2 for bf16), alpha = (n-1)/n. A "block" is one STDiT3 pair: a spatial
and a temporal block, each with a self-attention, a cross-attention and an MLP. Volumes are bytes
sent per device, with the ring algorithms the analyzer also uses (all-reduce 2*M*(n-1)/n,
all-gather / reduce-scatter M*(n-1)/n of the full tensor M, all-to-all M_local*(n-1)/n).

This module imports neither torch nor the analyzer; the ring volumes come from their one home,
``hardware.collectives.per_device_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware.collectives import per_device_bytes
from hlo_trace.errors import UsageError
from models.opensora.config import STDiT3Config
from models.opensora.inputs import geometry
from models.opensora.parallel import STRATEGIES as STRATEGY_TABLE
from models.opensora.parallel import UnknownStrategyError, default_mesh

__all__ = [
    "ACTIVATION_STRATEGIES",
    "NOTE_STRATEGIES",
    "BlockDims",
    "CollectiveTerm",
    "DeviceCountError",
    "UnknownStrategyError",
    "activation_per_device",
    "block_gemm_flops",
    "comm_dp",
    "comm_ds_ulysses",
    "comm_megatron",
    "comm_ring_attention",
    "comm_two_dimension",
    "comm_usp",
    "block_dims",
    "default_mesh",
    "flops_per_device",
    "layer_activation_bytes",
    "final_layer_collectives",
    "layout_bytes_by_kind",
    "layout_collectives",
    "layout_gemm_flops_per_device",
    "layout_switch_per_device",
    "note_communication_per_device",
]

# Strategies the reference notes give a communication formula for.
NOTE_STRATEGIES = ("megatron", "two_dimension", "ds_ulysses", "ring_attention", "usp", "dp")
# Strategies the activation-memory formulas of note 000 cover.
ACTIVATION_STRATEGIES = ("none", "megatron", "megatron_sp", "ds_ulysses", "ring_attention")


class DeviceCountError(UsageError):
    """A device count or mesh that the strategy cannot split the model over."""


@dataclass(frozen=True)
class BlockDims:
    """Sizes of one STDiT3 block pair; build it from a model config with `block_dims`."""

    T: int
    S: int
    batch: int
    hidden: int
    heads: int
    token: int
    mlp_ratio: int
    bytes_per_element: int = 2

    @property
    def N(self) -> int:
        return self.T * self.S

    @classmethod
    def of(cls, config: STDiT3Config, T: int, S: int, batch: int = 2,
           bytes_per_element: int = 2) -> BlockDims:
        """The block sizes of ``config`` (hidden, heads, TOKEN, MLP ratio) for T x S tokens."""
        return cls(T=T, S=S, batch=batch, hidden=config.hidden_size, heads=config.num_heads,
                   token=config.model_max_length, mlp_ratio=int(config.mlp_ratio),
                   bytes_per_element=bytes_per_element)


def block_dims(config: STDiT3Config, shape: str, batch: int = 2,
               bytes_per_element: int = 2) -> BlockDims:
    """The block sizes of ``config`` at video shape ``shape`` (F_W_H)."""
    geo = geometry(config, shape)
    return BlockDims.of(config, geo.T, geo.S, batch, bytes_per_element)


def _require_devices(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise DeviceCountError(f"device count {n!r}: expected a positive integer")


def _require_heads_divisible(dims: BlockDims, n: int, strategy: str) -> None:
    if dims.heads % n:
        raise DeviceCountError(
            f"{strategy} splits the {dims.heads} attention heads over {n} devices: expected a "
            f"device count that divides {dims.heads}")


def _alpha(n: int) -> float:
    return (n - 1) / n


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


def block_gemm_flops(dims: BlockDims) -> int:
    """GEMM FLOPs of one block pair (whole batch, no parallelism).

    Derivation (note 004, "Overall Computation", with the cross-attention written as OpenSora's
    flattened, block-diagonally masked attention): per spatial or temporal block, with r = B*N rows,
    qkv 6rh^2, proj 2rh^2, cross q 2rh^2, cross proj 2rh^2, fc1 and fc2 2*ratio*rh^2 each
    (= 28rh^2 at ratio 4); cross kv 4*B*TOKEN*h^2 on the caption rows; self-attention score and
    value 2*r*L*h each with L = S (spatial) or T (temporal); cross score and value
    2*(B*N)*(B*TOKEN)*h each. Summed over the pair::

        (2*(12 + 4*ratio))*B*N*h^2 + 8*B*TOKEN*h^2 + 4*B*N*h*(S+T) + 8*(B*N)*(B*TOKEN)*h

    Note 004 writes the cross score/value term per sample, 4*B*N*TOKEN*h (one TOKEN in its
    S+T+TOKEN bracket), and gets 8.86 T for 204_640_360; the flattened form computes B times
    that term, 9.32 T.
    """
    B, N, h, tok = dims.batch, dims.N, dims.hidden, dims.token
    dense = 2 * (12 + 4 * dims.mlp_ratio) * B * N * h * h
    return dense + 8 * B * tok * h * h + 4 * B * N * h * (dims.S + dims.T) + 8 * (B * N) * (B * tok) * h


def flops_per_device(strategy: str, dims: BlockDims, n: int,
                     mesh: tuple[int, int] | None = None) -> float:
    """GEMM FLOPs of one block pair per device: every strategy here divides all GEMMs evenly.

    Megatron and 2-D TP split the weight matrices (and so every GEMM) n ways; DS-Ulysses, Ring
    and USP split the sequence (projections) and the heads or the K/V blocks (attention); DP splits
    the batch (note 004's computation tables: every GEMM row ends in /N). Element-wise work is not
    included: note 004 stresses that under Megatron it is *not* split (norms, modulate, gate and
    residual run on the full (B, N, h) tensor on every device).
    """
    _check_strategy_and_mesh(strategy, dims, n, mesh)
    return block_gemm_flops(dims) / n


# --------------------------------------------------------------------------------------------
# Communication
# --------------------------------------------------------------------------------------------


def comm_megatron(dims: BlockDims, n: int) -> float:
    """Megatron 1-D tensor parallelism: bytes per device per block pair.

    Column-split qkv / q / kv / fc1, row-split proj / fc2: each row-split output is a partial sum
    that one all-reduce completes. One after the self-attention, the cross-attention and the MLP
    of each of the two blocks: 6 all-reduces of the (B, N, h) activation, M = q*B*N*h bytes, ring
    all-reduce 2*M*(n-1)/n each (note 004 "Overall Communication / Megatron")::

        6 * 2 * q*B*N*h * (n-1)/n   (= 24*B*T*S*h*(n-1)/n bytes in bf16)
    """
    _require_devices(n)
    _require_heads_divisible(dims, n, "megatron")
    M = dims.bytes_per_element * dims.batch * dims.N * dims.hidden
    return 6 * 2 * M * _alpha(n)


def comm_two_dimension(dims: BlockDims, nx: int, ny: int) -> float:
    """2-D tensor parallelism on an (nx, ny) mesh, n = nx*ny: bytes per device per block pair.

    Note 004 ("Two Dimension"): the input (B, N, M) is split b_x (batch on X) and m_y (features on
    Y); the first weight (M x H) is split m_x h_y and the second (H x M) h_y m_x. Per pair of
    linears M -> H -> M::

        all-gather input along Y:      q*B*N*M/n * (ny-1)
        all-gather weight 1 along X:   q*M*H/n  * (nx-1)
        all-gather weight 2 along X:   q*M*H/n  * (nx-1)
        reduce-scatter output along Y: q*B*N*M/n * (ny-1)
        total: 2*q*(B*N*M*(ny-1) + M*H*(nx-1)) / n

    Each of the two blocks has three such pairs, taken from the note as (M, H) = (h, h) for the
    self-attention and the cross-attention (QKV-O) and (h, ratio*h) for the MLP.
    """
    _require_devices(nx)
    _require_devices(ny)
    if dims.batch % nx:
        raise DeviceCountError(
            f"two_dimension splits the batch {dims.batch} over mesh X={nx}: expected X dividing it")
    _require_heads_divisible(dims, ny, "two_dimension (mesh Y)")
    n, q, B, N, h = nx * ny, dims.bytes_per_element, dims.batch, dims.N, dims.hidden

    def linear_pair(m: int, hid: int) -> float:
        return 2 * q * (B * N * m * (ny - 1) + m * hid * (nx - 1)) / n

    per_block = linear_pair(h, h) + linear_pair(h, h) + linear_pair(h, dims.mlp_ratio * h)
    return 2 * per_block


def comm_ds_ulysses(dims: BlockDims, n: int) -> float:
    """DeepSpeed-Ulysses: bytes per device per block pair.

    Note 000 ("Deepspeed-Ulysses"): the sequence is split; before attention, q, k, v go from
    sequence- to head-split with all-to-alls (6*alpha*b*s*h/n bytes), after it the output goes
    back (2*alpha*b*s*h/n): 8*alpha*b*s*h/n bytes, i.e. q*alpha/n bytes per element of each
    global (b, s, h) tensor moved. Per block pair (note 004 lists the Ulysses cross-attention with
    the caption also sequence-split)::

        self-attention  x2: q, k, v, out of B*N*h      -> 4*B*N*h
        cross-attention x2: q, out of B*N*h; k, v of B*TOKEN*h -> 2*B*N*h + 2*B*TOKEN*h
        total: (12*B*N*h + 4*B*TOKEN*h) * q*(n-1)/n^2

    The spatial <-> temporal change of the split sequence axis is extra; see
    `layout_switch_per_device`.
    """
    _require_devices(n)
    _require_heads_divisible(dims, n, "ds_ulysses")
    B, N, h, tok = dims.batch, dims.N, dims.hidden, dims.token
    elements = 12 * B * N * h + 4 * B * tok * h
    return elements * dims.bytes_per_element * (n - 1) / (n * n)


def comm_ring_attention(dims: BlockDims, n: int) -> float:
    """Ring attention: bytes per device per block pair.

    Note 004 ("Ring-Attention"): q, k, v are split along the sequence; each device passes its
    K and V blocks around the ring (n-1 steps, collective-permute), so it sends (n-1)/n of the
    global K and V. Self-attention: 2*B*N*h*(n-1)/n elements; cross-attention: 2*B*TOKEN*h*(n-1)/n.
    Two of each per block pair::

        2*B*(N + TOKEN)*h * (n-1)/n * q * 2

    The note adds that an all-to-all between the spatial and temporal blocks is needed to move the
    split axis (see `layout_switch_per_device`); it is not in this total.
    """
    _require_devices(n)
    B, N, h, tok = dims.batch, dims.N, dims.hidden, dims.token
    return 2 * B * (N + tok) * h * _alpha(n) * dims.bytes_per_element * 2


def comm_usp(dims: BlockDims, ulysses: int, ring: int) -> float:
    """Unified sequence parallelism (Ulysses x Ring), n = ulysses*ring: bytes per device per pair.

    Note 000 ("Unified Sequence Parallel"): the devices form a 2-D mesh, Ulysses all-to-alls run
    within groups of `ulysses` devices and ring K/V passing within groups of `ring`. Each device
    holds 1/n of a tensor, so an all-to-all inside a group of u sends (u-1)/u of it,
    q*E*(u-1)/(u*n) bytes for a global tensor of E elements; after it, K and V blocks of 1/n of
    the global tensors travel around the ring, (r-1) times each: q*E*(r-1)/n. Per block pair::

        all-to-all: (12*B*N*h + 4*B*TOKEN*h) * q*(u-1)/(u*n)     (as DS-Ulysses)
        ring:       (4*B*N*h + 4*B*TOKEN*h)  * q*(r-1)/n          (K and V, as Ring)

    ulysses = n gives `comm_ds_ulysses`, ring = n gives `comm_ring_attention`.
    """
    _require_devices(ulysses)
    _require_devices(ring)
    _require_heads_divisible(dims, ulysses, "usp (Ulysses group)")
    n, q = ulysses * ring, dims.bytes_per_element
    B, N, h, tok = dims.batch, dims.N, dims.hidden, dims.token
    all_to_all = (12 * B * N * h + 4 * B * tok * h) * q * (ulysses - 1) / (ulysses * n)
    ring_pass = (4 * B * N * h + 4 * B * tok * h) * q * (ring - 1) / n
    return all_to_all + ring_pass


def comm_dp(dims: BlockDims, n: int) -> float:
    """Data parallelism, inference: 0 bytes. Every device holds all weights and B/n samples; only
    training would all-reduce gradients (note 000's table: 12*O(h^2) per layer, backward only).
    Needs n to divide the batch (B = 2 under classifier-free guidance)."""
    _require_devices(n)
    if dims.batch % n:
        raise DeviceCountError(
            f"dp splits the batch {dims.batch} over {n} devices: expected a device count dividing it")
    return 0.0


def layout_switch_per_device(dims: BlockDims, n: int) -> float:
    """All-to-all that moves a sequence split between the spatial layout (S split) and the
    temporal layout (T split), twice per block pair (into the temporal block, back to the next
    spatial block): 2 * q*B*N*h*(n-1)/n^2 bytes. Note 004 mentions it for Ring-Attention."""
    _require_devices(n)
    return 2 * dims.bytes_per_element * dims.batch * dims.N * dims.hidden * (n - 1) / (n * n)


def _note_mesh(strategy: str, n: int) -> tuple[int, int] | None:
    """The notes' mesh for their 2-D formulas: (2, n/2). two_dimension: batch on X, hidden on Y;
    usp: ring on X, Ulysses on Y. 1-D formulas: None."""
    if strategy not in ("two_dimension", "usp"):
        return None
    if n % 2:
        raise DeviceCountError(f"{strategy} on {n} devices: expected an even count for a 2 x n/2 mesh")
    return (2, n // 2)


def _check_strategy_and_mesh(strategy: str, dims: BlockDims, n: int,
                             mesh: tuple[int, int] | None) -> tuple[int, int] | None:
    if strategy not in NOTE_STRATEGIES:
        raise UnknownStrategyError(
            f"no formula of the notes for strategy {strategy!r}: expected one of "
            f"{', '.join(NOTE_STRATEGIES)}")
    _require_devices(n)
    mesh = _note_mesh(strategy, n) if mesh is None else tuple(mesh)
    if mesh is not None and mesh[0] * mesh[1] != n:
        raise DeviceCountError(f"mesh {mesh[0]}x{mesh[1]} has {mesh[0] * mesh[1]} devices, not {n}")
    # The split conditions of each strategy, so that FLOPs and communication reject the same cases.
    if strategy in ("megatron", "ds_ulysses"):
        _require_heads_divisible(dims, n, strategy)
    elif strategy == "two_dimension":
        if dims.batch % mesh[0]:
            raise DeviceCountError(f"two_dimension splits the batch {dims.batch} over mesh "
                                   f"X={mesh[0]}: expected X dividing it")
        _require_heads_divisible(dims, mesh[1], "two_dimension (mesh Y)")
    elif strategy == "usp":
        _require_heads_divisible(dims, mesh[1], "usp (Ulysses group)")
    elif strategy == "dp" and dims.batch % n:
        raise DeviceCountError(
            f"dp splits the batch {dims.batch} over {n} devices: expected a device count dividing it")
    return mesh


def note_communication_per_device(strategy: str, dims: BlockDims, n: int,
                                  mesh: tuple[int, int] | None = None) -> float:
    """The reference notes' bytes per device for one block pair under `strategy` on n devices.

    `mesh` (X, Y) is used by two_dimension (X batch, Y hidden) and usp (X ring, Y Ulysses);
    it defaults to (2, n/2).
    """
    mesh = _check_strategy_and_mesh(strategy, dims, n, mesh)
    if strategy == "megatron":
        return comm_megatron(dims, n)
    if strategy == "two_dimension":
        return comm_two_dimension(dims, mesh[0], mesh[1])
    if strategy == "ds_ulysses":
        return comm_ds_ulysses(dims, n)
    if strategy == "ring_attention":
        return comm_ring_attention(dims, n)
    if strategy == "usp":
        return comm_usp(dims, ulysses=mesh[1], ring=mesh[0])
    return comm_dp(dims, n)


# --------------------------------------------------------------------------------------------
# The traced layouts
# --------------------------------------------------------------------------------------------

#: Bytes of one float32 LayerNorm statistic (mean or variance) per token.
F32_BYTES = 4
#: Self-attentions and cross-attentions per block pair.
ATTENTIONS_PER_PAIR = 2
#: Linear pairs (column-split, row-split) per block: self-attention, cross-attention, MLP.
LINEAR_PAIRS_PER_BLOCK = 3
#: LayerNorms per block whose statistics a hidden-split residual sums over y (norm1, norm2),
#: two statistics each (mean, variance).
HIDDEN_SPLIT_NORM_STATISTICS = 2 * 2
#: Times the official inference path computes each block LayerNorm: ``norm1(x)`` and ``norm2(x)``
#: under the timestep's modulation and again under the timestep-0 one (docs/gpu.md, "The official
#: inference path").
OFFICIAL_NORM_CALLS = 2


@dataclass(frozen=True)
class CollectiveTerm:
    """``count`` collectives of one kind per block pair, each over a group of ``group`` devices
    with message ``message_bytes`` (as `hardware.collectives.per_device_bytes` takes it: the full
    tensor for all-reduce, all-gather and reduce-scatter, the device's buffer for all-to-all,
    the block sent for collective-permute)."""

    kind: str
    count: int
    group: int
    message_bytes: float
    what: str

    @property
    def bytes_per_device(self) -> float:
        return self.count * per_device_bytes(self.kind, self.group, self.message_bytes)


def usp_degrees(y_devices: int, ring: int | None = None,
                ulysses: int | None = None) -> tuple[int, int]:
    """(ring, ulysses) over mesh axis y: given one, the other is y / it; given none, ring = 2
    when y is even (else y).  A DeviceCountError when they do not multiply to y."""
    if ring is None and ulysses is None:
        ring = 2 if y_devices % 2 == 0 else y_devices
    if ring is None:
        ring = y_devices // ulysses if ulysses and y_devices % ulysses == 0 else 0
    if ulysses is None:
        ulysses = y_devices // ring if ring and y_devices % ring == 0 else 0
    if ring < 1 or ulysses < 1 or ring * ulysses != y_devices:
        raise DeviceCountError(
            f"usp: ring degree x Ulysses degree must equal the {y_devices} devices of mesh axis "
            f"y (got ring {ring or '?'} x ulysses {ulysses or '?'})")
    return ring, ulysses


def layout_collectives(strategy: str, dims: BlockDims, mesh: tuple[int, int],
                       ring: int | None = None, ulysses: int | None = None,
                       official: bool = False) -> tuple[CollectiveTerm, ...]:
    """The collectives of one block pair of the layout ``tracing/strategies`` traces
    (``official``: on the official inference path, ``trace-stage --path official``).

    With q bytes per element, A = q*B*N*h the bytes of the whole (B, N, h) activation, mesh
    (X, Y), n = X*Y, C = q*B*TOKEN*h the bytes of one caption K or V:

    * megatron (1-D over n): 6 all-reduces of A (one after each attention and MLP);
    * megatron_sp: 6 all-gathers of A/X over Y (before qkv, cross q, fc1) and 6 reduce-scatters
      of A/X over Y (after proj, cross proj, fc2);
    * two_dimension: the same 6 + 6, plus 8 all-reduces over Y of the float32 LayerNorm
      statistics, 4*B*N/X bytes each (mean and variance of norm1 and norm2 of both blocks); 16 on
      the official path, which computes each of those LayerNorms twice
      (:data:`OFFICIAL_NORM_CALLS`: once under the timestep's modulation, once under t0's);
    * ds_ulysses: 8 all-to-alls over Y of A/n (q, k, v and the output of the split
      self-attention; q and the output of both cross-attentions);
    * ring_attention: 2*(Y-1) collective-permutes of A/n (K and V of the split self-attention
      around the ring) and 4 all-gathers of C over Y (caption K and V of both cross-attentions);
    * usp (Y = ring x ulysses): 8 all-to-alls over ulysses of A/n, 2*(ring-1)
      collective-permutes of A/n and 4 all-gathers over ring of C/ulysses (caption K and V of
      the local heads);
    * opensora_sp (OpenSora v1.2's sequence parallelism, S over Y): in the spatial block only,
      1 all-to-all over Y of 3*A/n (the fused qkv) and 3 of A/n (the attention output, the
      cross-attention queries and output); the temporal block is local;
    * none, dp: nothing.
    """
    if strategy not in STRATEGY_TABLE:
        raise UnknownStrategyError(
            f"unknown strategy {strategy!r}: expected one of {', '.join(STRATEGY_TABLE)}")
    x_devices, y_devices = mesh
    n, q = x_devices * y_devices, dims.bytes_per_element
    activation = q * dims.batch * dims.N * dims.hidden
    local = activation / n
    if strategy == "megatron":
        return (CollectiveTerm("all_reduce", 6, n, activation, "after proj, cross proj, fc2"),)
    if strategy in ("megatron_sp", "two_dimension"):
        group_share = activation / x_devices
        terms = (CollectiveTerm("all_gather", 2 * LINEAR_PAIRS_PER_BLOCK, y_devices, group_share,
                                "before qkv, cross q, fc1"),
                 CollectiveTerm("reduce_scatter", 2 * LINEAR_PAIRS_PER_BLOCK, y_devices,
                                group_share, "after proj, cross proj, fc2"))
        if strategy == "two_dimension":
            stats = F32_BYTES * dims.batch * dims.N / x_devices
            calls = OFFICIAL_NORM_CALLS if official else 1
            terms += (CollectiveTerm("all_reduce", 2 * HIDDEN_SPLIT_NORM_STATISTICS * calls, y_devices,
                                     stats, "LayerNorm mean and variance over the split hidden"),)
        return terms
    if strategy == "ds_ulysses":
        return (CollectiveTerm("all_to_all", 8, y_devices, local,
                               "q, k, v, out of the split attention; q, out of 2 cross"),)
    if strategy == "opensora_sp":
        if dims.S % y_devices or dims.heads % y_devices:
            raise DeviceCountError(
                f"opensora_sp splits the spatial tokens S = {dims.S} and the {dims.heads} heads "
                f"over mesh Y = {y_devices}: expected Y dividing both")
        return (CollectiveTerm("all_to_all", 1, y_devices, 3 * local, "spatial fused qkv"),
                CollectiveTerm("all_to_all", 3, y_devices, local,
                               "spatial attention out; spatial cross q, out"))
    if strategy == "ring_attention":
        caption = q * dims.batch * dims.token * dims.hidden
        return (CollectiveTerm("collective_permute", 2 * (y_devices - 1), y_devices,
                               local, "K, V around the ring"),
                CollectiveTerm("all_gather", 2 * ATTENTIONS_PER_PAIR, y_devices, caption,
                               "caption K, V of 2 cross-attentions"))
    if strategy == "usp":
        ring, ulysses = usp_degrees(y_devices, ring, ulysses)
        caption = q * dims.batch * dims.token * dims.hidden
        return (CollectiveTerm("all_to_all", 8, ulysses, local,
                               "q, k, v, out of the split attention; q, out of 2 cross"),
                CollectiveTerm("collective_permute", 2 * (ring - 1), ring, local,
                               "K, V around the ring"),
                CollectiveTerm("all_gather", 2 * ATTENTIONS_PER_PAIR, ring, caption / ulysses,
                               "caption K, V (local heads) of 2 cross-attentions"))
    return ()


#: The strategies whose residual stream is split on tokens over y (ds_ulysses' layout).
TOKEN_SPLIT_STRATEGIES = ("megatron_sp", "ds_ulysses", "ring_attention", "usp", "opensora_sp")


def final_layer_collectives(strategy: str, dims: BlockDims, mesh: tuple[int, int],
                            out_features: int) -> tuple[CollectiveTerm, ...]:
    """Collectives of the final layer (once per model, in the last stage): a token-split layout
    that splits S (space-major tokens: y does not divide T) all-gathers the final linear's
    output, q*(B/X)*N*out_features bytes, over y, because the unpatchified video splits H*W
    rows that are no tile of its (H, W) axes.  With T split the video stays split on T.
    opensora_sp gathers the final layer's input instead, q*(B/X)*N*h bytes over y, as OpenSora
    does."""
    x_devices, y_devices = mesh
    if strategy == "opensora_sp":  # OpenSora gathers x (hidden h) before its final layer
        gathered = dims.bytes_per_element * dims.batch * dims.N * dims.hidden / x_devices
        return (CollectiveTerm("all_gather", 1, y_devices, gathered, "final layer input, S split"),)
    if strategy not in TOKEN_SPLIT_STRATEGIES or dims.T % y_devices == 0:
        return ()
    out = dims.bytes_per_element * dims.batch * dims.N * out_features / x_devices
    return (CollectiveTerm("all_gather", 1, y_devices, out, "final linear output, S split"),)


def layout_bytes_by_kind(strategy: str, dims: BlockDims, mesh: tuple[int, int],
                         ring: int | None = None, ulysses: int | None = None,
                         official: bool = False) -> dict[str, float]:
    """Bytes per device per block pair of the traced layout, by collective kind."""
    sums: dict[str, float] = {}
    for term in layout_collectives(strategy, dims, mesh, ring, ulysses, official):
        sums[term.kind] = sums.get(term.kind, 0.0) + term.bytes_per_device
    return sums


def caption_projection_split(strategy: str, mesh: tuple[int, int]) -> int:
    """Over how many devices a layout splits the caption K/V projection (the rest repeat it):
    megatron all n (kv column-split); the batch_x layouts only y (each batch group on x
    projects every caption, as the flattened cross-attention needs all of them); dp and none 1;
    opensora_sp 1 (OpenSora projects the captions for all heads on every device)."""
    x_devices, y_devices = mesh
    if strategy == "megatron":
        return x_devices * y_devices
    if strategy in ("dp", "none", "opensora_sp"):
        return 1
    return y_devices


def layout_gemm_flops_per_device(strategy: str, dims: BlockDims, mesh: tuple[int, int],
                                 ring: int | None = None, ulysses: int | None = None) -> float:
    """GEMM FLOPs of one block pair per device of the traced layout: the model's count / n plus
    the caption K/V projection (4*B*TOKEN*h^2 per block) that the devices outside its split
    repeat: 2 * 4*B*TOKEN*h^2 * (1/split - 1/n)."""
    n = mesh[0] * mesh[1]
    split = caption_projection_split(strategy, mesh)
    caption = ATTENTIONS_PER_PAIR * 4 * dims.batch * dims.token * dims.hidden ** 2
    return block_gemm_flops(dims) / n + caption * (1 / split - 1 / n)


# --------------------------------------------------------------------------------------------
# Activation memory
# --------------------------------------------------------------------------------------------


def layer_activation_bytes(strategy: str, b: int, s: int, h: int, a: int, n: int) -> float:
    """Activation bytes per device of one standard transformer layer (attention + MLP), 16-bit
    values and 1-byte dropout masks, as note 000 ("Activation Memory") counts them.

    Unsplit: attention 11bsh + 5bs^2a (QKV input 2bsh, Q and K 4bsh, softmax input 2bs^2a, its
    dropout mask bs^2a, dropout output 2bs^2a and V 2bsh, O input 2bsh, O dropout mask bsh), MLP
    18bsh, two LayerNorm inputs 4bsh: bsh*(34 + 5as/h).

    * `none`: bsh*(34 + 5as/h)
    * `megatron` (TP): the two LayerNorm inputs, the QKV and fc1 inputs and the two dropout masks
      (10bsh) stay whole: bsh*(10 + 24/n + 5as/(hn))
    * `megatron_sp`: the sequence split covers those too: bsh/n*(34 + 5as/h)
    * `ds_ulysses`, `ring_attention`: per the note, the linear-layer activations split n ways but
      the attention score terms do not: bsh*(34/n + 5as/h). (The note's statement; with heads
      split, a Ulysses device would in fact hold only a/n heads of scores.)
    """
    if strategy not in ACTIVATION_STRATEGIES:
        raise UnknownStrategyError(
            f"unknown strategy {strategy!r} for activation memory: expected one of "
            f"{', '.join(ACTIVATION_STRATEGIES)}")
    _require_devices(n)
    bsh, score_ratio = b * s * h, a * s / h
    if strategy == "none":
        return bsh * (34 + 5 * score_ratio)
    if strategy == "megatron":
        return bsh * (10 + 24 / n + 5 * score_ratio / n)
    if strategy == "megatron_sp":
        return bsh / n * (34 + 5 * score_ratio)
    return bsh * (34 / n + 5 * score_ratio)


def _cross_attention_activation_bytes(strategy: str, dims: BlockDims, n: int) -> float:
    """One cross-attention, counted the way note 000 counts self-attention, with queries from the
    B*N video tokens and keys from the B*TOKEN caption tokens of the flattened sequence:
    q-linear input 2BNh, kv-linear input 2B*TOKEN*h, Q 2BNh, K 2B*TOKEN*h, V 2B*TOKEN*h,
    O input 2BNh, O dropout mask BNh, score terms 5*a*(B*N)*(B*TOKEN). The split rules of
    `layer_activation_bytes` apply: TP keeps the two linear inputs and the mask whole."""
    B, N, h, tok, a = dims.batch, dims.N, dims.hidden, dims.token, dims.heads
    video, caption = B * N * h, B * tok * h
    scores = 5 * a * (B * N) * (B * tok)
    linear = 7 * video + 6 * caption
    if strategy == "none":
        return linear + scores
    if strategy == "megatron":
        whole = 3 * video + 2 * caption
        return whole + (linear - whole + scores) / n
    if strategy == "megatron_sp":
        return (linear + scores) / n
    return linear / n + scores


def activation_per_device(strategy: str, dims: BlockDims, n: int) -> float:
    """Activation bytes per device of one block pair: the spatial block as a transformer layer
    with b = B*T, s = S, the temporal block with b = B*S, s = T (note 000's formula for each),
    plus two cross-attentions (`_cross_attention_activation_bytes`). Strategies:
    `none`, `megatron`, `megatron_sp`, `ds_ulysses`, `ring_attention`."""
    if strategy in ("megatron", "megatron_sp", "ds_ulysses"):  # these split the heads
        _require_devices(n)
        _require_heads_divisible(dims, n, strategy)
    B, T, S, h, a = dims.batch, dims.T, dims.S, dims.hidden, dims.heads
    spatial = layer_activation_bytes(strategy, B * T, S, h, a, n)
    temporal = layer_activation_bytes(strategy, B * S, T, h, a, n)
    return spatial + temporal + 2 * _cross_attention_activation_bytes(strategy, dims, n)
