"""Analytic cost of one training step of STDiT3 block pairs: persistent memory per device and the
collectives of the traced layout (``trace-stage --mode train``, ``tracing/training.py``), beside
the reference notes' training table (note 000, "Comparison of Different Parallelism in Training").

Symbols as in ``models.opensora.theory``; in addition P, G and OS are the bytes per device of the
parameters, gradients and optimizer states, D the data-parallel degree of a buffer (the devices
over which its strategy replicates it), q the bytes per element of the model (2 for bf16).

Persistent buffers (per parameter: q weight + q gradient + optimizer state of 4 (fp32 master,
only when q < 4) + 4 + 4 (AdamW moments)). Each parameter of a block is split by its strategy
(``parameter_splits``) and, under ZeRO, over the remaining devices on its first dimension that
they divide (``zero``: 1 optimizer states, 2 + gradients, 3 + parameters).

The collectives of the step (``layout_training_collectives``), per block pair, phase
(forward / backward / optimizer) and traffic (param_grad / activation), for the layouts whose
backward is derived term by term here:

* ``dp`` (batch over all n devices): every block parameter's gradient is summed over n: an
  all-reduce (zero 0, 1) or a reduce-scatter (zero 2, 3) of each. Each device holds and
  projects only its own samples' captions; the flattened cross-attention needs every caption's
  K and V, so the forward all-gathers them and the backward reduce-scatters their gradients
  (2 all-gathers and 2 reduce-scatters of B*TOKEN*h*q bytes per block, activation traffic: the
  bytes of the 2 all-reduces that summing the K/V gradients of a replicated caption projection
  would need, without repeating that projection on every device). zero >= 1
  all-gathers every updated parameter (optimizer); zero 3 all-gathers every parameter before the
  forward and, in the backward, again each weight that autograd saved (every ``*.weight``:
  16h^2 + 2*hd per block; not the biases and the scale-shift table, which no backward reads).
  A parameter with no dimension that n divides (hd = 72 over 16 devices: the q/k norm weights)
  stays replicated: its gradient is all-reduced, nothing is gathered;
* ``megatron`` (1-D tensor parallel over n): forward the 6 all-reduces of A of the inference
  layout; backward 6 all-reduces of A (the input gradients of qkv, cross q and fc1) and 2 of the
  caption gradient (the kv projection's input gradient, q*B*TOKEN*h); the q/k RMSNorm weights
  (replicated, head-dim sized) get their gradients summed over the heads: 4 all-reduces of q*hd;
* ``ds_ulysses``, ``ring_attention``, ``usp`` (batch on x, the sequence on y; ZeRO 0, usp also
  ZeRO-1): the forward's exchanges (``theory.layout_collectives``) and the same again in the
  backward (all-to-alls; for each K/V rotation 2 collective-permutes of the block's gradient and
  1 of its bool mask); per block the modulation gradient (6 chunks of (B/x, h) per modulation,
  2 on the official path) summed over y, the caption K/V gradients of the local heads over the
  devices that use them (x; x*y for ring_attention, whose captions are gathered; x*ring for
  usp), the caption gradient over the heads (ds_ulysses: over y; usp: over ulysses, then its
  ring slices gathered); weight gradients over y then x (2 all-reduces), but the scale-shift
  table over x only, the local attention's self-attention parameters over all n in one (ring,
  usp: batch and tokens merged on one split axis), and the kv projection by its layout
  (ds_ulysses: the local heads' rows gathered over y; ring_attention: caption slices summed
  over y; usp: summed over ring, gathered over ulysses).

``path`` "official" (the default of ``trace-stage``): each block modulates twice (t and t0), so
the table's gradient and the modulation partial sums are reduced twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hlo_trace.errors import UsageError
from models.opensora.config import STDiT3Config
from models.opensora.theory import BlockDims, CollectiveTerm, layout_collectives, usp_degrees

__all__ = ["NOTES_TRAINING_TABLE", "ActivationTerm", "TrainingTerm", "block_parameters",
           "layout_training_activations", "layout_training_collectives", "parameter_splits",
           "training_buffer_bytes"]

#: Bytes per parameter of the AdamW moments (two fp32 tensors) and of an fp32 master copy.
MOMENT_BYTES = 8
MASTER_BYTES = 4

#: Linears of a block by how Megatron splits them (nn.Linear weight = (out, in)).
_COLUMN = ("attn.qkv", "cross_attn.q_linear", "cross_attn.kv_linear", "mlp.fc1")
_ROW = ("attn.proj", "cross_attn.proj", "mlp.fc2")


class TrainingTheoryError(UsageError):
    """A strategy or ZeRO stage without a training formula here."""


def block_parameters(config: STDiT3Config) -> dict[str, tuple[int, ...]]:
    """Parameters of one STDiT3 block (spatial or temporal: the same), name -> shape."""
    h, m = config.hidden_size, int(config.hidden_size * config.mlp_ratio)
    hd = h // config.num_heads
    params: dict[str, tuple[int, ...]] = {"scale_shift_table": (6, h)}
    for name, out_features, in_features in (
            ("attn.qkv", 3 * h, h), ("attn.proj", h, h), ("cross_attn.q_linear", h, h),
            ("cross_attn.kv_linear", 2 * h, h), ("cross_attn.proj", h, h),
            ("mlp.fc1", m, h), ("mlp.fc2", h, m)):
        params[f"{name}.weight"] = (out_features, in_features)
        params[f"{name}.bias"] = (out_features,)
    params["attn.q_norm.weight"] = (hd,)
    params["attn.k_norm.weight"] = (hd,)
    return params


def parameter_splits(strategy: str, name: str, shape: tuple[int, ...],
                     mesh: tuple[int, int]) -> tuple[int, ...]:
    """Parts each dimension of a block parameter is split into by ``strategy`` (1: whole)."""
    x_devices, y_devices = mesh
    tp = {"megatron": x_devices * y_devices, "megatron_sp": y_devices,
          "two_dimension": y_devices}.get(strategy, 1)
    module, _, kind = name.rpartition(".")
    if tp > 1 and module in _COLUMN:
        return (tp,) + (1,) * (len(shape) - 1)
    if tp > 1 and module in _ROW and kind == "weight":
        return (1, tp)
    return (1,) * len(shape)


def _zero_splits(shape: tuple[int, ...], splits: tuple[int, ...], data: int) -> tuple[int, ...]:
    """``splits`` with the data-parallel degree added on the first whole dimension it divides."""
    if data == 1:
        return splits
    for dim, (size, parts) in enumerate(zip(shape, splits)):
        if parts == 1 and size % data == 0:
            return splits[:dim] + (data,) + splits[dim + 1:]
    return splits


def training_buffer_bytes(strategy: str, config: STDiT3Config, mesh: tuple[int, int], zero: int,
                          bytes_per_element: int = 2, pairs: int = 1) -> dict[str, int]:
    """P, G and OS bytes per device of ``pairs`` block pairs (two blocks each)."""
    if zero not in (0, 1, 2, 3):
        raise TrainingTheoryError(f"zero {zero}: expected 0, 1, 2 or 3")
    n = mesh[0] * mesh[1]
    state_bytes = MOMENT_BYTES + (MASTER_BYTES if bytes_per_element < 4 else 0)
    totals = {"param": 0, "grad": 0, "optimizer_state": 0}
    for name, shape in block_parameters(config).items():
        splits = parameter_splits(strategy, name, shape, mesh)
        tp = math.prod(splits)
        sharded = _zero_splits(shape, splits, n // tp)
        whole, zeroed = math.prod(shape) // tp, math.prod(shape) // math.prod(sharded)
        totals["param"] += (zeroed if zero >= 3 else whole) * bytes_per_element
        totals["grad"] += (zeroed if zero >= 2 else whole) * bytes_per_element
        totals["optimizer_state"] += (zeroed if zero >= 1 else whole) * state_bytes
    return {key: value * 2 * pairs for key, value in totals.items()}


@dataclass(frozen=True)
class TrainingTerm(CollectiveTerm):
    """A ``CollectiveTerm`` of the training step: in one ``phase`` (forward, backward,
    optimizer), moving ``traffic`` (param_grad or activation)."""

    phase: str = "forward"
    traffic: str = "activation"


def _require_path(path: str) -> None:
    if path not in ("official", "clean"):
        raise TrainingTheoryError(f"path {path!r}: expected official or clean")


def _term(phase: str, traffic: str, kind: str, count: int, group: int, message_bytes: float,
          what: str) -> TrainingTerm:
    return TrainingTerm(kind, count, group, message_bytes, what, phase=phase, traffic=traffic)


def layout_training_collectives(strategy: str, config: STDiT3Config, dims: BlockDims,
                                mesh: tuple[int, int], zero: int = 0,
                                recompute: bool = False,
                                path: str = "official") -> tuple[TrainingTerm, ...]:
    """The collectives of one block pair's training step in the traced layout (module
    docstring); dp with ZeRO 0-3, megatron (ZeRO 0: every weight is split, nothing is
    replicated but the norm weights, biases and tables, which ZeRO would shard), ds_ulysses,
    ring_attention (ZeRO 0) and usp (ZeRO 0, 1); ``path`` as ``--path``. With
    ``recompute`` (``--recompute full``) the backward runs each block's forward again, with its
    collectives (megatron: 6 all-reduces of A more; dp: none; ds_ulysses, ring_attention and
    usp, ZeRO 0-2: every forward activation collective once more in the backward; megatron_sp
    has no formula)."""
    _require_path(path)
    n, q = mesh[0] * mesh[1], dims.bytes_per_element
    h = dims.hidden
    hd = h // dims.heads
    params = block_parameters(config)
    caption = q * dims.batch * dims.token * h
    if strategy == "dp":
        def sharded(shape: tuple[int, ...]) -> bool:  # ZeRO finds a dimension n divides
            return _zero_splits(shape, (1,) * len(shape), n) != (1,) * len(shape)

        terms = []
        for name, shape in params.items():
            kind = "reduce_scatter" if zero >= 2 and sharded(shape) else "all_reduce"
            twice = name == "scale_shift_table" and path == "official"  # for t and t0
            terms.append(_term("backward", "param_grad", kind, 4 if twice else 2, n,
                               q * math.prod(shape), f"gradient of {name}"
                               + (" (per modulation)" if twice else "")))
        terms += [_term("forward", "activation", "all_gather", 4, n, caption,
                        "caption K and V of 2 cross-attentions (each device projects its own)"),
                  _term("backward", "activation", "reduce_scatter", 4, n, caption,
                        "their gradients, back to the devices that projected them")]
        if zero >= 1:
            terms += [_term("optimizer" if zero < 3 else "forward", "param_grad", "all_gather",
                            2, n, q * math.prod(shape),
                            f"{name} (updated)" if zero < 3 else f"{name} before use")
                      for name, shape in params.items() if sharded(shape)]
        if zero >= 3:
            terms += [_term("backward", "param_grad", "all_gather", 2, n,
                            q * math.prod(shape), f"{name} again for the backward")
                      for name, shape in params.items()
                      if name.endswith("weight") and sharded(shape)]
        return tuple(terms)
    if strategy == "megatron":
        if zero:
            raise TrainingTheoryError("megatron splits every weight over all devices: no ZeRO "
                                      "formula (the replicated biases would be sharded)")
        activation = q * dims.batch * dims.N * h
        return (_term("forward", "activation", "all_reduce", 6, n, activation,
                             "after proj, cross proj, fc2"),
                _term("backward", "activation", "all_reduce", 6 * (2 if recompute else 1), n,
                      activation, "input gradients of qkv, cross q, fc1 (and the recomputed "
                      "forward's sums)"),
                _term("backward", "activation", "all_reduce", 2, n, caption,
                             "caption gradient of the kv projections"),
                _term("backward", "param_grad", "all_reduce", 4, n, q * hd,
                             "q and k RMSNorm weight gradients"))
    if strategy == "megatron_sp":
        if recompute:
            raise TrainingTheoryError("megatron_sp --recompute full: no formula (GSPMD merges the "
                                      "recomputed forward's gathers and scatters with the backward's)")
        return _megatron_sp_collectives(config, dims, mesh, zero, path)
    if strategy in _SEQUENCE_PARALLEL:
        terms = _sequence_parallel_collectives(strategy, config, dims, mesh, zero, path)
        if not recompute:
            return terms
        if zero >= 3:
            raise TrainingTheoryError(f"{strategy} --zero 3 --recompute full: no formula (the "
                                      "recomputed forward's parameter gathers are not derived)")
        # the backward runs each block's forward again, with its activation collectives
        return terms + tuple(replace(term, phase="backward", what=f"recomputed forward: {term.what}")
                             for term in terms if term.phase == "forward" and term.traffic == "activation")
    raise TrainingTheoryError(f"no training-step layout formula for {strategy!r} here: dp, "
                              "megatron, ds_ulysses, ring_attention, usp")


def _megatron_sp_collectives(config: STDiT3Config, dims: BlockDims, mesh: tuple[int, int],
                             zero: int, path: str) -> tuple[TrainingTerm, ...]:
    """Megatron-SP (tensor parallel over y with the tokens split between the linears, batch on
    x), ZeRO 0, per block pair: the forward's 6 all-gathers and 6 reduce-scatters over y
    (``theory.layout_collectives``), their transposes in the backward (6 reduce-scatters and 6
    all-gathers of the same tensors), per block the modulation gradient summed over the token
    split (y), the caption K/V gradients of the local heads over x and the caption gradient over
    y; weight gradients: the split linears' (weights, and the column-parallel biases) over x, the
    kv projection's none (every x row holds every caption: its K/V gradient is summed already),
    the replicated q/k norm weights and row-parallel biases over y then x, but the spatial
    block's attention output bias in one over all n (its (B*T, S, h) gradient has the batch and
    the frames on one axis split over x and y), the table over x per modulation."""
    if zero:
        raise TrainingTheoryError("megatron_sp --zero: no formula here (ZeRO 0)")
    x_devices, y_devices = mesh
    n, q, h = x_devices * y_devices, dims.bytes_per_element, dims.hidden
    captions = q * dims.batch * dims.token * h
    modulations = 2 if path == "official" else 1
    terms: list[TrainingTerm] = []

    def add(phase: str, traffic: str, kind: str, count: int, group: int, message: float,
            what: str) -> None:
        if group > 1 and count:
            terms.append(_term(phase, traffic, kind, count, group, message, what))

    for term in layout_collectives("megatron_sp", dims, mesh):
        add("forward", "activation", term.kind, term.count, term.group, term.message_bytes,
            term.what)
        add("backward", "activation",
            "reduce_scatter" if term.kind == "all_gather" else "all_gather", term.count,
            term.group, term.message_bytes, f"transposes of: {term.what}")
    add("backward", "activation", "all_reduce", 2 * 6 * modulations, y_devices,
        q * dims.batch // x_devices * h, "modulation gradients summed over the token split")
    add("backward", "activation", "all_reduce", 4, x_devices, captions // y_devices,
        "caption K and V gradients of the local heads, over the batch split")
    add("backward", "activation", "all_reduce", 2, y_devices, captions,
        "caption gradient: partial over the heads")
    for name, shape in block_parameters(config).items():
        size = q * math.prod(shape)
        splits = math.prod(parameter_splits("megatron_sp", name, shape, mesh))
        if name == "scale_shift_table":
            add("backward", "param_grad", "all_reduce", 2 * modulations, x_devices, size,
                "gradient of the scale-shift table (per modulation)")
        elif name in _CAPTION_KV:
            continue
        elif splits > 1:
            add("backward", "param_grad", "all_reduce", 2, x_devices, size / splits,
                f"gradient of {name} (the local part) over x")
        else:
            once = int(name == "attn.proj.bias")  # the spatial block's
            add("backward", "param_grad", "all_reduce", once, n, size,
                f"gradient of {name}, the spatial block's: over all devices")
            add("backward", "param_grad", "all_reduce", 2 - once, y_devices, size,
                f"gradient of {name} over y")
            add("backward", "param_grad", "all_reduce", 2 - once, x_devices, size,
                f"gradient of {name} over x")
    return tuple(terms)


_SEQUENCE_PARALLEL = ("ds_ulysses", "ring_attention", "usp")
#: The self-attention's parameters of a block (the rest: cross-attention, MLP, table).
_SELF_ATTENTION = ("attn.qkv.weight", "attn.qkv.bias", "attn.q_norm.weight", "attn.k_norm.weight",
                   "attn.proj.weight", "attn.proj.bias")
_CAPTION_KV = ("cross_attn.kv_linear.weight", "cross_attn.kv_linear.bias")


def _sequence_parallel_collectives(strategy: str, config: STDiT3Config, dims: BlockDims,
                                   mesh: tuple[int, int], zero: int,
                                   path: str) -> tuple[TrainingTerm, ...]:
    """ds_ulysses, ring_attention, usp (batch on x, the sequence on y; usp: y = ring x
    ulysses), per block pair; see ``layout_training_collectives``."""
    if zero and strategy != "usp":
        raise TrainingTheoryError(f"{strategy} --zero {zero}: the sequence-parallel formula "
                                  "covers ZeRO for usp only (the notes' USP + ZeRO rows)")
    x_devices, y_devices = mesh
    n, q, h = x_devices * y_devices, dims.bytes_per_element, dims.hidden
    ring, ulysses = ((1, y_devices) if strategy == "ds_ulysses" else
                     (y_devices, 1) if strategy == "ring_attention" else usp_degrees(y_devices))
    params = block_parameters(config)
    captions = q * dims.batch * dims.token * h  # every caption's K (or V, or y), all heads

    def sharded(shape: tuple[int, ...]) -> bool:  # ZeRO finds a dimension n divides
        return _zero_splits(shape, (1,) * len(shape), n) != (1,) * len(shape)

    modulations = 2 if path == "official" else 1  # t (and t0 on the official path)
    terms: list[TrainingTerm] = []

    def add(phase: str, traffic: str, kind: str, count: int, group: int, message: float,
            what: str) -> None:
        if group > 1 and count:
            terms.append(_term(phase, traffic, kind, count, group, message, what))

    # Forward: the inference layout; the backward exchanges the same (the pins reshard in
    # reverse): the all-to-alls once more; each K/V rotation's gradient goes back around the
    # ring, GSPMD partitioning the transposed cat (two slices, one zero-padded) into 2
    # collective-permutes of the block and 1 of its bool mask (1 byte per element).
    for term in layout_collectives(strategy, dims, mesh, ring if strategy == "usp" else None,
                                   ulysses if strategy == "usp" else None):
        add("forward", "activation", term.kind, term.count, term.group, term.message_bytes,
            term.what)
        if term.kind == "all_to_all":
            add("backward", "activation", "all_to_all", term.count, term.group,
                term.message_bytes, term.what + " (their gradients)")
        if term.kind == "collective_permute":
            add("backward", "activation", "collective_permute", 2 * term.count, term.group,
                term.message_bytes, "gradients of the rotated K/V blocks, back around the ring")
            add("backward", "activation", "collective_permute", term.count, term.group,
                term.message_bytes / q, "the bool masks of those rotations")
    # Backward, activation traffic, per block: the modulation gradient (6 chunks of (B/x, h)
    # per modulation) summed over the tokens, partial over y; the caption K and V gradients of
    # the local heads summed over the devices that used them; the caption gradient.
    add("backward", "activation", "all_reduce", 2 * 6 * modulations, y_devices,
        q * dims.batch // x_devices * h, "modulation gradients summed over the token split")
    kv_group = {"ds_ulysses": x_devices, "ring_attention": n, "usp": x_devices * ring}[strategy]
    add("backward", "activation", "all_reduce", 4, kv_group, captions // ulysses,
        "caption K and V gradients of the local heads (both x rows hold every caption)")
    if strategy == "ds_ulysses":
        add("backward", "activation", "all_reduce", 2, y_devices, captions,
            "caption gradient: partial over the heads")
    if strategy == "usp":
        add("backward", "activation", "all_reduce", 2, ulysses, captions / ring,
            "caption gradient of the ring rank's rows: partial over the heads")
        add("backward", "activation", "all_gather", 2, ring, captions,
            "the caption gradient's ring slices gathered")
    # Backward, parameter gradients, per block: the table over x (its modulation gradients are
    # summed over y already), once per modulation; the caption K/V projection: ds_ulysses
    # gathers the local heads' rows over y; ring_attention sums the 1/y caption slices' partial
    # products over y; usp both (sum over ring, gather over ulysses); the self-attention's
    # parameters of the block whose attention is local: one sum over all n where its batch and
    # tokens are merged into one split axis (ring_attention, usp), else (ds_ulysses keeps the
    # batch apart, the split attention) over y, then x; every other parameter over y, then x.
    for name, shape in params.items():
        size = q * math.prod(shape)
        if name == "scale_shift_table":
            add("backward", "param_grad", "all_reduce", 2 * modulations, x_devices, size,
                "gradient of the scale-shift table (per modulation)")
        elif name in _CAPTION_KV:
            add("backward", "param_grad", "all_reduce", 2, ring, size / ulysses,
                f"gradient of {name}: the caption slices' partial products")
            add("backward", "param_grad", "all_gather", 2, ulysses, size,
                f"gradient of {name}: the local heads' rows gathered")
        else:  # one block of the pair (ring_attention, usp: the local attention's) merged
            merged = int(name in _SELF_ATTENTION and strategy != "ds_ulysses")
            add("backward", "param_grad",
                "reduce_scatter" if zero >= 2 and sharded(shape) else "all_reduce", merged, n,
                size, f"gradient of {name}, the local attention's block: over all devices")
            add("backward", "param_grad", "all_reduce", 2 - merged, y_devices, size,
                f"gradient of {name} over y")
            add("backward", "param_grad", "all_reduce", 2 - merged, x_devices, size,
                f"gradient of {name} over x")
    for name, shape in params.items():
        if zero and sharded(shape):  # ZeRO shards it over all n (its data axes)
            add("optimizer" if zero < 3 else "forward", "param_grad", "all_gather", 2, n,
                q * math.prod(shape), f"{name} (updated)" if zero < 3 else f"{name} before use")
        if zero >= 3 and sharded(shape) and name.endswith("weight") and name not in _CAPTION_KV:
            add("backward", "param_grad", "all_gather", 2, n, q * math.prod(shape),
                f"{name} again for the backward")
    return tuple(terms)


@dataclass(frozen=True)
class ActivationTerm:
    """``count`` tensors of ``elements`` per device each, ``bytes_per_element`` wide, that the
    forward of a block pair keeps for the backward: ``what`` names the tensor."""

    what: str
    count: int
    elements: int
    bytes_per_element: int

    @property
    def bytes(self) -> int:
        return self.count * self.elements * self.bytes_per_element


#: Per strategy: (divisor of the residual stream (B, N, h), divisor of the inputs of the
#: column-parallel linears (qkv, cross q, fc1), heads split at the cross-attention, divisor of the
#: caption rows the kv projection reads); ``n``, ``x``, ``y``, ``ring``, ``ulysses`` stand for
#: the device counts (usp: y = ring x ulysses).
_ACTIVATION_SPLITS = {
    "dp": ("n", "n", "1", "n"),
    "megatron": ("1", "1", "n", "1"),
    "megatron_sp": ("n", "x", "y", "1"),
    "ds_ulysses": ("n", "n", "y", "1"),
    "ring_attention": ("n", "n", "1", "y"),
    "usp": ("n", "n", "ulysses", "ring"),
}


def _ring_terms(q: int, scores: int, stats: int, r: int, b: int) -> list[ActivationTerm]:
    """What the ring kernel (``tracing.strategies.ring_attention``) keeps over ``r`` steps:
    ``q`` elements of q (and of each K/V block and of the accumulator), ``scores`` of one block's
    scores, ``stats`` of one running statistic (one per query and head)."""
    terms = [ActivationTerm("ring: q * scale (blocks)", 1, q, b),
             ActivationTerm("ring: K and V block of each step (step 0's and the rotated ones)",
                            2 * r, q, b),
             ActivationTerm("ring: scores of each step (fp32, read by amax's backward)", r,
                            scores, 4),
             ActivationTerm("ring: exp(scores - max) of each step (fp32)", r, scores, 4),
             ActivationTerm("ring: the same probabilities in the model dtype (P @ V)", r, scores,
                            b),
             ActivationTerm("ring: running output sum and running max after steps 0..r-2 (fp32, "
                            "read by the next step's rescale and maximum)", r - 1, q + stats, 4),
             ActivationTerm("ring: running sum after steps 0..r-2 (fp32)", r - 1, stats, 4),
             ActivationTerm("ring: block max and correction exp(old - new max) of steps 1..r-1 "
                            "(fp32)", 2 * (r - 1), stats, 4),
             ActivationTerm("ring: correction broadcast over head_dim, steps 1..r-1 (fp32)",
                            r - 1, q, 4),
             ActivationTerm("ring: final sum broadcast and the normalized output (fp32)", 2, q,
                            4)]
    return [term for term in terms if term.count]


def layout_training_activations(strategy: str, config: STDiT3Config, dims: BlockDims,
                                mesh: tuple[int, int], recompute: bool = False,
                                ring_degree: int | None = None,
                                path: str = "official") -> tuple[ActivationTerm, ...]:
    """What the forward of one block pair keeps for autograd's backward, per device, in the
    traced layout (the analyzer's ``activation``: forward values a backward op reads, weights
    excepted), term by term from the model code: each saved tensor of
    ``models.opensora.stdit3`` with its local shape and dtype. bf16 / fp16 models only (q < 4:
    an fp32 model's casts are no-ops and save nothing of their own).

    Local sizes (elements per device; n = devices): R = B*N*h / (residual divisor), G = B*N*h /
    (linear-input divisor: Megatron-SP all-gathers its tokens before qkv, cross q and fc1),
    Q = B*N*h / n for every strategy (the queries of the local tokens and heads), so the
    attention outputs (proj inputs) are Q and the MLP hidden (m/h)Q. Scores: Q/hd queries x the
    attention length (S or T; the cross-attention's B*TOKEN captions, every caption of the
    batch: OpenSora's flattened cross-attention). The elementwise ops of a bf16 model run in fp32
    as torch-xla lowers them, and the backward reads those fp32 operands: the input of each
    modulation and gate product and the broadcast (1 + scale) and gate (6 tensors of R), the
    LayerNorms' centered input and broadcast rsqrt (4 of R) and rsqrt (2 of R/h).

    ``path`` "official" (OpenSora's text-to-video path, ``--path official``, the default): the
    timestep-0 modulations and gates add their broadcast (1 + scale0) and gate0 (4 fp32 tensors
    of R per block), and the per-frame selections (``t_mask_select``'s ``torch.where``) keep
    their condition, the temporal mask broadcast to R (1 byte each), once for the pair; "clean":
    neither.

    ``recompute`` (``--recompute full``): each block's input x, the captions y and t_mlp as the
    stage receives them: megatron and dp whole or split with the batch; the layouts with the
    batch on x (megatron_sp, ds_ulysses, ring_attention, usp) keep B/x samples' t_mlp, every
    caption (ring_attention: its y slice) and, on the official path, the temporal mask of the
    local frames (checked on the tiny 2x2 / 2x4 traces, tests/test_training.py).

    Checked to the byte against the traced tiny dumps (``tests/test_training.py``) and the
    study's full-size dumps (``results/training.md``). Known limit: where GSPMD shards the
    (B, 1, h) modulation operands over the batch merged with the frames (batch 2 on a 1 x 4
    mesh, the spatial block), the backward reads them before the broadcast, and the broadcast
    terms here over-count (by the broadcast tensors minus their (B, h) operands)."""
    _require_path(path)
    if strategy not in _ACTIVATION_SPLITS:
        raise TrainingTheoryError(f"no activation formula for {strategy!r}: expected one of "
                                  f"{', '.join(_ACTIVATION_SPLITS)}")
    b = dims.bytes_per_element
    if b >= 4:
        raise TrainingTheoryError("the activation formula is for bf16 / fp16 models (an fp32 "
                                  "model keeps no fp32 copies of its own)")
    x_devices, y_devices = mesh
    ring, ulysses = (usp_degrees(y_devices, ring_degree) if strategy == "usp"
                     else (y_devices, 1) if strategy == "ring_attention" else (1, y_devices))
    devices = {"n": x_devices * y_devices, "x": x_devices, "y": y_devices, "1": 1,
               "ring": ring, "ulysses": ulysses}
    residual, linear_in, cross_heads, caption_rows = (
        devices[key] for key in _ACTIVATION_SPLITS[strategy])
    h, hd = dims.hidden, dims.hidden // dims.heads
    whole = dims.batch * dims.N * h
    R, G, Q = whole // residual, whole // linear_in, whole // devices["n"]
    captions = dims.batch * dims.token
    caption = ActivationTerm("captions y read by the kv projection's weight gradient", 1,
                             captions * h // caption_rows, b)
    if recompute:
        if strategy in ("megatron", "dp"):
            batch, frames = dims.batch // residual, dims.T  # the residual's split is the batch's (dp) or none
        else:  # the batch on x, the tokens (and the frames where they split) on y
            batch = dims.batch // x_devices
            frames = dims.T // y_devices if dims.T % y_devices == 0 else dims.T
            # the checkpointed captions: every caption of the batch (the flattened
            # cross-attention), ring_attention's split over y as it reads them
            caption_split = y_devices if strategy == "ring_attention" else 1
            caption = ActivationTerm("captions y as the checkpointed stage input", 1,
                                     captions * h // caption_split, b)
        terms = [ActivationTerm("input x of each block (checkpointed)", 2, R, b), caption,
                 ActivationTerm("t_mlp", 1, batch * 6 * h, b)]
        if path == "official":
            terms += [ActivationTerm("t0_mlp", 1, batch * 6 * h, b),
                      ActivationTerm("temporal mask x_mask (bool)", 1, batch * frames, 1)]
        return tuple(terms)
    split_temporal = dims.T % y_devices == 0  # the attention whose sequence the SP layouts split
    terms = [caption]
    if path == "official":
        terms.append(ActivationTerm("temporal mask broadcast to the residual (the per-frame "
                                    "selections' condition, bool)", 1, R, 1))
    for temporal in (False, True):
        block = "temporal" if temporal else "spatial"
        length = dims.T if temporal else dims.S
        terms += [
            ActivationTerm(f"{block}: fp32 operands of the 2 modulations and 2 gates, and the "
                           "broadcast (1 + scale) and gates", 8, R, 4),
            ActivationTerm(f"{block}: LayerNorm centered input and broadcast rsqrt (2 norms, "
                           "fp32)", 4, R, 4),
            ActivationTerm(f"{block}: LayerNorm rsqrt (2 norms, fp32)", 2, R // h, 4),
            *([ActivationTerm(f"{block}: broadcast (1 + scale0) and gate0 of the timestep-0 "
                              "modulations (fp32)", 4, R, 4)] if path == "official" else []),
            ActivationTerm(f"{block}: inputs of qkv, cross q and fc1", 3, G, b)]
        if config.qk_norm:
            terms += [ActivationTerm(f"{block}: q and k RMSNorm: fp32 input, broadcast rsqrt, "
                                     "fp32 normed", 6, Q, 4),
                      ActivationTerm(f"{block}: q and k RMSNorm rsqrt (fp32)", 2, Q // hd, 4)]
        if temporal == split_temporal and strategy in ("ring_attention", "usp"):
            terms += [ActivationTerm(f"{block}: {term.what}", term.count, term.elements,
                                     term.bytes_per_element)
                      for term in _ring_terms(Q, Q // hd * length // ring, Q // hd, ring, b)]
        else:
            terms += [ActivationTerm(f"{block}: q * scale, k, v", 3, Q, b),
                      ActivationTerm(f"{block}: softmax probabilities (fp32)", 1,
                                     Q // hd * length, 4),
                      ActivationTerm(f"{block}: probabilities in the model dtype (P @ V)", 1,
                                     Q // hd * length, b)]
        scores = Q // hd * captions
        terms += [ActivationTerm(f"{block}: attention and cross-attention outputs (proj "
                                 "inputs), cross q * scale", 3, Q, b),
                  ActivationTerm(f"{block}: caption K and V of the local heads", 2,
                                 captions * h // cross_heads, b),
                  ActivationTerm(f"{block}: cross-attention probabilities (fp32)", 1, scores, 4),
                  ActivationTerm(f"{block}: cross-attention probabilities in the model dtype", 1,
                                 scores, b),
                  ActivationTerm(f"{block}: fc1 output, GELU(tanh)'s 3 intermediates, fc2 "
                                 "input", 5, dims.mlp_ratio * Q, b)]
    return tuple(terms)


#: The notes' training table (note 000), row by row: communication of parameters and of
#: activations (forward + backward), the split dimension, and memory per device, as written.
NOTES_TRAINING_TABLE = {
    "DS-SP": ("AllReduce", "12O(h²)", "8*All2All", "(8/N)O(bsh)", "a/s", "P+G", "6P", "A/N"),
    "Ring-SP": ("AllReduce", "12O(h²)", "P2P", "4O(bsh)", "L/L", "P+G", "6P", "A/N"),
    "DP": ("AllReduce", "12O(h²)", "0", "0", "b/b", "P+G", "6P", "A/N"),
    "ZeRO1": ("AllGather + ReduceScatter", "12O(h²)", "0", "0", "a/s", "P+G", "6P/N", "A/N"),
    "USP + ZeRO1": ("AllGather + ReduceScatter", "12O(h²)", "P2P + 8*All2All", "≤ 4O(bsh)", "a/s",
                    "P+G", "6P/N", "A/N"),
    "USP + ZeRO2": ("AllGather + ReduceScatter", "12O(h²)", "P2P + 8*All2All", "≤ 4O(bsh)", "a/s",
                    "P+(G/N)", "6P/N", "A/N"),
    "USP + ZeRO3": ("2*AllGather + ReduceScatter", "18O(h²)", "P2P + 8*All2All", "≤ 4O(bsh)",
                    "a/s", "(P+G)/N", "6P/N", "A/N"),
    "TP": ("0", "0", "4*AllReduce", "8O(bsh)", "a/h", "(P+G)/N", "6P/N", "αA"),
    "Megatron-SP": ("0", "0", "6*AllGather + 4*ReduceScatter", "10O(bsh)", "a/h", "(P+G)/N",
                    "6P/N", "A/N"),
}
