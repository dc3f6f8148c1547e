"""Training steps (``trace-stage --mode train``): traced memory by class and collectives by phase
and traffic against hand-derived numbers and the layout formulas of
``models.opensora.training_theory``; ``--check --mode train``; the analyzer's training section.

The stage traced is stage 1 of ``--stage-ids 0-0,1-1,2-2`` of a 3-pair tiny model (hidden
h = 64, 4 heads of hd = 16, MLP 4h, TOKEN 8): one block pair, the gradients of its outputs
arriving as inputs. Shape 28_64_64: N = 128 tokens; bf16 (q = 2).

Hand count of one block's parameters: weights 3h^2 (qkv) + h^2 (proj) + h^2 (cross q) + 2h^2
(cross kv) + h^2 (cross proj) + 4h^2 (fc1) + 4h^2 (fc2) = 16h^2 = 65536; biases 3h + h + h + 2h +
h + 4h + h = 13h = 832; q/k norm weights 2hd = 32; scale-shift table 6h = 384: 66784 per block,
133568 per pair (267136 bytes in bf16). The caption K/V projection: 2h^2 + 2h = 8320 per block.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

from test_tracing_strategies import REPO_ROOT, TINY3_TOML, trace  # noqa: E402

from hlo_analyzer import load_module  # noqa: E402
from hlo_analyzer.training import measure_training, read_training_layout  # noqa: E402
from models.opensora.config import get_config  # noqa: E402
from models.opensora.theory import block_dims, block_gemm_flops  # noqa: E402
from models.opensora.training_theory import (  # noqa: E402
    block_parameters,
    layout_training_activations,
    layout_training_collectives,
    training_buffer_bytes,
)

# The clean inference path (no temporal mask): the official one modulates with the
# scale-shift table twice (t and t0) and sums its gradient twice.
PAIR = ["--shape", "28_64_64", "--stage-ids", "0-0,1-1,2-2", "--stage", "1", "--mode", "train",
        "--path", "clean"]

PAIR_PARAMS = 2 * 66784  # elements of one block pair (module docstring)
SAVED_WEIGHTS = 2 * (16 * 64 * 64 + 2 * 16)  # every *.weight of a pair: 16h^2 + 2hd per block
q = 2
P = q * PAIR_PARAMS  # 267136 bytes


def ring(kind: str, n: int, message: float) -> float:
    """Per-device ring volume, written out (all-reduce 2M(n-1)/n, the others M(n-1)/n)."""
    return (2 if kind == "all_reduce" else 1) * message * (n - 1) / n


# dp on 2x2 with batch 4 (one sample per device): every gradient summed over n = 4 devices (34
# parameters per pair). Each device projects its own sample's caption: the caption K and V of
# both cross-attentions (q*B*TOKEN*h = 2*4*8*64 = 4096 bytes each) all-gathered in the forward,
# their gradients reduce-scattered in the backward.
DP_GRADS = P
DP_CAPTION = {("forward", "activation", "all_gather"): (4, ring("all_gather", 4, 4 * 4096)),
              ("backward", "activation", "reduce_scatter"):
              (4, ring("reduce_scatter", 4, 4 * 4096))}
# megatron on 2x2 (batch 2): A = q*B*N*h = 2*2*128*64 = 32768 bytes, caption C = 2*2*8*64.
# Megatron's per-device parameters: per block (16h^2 + 10h)/4 split + 9h + 2hd replicated =
# 17152 elements, 68608 bytes per pair.
A, C = 32768, 2048

# name -> (options, {class: bytes per device}, {(phase, traffic, kind): (count, bytes)}).
CASES = {
    "dp": (["--strategy", "dp", "--mesh", "2x2", "--batch", "4"],
           {"param": P, "grad": P, "optimizer_state": 6 * P},
           {("backward", "param_grad", "all_reduce"): (34, ring("all_reduce", 4, DP_GRADS)),
            **DP_CAPTION}),
    "zero1": (["--strategy", "dp", "--mesh", "2x2", "--batch", "4", "--zero", "1"],
              {"param": P, "grad": P, "optimizer_state": 6 * P // 4},
              {("backward", "param_grad", "all_reduce"): (34, ring("all_reduce", 4, DP_GRADS)),
               **DP_CAPTION,
               ("optimizer", "param_grad", "all_gather"): (34, ring("all_gather", 4, P))}),
    "zero2": (["--strategy", "dp", "--mesh", "2x2", "--batch", "4", "--zero", "2"],
              {"param": P, "grad": P // 4, "optimizer_state": 6 * P // 4},
              {("backward", "param_grad", "reduce_scatter"):
               (34, ring("reduce_scatter", 4, DP_GRADS)),
               **DP_CAPTION,
               ("optimizer", "param_grad", "all_gather"): (34, ring("all_gather", 4, P))}),
    "zero3": (["--strategy", "dp", "--mesh", "2x2", "--batch", "4", "--zero", "3"],
              {"param": P // 4, "grad": P // 4, "optimizer_state": 6 * P // 4},
              {("backward", "param_grad", "reduce_scatter"):
               (34, ring("reduce_scatter", 4, DP_GRADS)),
               **DP_CAPTION,
               ("forward", "param_grad", "all_gather"): (34, ring("all_gather", 4, P)),
               ("backward", "param_grad", "all_gather"):
               (18, ring("all_gather", 4, q * SAVED_WEIGHTS))}),
    "megatron": (["--strategy", "megatron", "--mesh", "2x2"],
                 {"param": 68608, "grad": 68608, "optimizer_state": 6 * 68608},
                 {("forward", "activation", "all_reduce"): (6, 6 * ring("all_reduce", 4, A)),
                  ("backward", "activation", "all_reduce"):
                  (8, 6 * ring("all_reduce", 4, A) + 2 * ring("all_reduce", 4, C)),
                  ("backward", "param_grad", "all_reduce"): (4, 4 * ring("all_reduce", 4, 32))}),
    # --recompute full: the backward runs each block's forward again, all-reduces included.
    "megatron_recompute": (["--strategy", "megatron", "--mesh", "2x2", "--recompute", "full"],
                           {"param": 68608, "grad": 68608, "optimizer_state": 6 * 68608},
                           {("forward", "activation", "all_reduce"):
                            (6, 6 * ring("all_reduce", 4, A)),
                            ("backward", "activation", "all_reduce"):
                            (14, 12 * ring("all_reduce", 4, A) + 2 * ring("all_reduce", 4, C)),
                            ("backward", "param_grad", "all_reduce"):
                            (4, 4 * ring("all_reduce", 4, 32))}),
}
THEORY = {"dp": ("dp", 0, 4), "zero1": ("dp", 1, 4), "zero2": ("dp", 2, 4), "zero3": ("dp", 3, 4),
          "megatron": ("megatron", 0, 2), "megatron_recompute": ("megatron", 0, 2)}


# The sequence-parallel layouts (and Megatron-SP): P / G / OS per device by hand, and the
# forward's collectives, which must be those of the inference layout (theory.layout_collectives).
# Megatron-SP over y = 2: per block (16h^2 + 10h)/2 split + 9h + 2hd = 33696, 134784 B per pair.
SP_CASES = {
    "ds_ulysses": (["--strategy", "ds_ulysses", "--mesh", "2x2"], (2, 2), 0,
                   {"param": P, "grad": P, "optimizer_state": 6 * P}),
    "ring_attention": (["--strategy", "ring_attention", "--mesh", "2x2"], (2, 2), 0,
                       {"param": P, "grad": P, "optimizer_state": 6 * P}),
    "megatron_sp": (["--strategy", "megatron_sp", "--mesh", "2x2"], (2, 2), 0,
                    {"param": 134784, "grad": 134784, "optimizer_state": 6 * 134784}),
    "usp": (["--strategy", "usp", "--mesh", "2x4"], (2, 4), 0,
            {"param": P, "grad": P, "optimizer_state": 6 * P}),
    "usp_zero1": (["--strategy", "usp", "--mesh", "2x4", "--zero", "1"], (2, 4), 1,
                  {"param": P, "grad": P, "optimizer_state": 6 * P // 8}),
    "usp_zero2": (["--strategy", "usp", "--mesh", "2x4", "--zero", "2"], (2, 4), 2,
                  {"param": P, "grad": P // 8, "optimizer_state": 6 * P // 8}),
    "usp_zero3": (["--strategy", "usp", "--mesh", "2x4", "--zero", "3"], (2, 4), 3,
                  {"param": P // 8, "grad": P // 8, "optimizer_state": 6 * P // 8}),
}


def trace_pairs(out: Path, cases: dict[str, list[str]]) -> dict[str, Path]:
    config = out / "tiny3.toml"
    config.write_text(TINY3_TOML)
    dumps = {}
    for name, options in cases.items():
        result = trace(["--config", str(config), *PAIR, *options, "-o", str(out)])
        assert result.returncode == 0, result.stderr[-2000:]
        dumps[name] = Path(result.stderr.strip().splitlines()[-1].split()[1])
    return dumps


@pytest.fixture(scope="session")
def train_dumps(tmp_path_factory) -> dict[str, Path]:
    return trace_pairs(tmp_path_factory.mktemp("train_dumps"),
                       {name: options for name, (options, *_) in CASES.items()})


@pytest.fixture(scope="session")
def sp_dumps(tmp_path_factory) -> dict[str, Path]:
    return trace_pairs(tmp_path_factory.mktemp("sp_train_dumps"),
                       {name: options for name, (options, *_) in SP_CASES.items()})


def split_of(dump: Path):
    return measure_training(load_module(dump), read_training_layout(dump.with_suffix(".json")))


def by_kind(terms) -> dict[tuple[str, str, str], tuple[int, int]]:
    """Layout terms summed by (phase, traffic, kind): (count, bytes per device rounded)."""
    theory: dict = {}
    for term in terms:
        count, volume = theory.get((term.phase, term.traffic, term.kind), (0, 0.0))
        theory[(term.phase, term.traffic, term.kind)] = (count + term.count,
                                                         volume + term.bytes_per_device)
    return {key: (count, round(volume)) for key, (count, volume) in theory.items()}


def traced_by_kind(split) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {key: (count, round(volume)) for key, (count, volume) in split.comm.items()}


def test_the_hand_count_of_block_parameters_is_the_models():
    import torch

    from models.opensora.stdit3 import STDiT3

    with torch.device("meta"):
        model = STDiT3(get_config("tiny"))
    prefix = "spatial_blocks.0."
    shapes = {name.removeprefix(prefix): tuple(p.shape) for name, p in model.named_parameters()
              if name.startswith(prefix)}
    assert shapes == block_parameters(get_config("tiny"))
    assert sum(p.numel() for name, p in model.named_parameters()
               if name.startswith(prefix)) == PAIR_PARAMS // 2


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
@pytest.mark.parametrize("name", sorted(CASES))
def test_training_memory_by_class_is_the_hand_count(train_dumps, name):
    _, memory, _ = CASES[name]
    split = split_of(train_dumps[name])
    assert {key: split.memory[key] for key in memory} == memory
    strategy, zero, _ = THEORY[name]
    assert training_buffer_bytes(strategy, get_config("tiny"), (2, 2), zero) == memory


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
@pytest.mark.parametrize("name", sorted(CASES))
def test_training_collectives_by_phase_and_traffic_are_the_layout_formula(train_dumps, name):
    _, _, comm = CASES[name]
    split = split_of(train_dumps[name])
    assert {key: (count, round(volume)) for key, (count, volume) in split.comm.items()} == \
        {key: (count, round(volume)) for key, (count, volume) in comm.items()}
    strategy, zero, batch = THEORY[name]
    dims = block_dims(get_config("tiny"), "28_64_64", batch=batch)
    assert by_kind(layout_training_collectives(
        strategy, get_config("tiny"), dims, (2, 2), zero, recompute=name.endswith("recompute"),
        path="clean")) == {key: (count, round(volume)) for key, (count, volume) in comm.items()}


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
@pytest.mark.parametrize("name", sorted(SP_CASES))
def test_sequence_parallel_training_memory_and_forward_collectives(sp_dumps, name):
    from models.opensora.theory import layout_collectives

    _, mesh, zero, memory = SP_CASES[name]
    split = split_of(sp_dumps[name])
    strategy = name.split("_zero")[0]
    assert {key: split.memory[key] for key in memory} == memory
    assert training_buffer_bytes(strategy, get_config("tiny"), mesh, zero) == memory
    forward = {kind: (split.comm_count("forward", "activation", kind),
                      round(split.comm_bytes("forward", "activation", kind)))
               for kind in {k for (p, t, k) in split.comm if p == "forward" and t == "activation"}}
    expected: dict[str, tuple[int, int]] = {}
    for term in layout_collectives(strategy, block_dims(get_config("tiny"), "28_64_64"), mesh):
        count, volume = expected.get(term.kind, (0, 0))
        expected[term.kind] = (count + term.count, round(volume + term.bytes_per_device))
    assert forward == expected
    if strategy in ("ds_ulysses", "usp"):  # the backward exchanges what the forward did
        assert (split.comm_count("backward", "activation", "all_to_all"),
                split.comm_bytes("backward", "activation", "all_to_all")) == \
            (split.comm_count("forward", "activation", "all_to_all"),
             split.comm_bytes("forward", "activation", "all_to_all"))


# Act, what the forward keeps for the backward, per device. Hand count for megatron on 2x2
# (B = 2, N = 128 (T = 8, S = 16), h = 64, 1 of the 4 heads per device, clean path), one block:
# the residual R = B*N*h = 16384 (replicated), the local queries Q = R/4 = 4096, the MLP hidden
# 4Q = 16384, 256 LayerNorm rows; fp32: 12 tensors of R (the fp32 operands of the modulations
# and gates, their broadcast (1 + scale) and gates, the LayerNorms' centered input and broadcast
# rsqrt) 786432 + 2 rsqrt 2048; bf16 inputs of qkv, cross q, fc1 3*2*R = 98304; q and k RMSNorm
# 2*(3*4*Q + 4*Q/16) = 100352; q*scale, k, v 3*2*Q = 24576; softmax probabilities fp32 + bf16
# 6 * (Q/16 * S) = 24576 (temporal: * T, 12288); proj inputs and cross q*scale 3*2*Q = 24576;
# caption K, V of the local head 2*2*(16*16) = 1024; cross probabilities 6*(Q/16 * 16 captions)
# = 24576; fc1 output, GELU's 3 intermediates, fc2 input 5*2*16384 = 163840. Spatial 1250304,
# temporal 1238016, + the captions y (2*16*64) read by the kv weight gradient: 2490368.
MEGATRON_ACT = 1250304 + 1238016 + 2048
# Recomputed (--recompute full): each block's input 2*R*2 bytes, y 2048, t_mlp 2*6h*2 = 1536.
MEGATRON_RECOMPUTE_ACT = 2 * 2 * 16384 + 2048 + 1536

# name -> (strategy, mesh, batch) of every traced case, for the activation formula.
ACT_CASES = {**{name: ("dp", (2, 2), 4) for name in ("dp", "zero1", "zero2", "zero3")},
             "megatron": ("megatron", (2, 2), 2), "megatron_recompute": ("megatron", (2, 2), 2),
             **{name: (name.split("_zero")[0], mesh, 2)
                for name, (_, mesh, _, _) in SP_CASES.items()}}


def activation_formula(name: str) -> int:
    strategy, mesh, batch = ACT_CASES[name]
    terms = layout_training_activations(strategy, get_config("tiny"),
                                        block_dims(get_config("tiny"), "28_64_64", batch=batch),
                                        mesh, recompute=name.endswith("recompute"), path="clean")
    return sum(term.bytes for term in terms)


def test_the_activation_formula_is_the_hand_count():
    assert activation_formula("megatron") == MEGATRON_ACT
    assert activation_formula("megatron_recompute") == MEGATRON_RECOMPUTE_ACT


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
@pytest.mark.parametrize("name", sorted(ACT_CASES))
def test_what_the_forward_keeps_is_the_activation_formula(train_dumps, sp_dumps, name):
    """Act per device, traced (analyzer) = layout_training_activations, to the byte, for every
    strategy (ZeRO shards no activation; the gradients of the stage's outputs, inputs here, are
    not kept by the forward)."""
    dumps = train_dumps if name in train_dumps else sp_dumps
    assert split_of(dumps[name]).memory["activation"] == activation_formula(name)


# The backward of ds_ulysses on 2x2 (batch 2 on x, T split over y; every group 2 devices, so an
# all-reduce of M moves M per device, an all-gather of a full M, M/2), by hand, per block:
# * the modulation gradient of t_mlp, 6 chunks of (B/x, h) = 128 bytes summed over the tokens:
#   partial over y, 6 all-reduces of 128;
# * the caption K and V gradients of the local 2 heads (16 captions x 32 = 1024 bytes) summed
#   over x (both x rows hold every caption): 2 all-reduces of 1024; the caption gradient
#   (16 x 64 = 2048 bytes) partial over the heads: 1 all-reduce over y;
# * parameter gradients: the scale-shift table (768 bytes) over x only (its modulation gradient
#   is summed over y already); qkv, proj, cross q, cross proj, fc1, fc2 (weights 14h^2, biases
#   11h) and the q/k norm weights (2 x 16) over y, then x: 2 all-reduces each of their 116160
#   bytes; the kv projection, read through the local heads' rows, all-gathered over y:
#   (2h*h + 2h)*2 = 16640 bytes, 8320 per device.
# Per pair: activation all-reduces 2*(6*128 + 2*1024 + 2048) over 18, parameter all-reduces
# 2*(768 + 2*116160) over 58, 2 x 2 all-gathers of 8320, and the 8 all-to-alls of the forward
# (A/n = 8192 bytes each, 4096 per device) once more in the backward.
DS_ULYSSES_BACKWARD = {
    ("forward", "activation", "all_to_all"): (8, 8 * 4096),
    ("backward", "activation", "all_to_all"): (8, 8 * 4096),
    ("backward", "activation", "all_reduce"): (18, 2 * (6 * 128 + 2 * 1024 + 2048)),
    ("backward", "param_grad", "all_reduce"): (58, 2 * (768 + 2 * 116160)),
    ("backward", "param_grad", "all_gather"): (4, 2 * 8320)}


def collectives_formula(name: str) -> dict[tuple[str, str, str], tuple[int, int]]:
    _, mesh, zero, _ = SP_CASES[name]
    return by_kind(layout_training_collectives(name.split("_zero")[0], get_config("tiny"),
                                               block_dims(get_config("tiny"), "28_64_64"),
                                               mesh, zero, path="clean"))


def test_the_ds_ulysses_backward_formula_is_the_hand_count():
    assert collectives_formula("ds_ulysses") == DS_ULYSSES_BACKWARD


@pytest.mark.trace
@pytest.mark.parametrize("name", ["ds_ulysses", "ring_attention", "usp", "usp_zero1", "usp_zero2",
                                  "usp_zero3"])
@pytest.mark.slow  # traces training steps of every layout (session fixtures)
def test_sequence_parallel_collectives_are_the_layout_formula(sp_dumps, name):
    """Every collective of the step, by phase, traffic and kind (count and bytes per device),
    equals layout_training_collectives: the forward's exchanges again in the backward (ring
    rotations: 2 permutes of the block's gradient and 1 of its bool mask each), the partial
    sums of the replicated inputs' gradients, and each weight gradient's reduction."""
    assert traced_by_kind(split_of(sp_dumps[name])) == collectives_formula(name)


@pytest.fixture(scope="session")
def official_dump(tmp_path_factory) -> Path:
    """megatron_sp on 2x2 on OpenSora's official path (the default: the timestep-0 modulation
    and the temporal mask), in a directory of its own (the stage shapes differ)."""
    options = [option for option in PAIR if option not in ("--path", "clean")]
    out = tmp_path_factory.mktemp("official_train_dump")
    config = out / "tiny3.toml"
    config.write_text(TINY3_TOML)
    result = trace(["--config", str(config), *options, "--strategy", "megatron_sp", "--mesh",
                    "2x2", "-o", str(out)])
    assert result.returncode == 0, result.stderr[-2000:]
    return Path(result.stderr.strip().splitlines()[-1].split()[1])


@pytest.mark.trace
def test_megatron_sp_on_the_official_path_is_the_layout_formula(official_dump):
    """Megatron-SP, official path: every collective (the forward's 6 all-gathers and 6
    reduce-scatters and their transposes, both modulations' partial sums, the gradients' sums)
    and Act (the timestep-0 broadcasts and the temporal mask included) equal the formulas.
    (On the clean path GSPMD all-reduces the MLP input's gradient instead of reduce-scattering
    it: docs/training.md.)"""
    split = split_of(official_dump)
    config, dims = get_config("tiny"), block_dims(get_config("tiny"), "28_64_64")
    assert traced_by_kind(split) == by_kind(
        layout_training_collectives("megatron_sp", config, dims, (2, 2)))
    assert split.memory["activation"] == sum(
        term.bytes for term in layout_training_activations("megatron_sp", config, dims, (2, 2)))


def gemm_flops_per_device(dump: Path) -> int:
    result = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--format",
                             "json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)["totals"]["gemm_flops"]


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
def test_a_training_step_is_three_forwards_of_gemm_work_four_with_recompute(train_dumps):
    """Backward = input and weight gradients of every product (attention's too): 2x the
    forward; recomputing each block's forward in the backward adds one more; the analytic
    forward of the pair (models.opensora.theory.block_gemm_flops) is 62914560 FLOPs."""
    forward = block_gemm_flops(block_dims(get_config("tiny"), "28_64_64"))
    assert 4 * gemm_flops_per_device(train_dumps["megatron"]) == 3 * forward
    assert 4 * gemm_flops_per_device(train_dumps["megatron_recompute"]) == 4 * forward
    kept = {name: split_of(train_dumps[name]).memory["activation"]
            for name in ("megatron", "megatron_recompute")}
    # Recomputed: only the blocks' inputs are kept (x of both blocks, y, t_mlp ...).
    assert 0 < kept["megatron_recompute"] < kept["megatron"] / 10


# The caption K/V projection of a pair, 2 * 4*B*TOKEN*h^2 (B = 2, TOKEN = 8, h = 64).
CAPTION_PROJECTION = 2 * 4 * 2 * 8 * 64 * 64


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
@pytest.mark.parametrize("name", ["ds_ulysses", "ring_attention", "megatron_sp", "usp"])
def test_sequence_parallel_training_steps_repeat_no_product(sp_dumps, name):
    """Devices x per-device GEMM FLOPs = 3x the forward, plus only what the inference layout
    repeats: both x rows project every caption (one extra caption K/V projection, times 3).
    Without the kv weight copy of the local heads, ds_ulysses and usp multiplied the K/V
    gradient by the whole weight on every device in the backward."""
    options, mesh, _, _ = SP_CASES[name]
    forward = block_gemm_flops(block_dims(get_config("tiny"), "28_64_64"))
    devices = mesh[0] * mesh[1]
    assert devices * gemm_flops_per_device(sp_dumps[name]) == \
        3 * (forward + (mesh[0] - 1) * CAPTION_PROJECTION)


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
@pytest.mark.parametrize("name", ["dp", "zero2"])
def test_data_parallel_training_steps_project_each_caption_once(train_dumps, name):
    """dp, batch 4 on 4 devices: each device projects its own sample's caption, so the step is
    exactly 3x the forward of batch 4 (with every caption replicated each device would project
    all 4, forward and backward)."""
    forward = block_gemm_flops(block_dims(get_config("tiny"), "28_64_64", batch=4))
    assert 4 * gemm_flops_per_device(train_dumps[name]) == 3 * forward


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
def test_gathered_weights_are_not_activations(train_dumps):
    """ZeRO-3 gathers the weights in the forward and again in the backward: what the forward
    keeps for the backward is the same as without ZeRO (the weights are parameters)."""
    activations = {name: split_of(train_dumps[name]).memory["activation"]
                   for name in ("dp", "zero3")}
    assert activations["dp"] == activations["zero3"] > 0


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
def test_the_sidecar_and_analyze_hlo_report_the_split(train_dumps):
    dump = train_dumps["zero2"]
    sidecar = json.loads(dump.with_suffix(".json").read_text())["training"]
    assert sidecar["bytes_per_parameter"] == {"param": 2, "grad": 2, "optimizer_state": 12}
    assert sidecar["zero"] == 2
    result = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--format",
                             "json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    training = json.loads(result.stdout)["training"]
    assert training["memory_bytes"]["grad"] == P // 4
    kinds = {(row["phase"], row["traffic"], row["kind"]) for row in training["comm"]}
    assert ("backward", "param_grad", "reduce_scatter") in kinds
    text = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300).stdout
    assert "optimizer states (OS)" in text and "optimizer param_grad all_gather" in text
    # the generic memory section's resident arguments are the parameters and optimizer states
    # that the training section splits (the sidecar tells the stage inputs apart): not "weights"
    memory = json.loads(result.stdout)["memory"]
    assert memory["weight_bytes"] == training["memory_bytes"]["param"] + training["memory_bytes"]["optimizer_state"]
    resident = text.split("Memory per device:\n", 1)[1].splitlines()[0]
    assert resident.split()[:3] == ["P", "+", "OS"] and "weight" not in resident, resident


@pytest.mark.slow  # traces training steps of every layout (session fixtures)
@pytest.mark.trace
def test_a_sidecar_that_does_not_match_the_program_is_one_error_line(train_dumps, tmp_path):
    dump = train_dumps["dp"]
    sidecar = json.loads(dump.with_suffix(".json").read_text())
    sidecar["training"]["outputs"] = sidecar["training"]["outputs"][1:]
    copy = tmp_path / dump.name
    copy.write_text(dump.read_text())
    copy.with_suffix(".json").write_text(json.dumps(sidecar))
    result = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(copy)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: ") and "training.outputs" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("options", [["--zero", "1"], ["--recompute", "full"],
                                     ["--mode", "train", "--patches", "2"]])
def test_training_options_need_train_mode_and_a_whole_stage(options, tmp_path):
    result = trace(["--config", "tiny", "--strategy", "dp", "--mesh", "1x2", *options,
                    "-o", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr.startswith("Error: ") and len(result.stderr.strip().splitlines()) == 1


CHECK_CASES = [("megatron", "2x2", []), ("dp", "2x2", ["--batch", "4", "--zero", "3"]),
               ("dp", "2x2", ["--batch", "4"]), ("dp", "2x2", ["--batch", "4", "--zero", "1"]),
               ("dp", "2x2", ["--batch", "4", "--zero", "2"]), ("megatron_sp", "2x2", []),
               ("ds_ulysses", "2x2", []), ("ring_attention", "2x2", []),
               ("usp", "2x4", []), ("usp", "2x4", ["--zero", "1"]),
               ("usp", "2x4", ["--zero", "3"]),
               # an inner stage (output gradients arrive as inputs) and a last stage of two
               ("ds_ulysses", "2x2", ["--stage-ids", "0-0,1-1", "--stage", "0"]),
               ("dp", "2x2", ["--batch", "4", "--zero", "2", "--stage-ids", "0-0,1-1",
                              "--stage", "1"])]


def run_train_check(strategy: str, mesh: str, options: list[str]) -> subprocess.CompletedProcess:
    return trace(["--config", "tiny", "--shape", "28_64_64", "--mode", "train", "--check",
                  "--dtype", "float32", "--strategy", strategy, "--mesh", mesh, *options])


@pytest.mark.trace
@pytest.mark.slow
@pytest.mark.parametrize("strategy, mesh, options", CHECK_CASES)
def test_train_check_passes_for_every_strategy(strategy, mesh, options):
    result = run_train_check(strategy, mesh, options)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "check PASS" in result.stderr


NEGATIVE_CONTROL = """
from tracing.check import run_check
from plans.config import build_config
from plans.train_options import TrainOptions
config = build_config(config="tiny", strategy="megatron", mesh="2x2", dtype="float32")
report = run_check(config, 0, reorder_weights=False, train=TrainOptions())
print(report.errors["grads"], report.passed)
"""


@pytest.mark.trace
@pytest.mark.slow
def test_train_check_fails_when_a_weight_layout_is_wrong():
    """The traced model reads its fused qkv / kv rows head-major; given the OpenSora-ordered
    weights unchanged, the gradients differ far beyond the tolerance."""
    result = subprocess.run([sys.executable, "-c", NEGATIVE_CONTROL], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    error, passed = result.stdout.split()[-2:]
    assert passed == "False" and float(error) > 1e-2


@pytest.mark.trace
def test_a_first_stage_that_hands_on_its_outputs(tmp_path):
    """Stage 0 of two (embeddings + pair 0): the gradients of x, y, t, t_mlp arrive as inputs;
    outputs the strategy leaves unmarked take GSPMD's layout. usp + ZeRO-2 over all 8 devices:
    every parameter of the tiny stage has a dimension 8 divides, so G = P/8 and OS = 6P/8."""
    result = trace(["--config", "tiny", "--stage-ids", "0-0,1-1", "--stage", "0", "--mode",
                    "train", "--strategy", "usp", "--mesh", "2x4", "--zero", "2",
                    "-o", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Path(result.stderr.strip().splitlines()[-1].split()[1])
    sidecar = json.loads(dump.with_suffix(".json").read_text())
    assert {"grad_x", "grad_y", "grad_t", "grad_t_mlp"} <= set(sidecar["inputs"])
    memory = split_of(dump).memory
    assert memory["grad"] * 8 == memory["param"] and memory["optimizer_state"] * 8 == 6 * memory["param"]
