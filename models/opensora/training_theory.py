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
  (replicated, head-dim sized) get their gradients summed over the heads: 4 all-reduces of q*hd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_trace.errors import UsageError
from models.opensora.config import STDiT3Config
from models.opensora.theory import BlockDims, CollectiveTerm

__all__ = ["NOTES_TRAINING_TABLE", "TrainingTerm", "block_parameters", "layout_training_collectives",
           "parameter_splits", "training_buffer_bytes"]

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


def _term(phase: str, traffic: str, kind: str, count: int, group: int, message_bytes: float,
          what: str) -> TrainingTerm:
    return TrainingTerm(kind, count, group, message_bytes, what, phase=phase, traffic=traffic)


def layout_training_collectives(strategy: str, config: STDiT3Config, dims: BlockDims,
                                mesh: tuple[int, int], zero: int = 0,
                                recompute: bool = False) -> tuple[TrainingTerm, ...]:
    """The collectives of one block pair's training step in the traced layout (module
    docstring); dp with ZeRO 0-3 and megatron (ZeRO 0: every weight is split, nothing is
    replicated but the norm weights, biases and tables, which ZeRO would shard). With
    ``recompute`` (``--recompute full``) the backward runs each block's forward again, with its
    collectives (megatron: 6 all-reduces of A more; dp: none)."""
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
            terms.append(_term("backward", "param_grad", kind, 2, n, q * math.prod(shape),
                               f"gradient of {name}"))
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
    raise TrainingTheoryError(f"no training-step layout formula for {strategy!r} here: dp, "
                              "megatron")


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
