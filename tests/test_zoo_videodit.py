"""The video DiTs of models/zoo/videodit traced with trace-module: GEMM FLOPs per device against
a hand count written here from each model's configuration (the factory's keyword arguments and
the input shapes alone), and the collectives of each of xDiT's strategies (models/zoo/videodit/
plans.py) against the layout's formula, bytes per device and kind by kind (traced/theory 1).

Tiny configurations (the factories' defaults), f32 (4 bytes an element). Collective bytes sent per
device on n devices (``hardware.collectives``' ring forms): all-reduce of S bytes 2 (n-1)/n S,
all-to-all of a local S bytes (n-1)/n S. Each trace takes a few seconds: the Wan Ulysses case runs
in the default run, the others are marked slow.

PipeFusion (``pipefusion`` on 4 x 1: four stages; ``pipefusion_ulysses`` on 2 x 2: two stages of
Ulysses 2) is traced as one tick of the pipeline: each stage's current patch (one of M = 2 along
the latent height: 32 of the 64 video tokens) through the model's blocks, its queries against the
K/V buffer of the whole video (the patch's fresh K/V in its slot), its activation handed to the
next stage (a collective-permute over the stages).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

from models.zoo.videodit.plans import (  # noqa: E402
    factory_kwargs,
    mesh,
    pipefusion_inputs,
    plan_toml,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
F32 = 4
N_DEV = 4  # the sequence- or tensor-parallel degree of every case
WIDTH = 64  # the hidden width of every tiny model (the factories' defaults)
HEADS = 4  # of 16 (the factories' defaults)
PATCHES = 2  # PipeFusion's patches M


@dataclass(frozen=True)
class Count:
    """A model's GEMM FLOPs (one device, global shapes) cut by how a strategy shares them:
    ``blocks`` the blocks' linears and attention; outside the blocks, ``shared`` the work on
    tokens that a token split shares (Ulysses) and ``whole`` the work it leaves whole on every
    device (the conditioning vectors, the text the tokens attend to); ``modulation`` the blocks'
    modulation linears (on the conditioning vector: whole under Ulysses and tensor parallel);
    ``frames`` CogVideoX's patch convolution on (batch x frames) images, before the token
    split: whole when a device group holds two samples (batch x frames is then no tile of the
    token split), shared when it holds one (CFG parallel with Ulysses)."""
    blocks: int
    shared: int
    whole: int
    modulation: int = 0
    frames: int = 0

    @property
    def total(self) -> int:
        return self.blocks + self.shared + self.whole + self.modulation + self.frames


# -- hand counts from the configuration -------------------------------------------------------------
def wan21_count(b: int, n: int, lt: int, *, dim=64, ffn=160, layers=2, in_channels=4, text_dim=32,
                frequencies=32, kv: int | None = None) -> Count:
    """``kv``: the video tokens the self-attention's keys cover (PipeFusion: the whole video's
    K/V buffer against one patch's ``n`` queries; else ``n``)."""
    d, patch, kv = dim, in_channels * 4, n if kv is None else kv
    block = (8 * b * n * d * d + 4 * b * n * kv * d             # self: q, k, v, o; scores, values
             + 4 * b * n * d * d + 4 * b * lt * d * d           # cross: q, o on video; k, v on text
             + 4 * b * n * lt * d                               # cross scores and values
             + 4 * b * n * d * ffn)                             # MLP up and down
    small = (2 * b * lt * (text_dim * d + d * d)                # text embedding
             + 2 * b * (frequencies * d + d * d)                # time embedding
             + 2 * b * d * 6 * d)                               # time projection
    return Count(layers * block, 2 * 2 * b * n * patch * d, small)


def hunyuan_count(b: int, n: int, lt: int, *, dim=64, double_layers=1, single_layers=1,
                  refiner_layers=1, in_channels=4, text_dim=32, pooled_dim=16,
                  frequencies=256, kv: int | None = None) -> Count:
    d, m, patch = dim, n + lt, in_channels * 4
    keys = (n if kv is None else kv) + lt  # the joint keys: video (PipeFusion: the buffer's) + text
    double = 24 * b * m * d * d + 4 * b * m * keys * d   # per stream: qkv 3, proj 1, MLP 8 (x 2)
    single = 24 * b * m * d * d + 4 * b * m * keys * d   # qkv 3 + up 4, proj 1 + down 4
    refiner = (b * lt * d * d * (6 + 2 + 16) + 4 * b * lt * lt * d + 2 * b * d * 2 * d)
    small = (2 * b * (frequencies * d + d * d) * 2 + 2 * b * (pooled_dim * d + d * d)  # t, g, pooled
             + 2 * b * lt * text_dim * d + 2 * b * (frequencies * d + d * d)   # refiner in, t
             + 2 * b * (text_dim * d + d * d) + refiner_layers * refiner        # refiner c, blocks
             + 2 * b * d * 2 * d)                                              # final modulation
    modulation = 2 * b * d * (2 * 6 * d * double_layers + 3 * d * single_layers)
    return Count(double_layers * double + single_layers * single, 2 * 2 * b * n * patch * d,
                 small, modulation)


def cogvideox_count(b: int, n: int, lt: int, *, heads=4, head_dim=16, layers=2, in_channels=4,
                    text_dim=32, time_dim=32, kv: int | None = None) -> Count:
    d, m, patch = heads * head_dim, n + lt, in_channels * 4
    keys = (n if kv is None else kv) + lt
    block = 8 * b * m * d * d + 4 * b * m * keys * d + 16 * b * m * d * d
    # the text projection's output is split on tokens (shared); the patch convolution: frames
    shared = 2 * b * lt * text_dim * d + 2 * b * n * d * patch
    whole = 2 * b * (d * time_dim + time_dim * time_dim) + 2 * b * time_dim * 2 * d
    return Count(layers * block, shared, whole, layers * 2 * 2 * b * time_dim * 6 * d,
                 frames=2 * b * n * patch * d)


#: model -> (factory, inputs, batch, video tokens, text tokens, count)
MODELS = {
    "wan21": ("models.zoo.videodit.wan21:wan21",
              ["latents=2x4x4x8x8:float32", "t=2:float32", "text=2x8x32:float32"], 2, 64, 8,
              wan21_count),
    "hunyuan_video": ("models.zoo.videodit.hunyuan_video:hunyuan_video",
                      ["latents=1x4x4x8x8:float32", "t=1:float32", "text=1x8x32:float32",
                       "pooled=1x16:float32", "guidance=1:float32"], 1, 64, 8, hunyuan_count),
    "cogvideox": ("models.zoo.videodit.cogvideox:cogvideox",
                  ["latents=2x4x4x8x8:float32", "t=2:float32", "text=2x8x32:float32"], 2, 64, 8,
                  cogvideox_count),
}


def all_to_all(local: float, n: int = N_DEV) -> float:
    return (n - 1) / n * local


def all_reduce(size: float, n: int = N_DEV) -> float:
    return 2 * (n - 1) / n * size


def expected(model: str, strategy: str) -> tuple[int, dict[str, float]]:
    """The layout formula: GEMM FLOPs per device and collective bytes per device by kind."""
    _, _, b, n, lt, count_of = MODELS[model]
    count = count_of(b, n, lt)
    d = WIDTH
    m = n + lt
    if strategy == "single":
        return count.total, {}
    if strategy == "cfg":  # the two branches on two devices: everything halves, nothing sent
        return count.total // 2, {}
    if strategy in ("ring", "usp"):
        return ring_formula(model, strategy, count, b, n, lt)
    if strategy.startswith("pipefusion"):
        return pipefusion_formula(model, strategy)
    branch = 2 if strategy == "cfg_ulysses" else 1
    if strategy.endswith("ulysses"):
        # tokens split: the blocks, modulation aside, and the video work outside them shared;
        # the text and conditioning work outside the blocks on every device (xDiT's layout)
        frames = count.frames // N_DEV if b // branch == 1 else count.frames
        gemm = ((count.blocks + count.shared) // N_DEV + frames + count.whole
                + count.modulation) // branch
        local = b // branch * d * F32
        if model == "wan21":  # self: q, k, v, out; cross: q, out; a cross k-norm statistic
            return gemm, {"all_to_all": 2 * 6 * all_to_all(local * n / N_DEV),
                          "all_reduce": 2 * all_reduce(b // branch * lt * F32)}
        # joint attentions: q, k, v, out (CogVideoX's two blocks, HunyuanVideo's one of each kind)
        return gemm, {"all_to_all": 2 * 4 * all_to_all(local * m / N_DEV)}
    # tp: the blocks' linears and attention shared; modulation and outside on every device
    gemm = count.blocks // N_DEV + count.shared + count.whole + count.modulation + count.frames
    if model == "wan21":  # o, cross o, fc2 outputs; RMSNorm statistics of q, k, cross q, cross k
        return gemm, {"all_reduce": 2 * (3 * all_reduce(b * n * d * F32)
                                         + all_reduce(b * (3 * n + lt) * F32))}
    if model == "cogvideox":  # o and fc2 over the joint sequence
        return gemm, {"all_reduce": 2 * 2 * all_reduce(b * m * d * F32)}
    # HunyuanVideo: proj and fc2 of each stream of the dual-stream block, and of the single one
    return gemm, {"all_reduce": 2 * all_reduce(b * m * d * F32) + 2 * all_reduce(b * m * d * F32)}


def ring_formula(model: str, strategy: str, count: Count, b: int, n: int, lt: int):
    """Ring attention over R = 4 (ring) or R = 2 x Ulysses U = 2 (usp): the blocks and the
    token work shared; per ring attention 2 (R - 1) collective-permutes (K and V blocks) of
    (B, L / R, heads / U, D); under usp 4 all-to-alls (q, k, v, out) in groups of U. Wan's
    cross-attention keys and values (text) are split by heads over U only (whole under ring),
    the k RMSNorm's statistic all-reduced in the head groups."""
    d, ring = WIDTH, 4 if strategy == "ring" else 2
    ulysses = N_DEV // ring
    length = n if model == "wan21" else n + lt
    attentions = 2  # Wan's and CogVideoX's two blocks, HunyuanVideo's one of each kind
    sent = {"collective_permute": attentions * 2 * (ring - 1) * b * length // ring * d // ulysses * F32}
    gemm = (count.blocks + count.shared) // N_DEV + count.whole + count.modulation + count.frames
    if model == "wan21":  # cross k and v projections on the text: split by heads over U only
        cross_kv = 2 * 4 * b * lt * d * d
        gemm += cross_kv // ulysses - cross_kv // N_DEV
    if ulysses > 1:
        local = b * length // N_DEV * d * F32
        cross = 2 * 2 * all_to_all(b * n // N_DEV * d * F32, ulysses) if model == "wan21" else 0
        sent["all_to_all"] = attentions * 4 * all_to_all(local, ulysses) + cross
        if model == "wan21":
            sent["all_reduce"] = 2 * all_reduce(b * lt * F32, ulysses)
    return gemm, sent


def pipefusion_formula(model: str, strategy: str) -> tuple[int, dict[str, float]]:
    """One PipeFusion tick: per device one stage (the batch of one sample group, b) on one
    patch of n / M video tokens, whose self- or joint attention's queries meet the keys and
    values of all n video tokens (the buffer: the stale M - 1 patches and the patch's fresh
    ones; the text's, fresh, where the attention is joint). Each device hands its patch's
    activation to the next stage: a collective-permute of (b, patch tokens [+ text], d) (Wan:
    the video tokens; CogVideoX: video and text, two; HunyuanVideo: the joint sequence), split
    over the Ulysses group when there is one. Ulysses inside a stage (u = 2): its all-to-alls
    on the patch's tokens (the buffer is kept split by heads: nothing exchanged of it)."""
    _, _, b, n, lt, count_of = MODELS[model]
    u = 1 if strategy == "pipefusion" else degree_of(strategy)
    patch, d = n // PATCHES, WIDTH
    count = count_of(b, patch, lt, kv=n)
    handed = patch if model == "wan21" else patch + lt
    sent = {"collective_permute": b * handed * d * F32 / u}
    if u == 1:
        return count.total, sent
    gemm = (count.blocks + count.shared) // u + count.frames + count.whole + count.modulation
    local = b * d * F32
    if model == "wan21":
        sent |= {"all_to_all": 2 * 6 * all_to_all(local * patch / u, u),
                 "all_reduce": 2 * all_reduce(b * lt * F32, u)}
    else:
        sent["all_to_all"] = 2 * 4 * all_to_all(local * (patch + lt) / u, u)
    return gemm, sent


def degree_of(strategy: str) -> int:
    """The plan's degree: N_DEV devices in all (``pipefusion_ulysses``: Ulysses over N_DEV / 2
    in each of its two stages)."""
    return N_DEV // 2 if strategy == "pipefusion_ulysses" else N_DEV


def stale_kv_bytes(model: str, strategy: str) -> int:
    """PipeFusion's K/V buffers on one device: K and V of every self- or joint attention of its
    stage (Wan's and CogVideoX's two blocks, HunyuanVideo's two) for all n video tokens of its
    sample group, its heads (all, or 1/u under Ulysses)."""
    _, _, b, n, _, _ = MODELS[model]
    u = 1 if strategy == "pipefusion" else degree_of(strategy)
    return 2 * 2 * b * n * (HEADS // u) * (WIDTH // HEADS) * F32


CASES = [(model, strategy) for model in MODELS
         for strategy in ("single", "ulysses", "ring", "usp", "tp", "cfg", "cfg_ulysses",
                          "pipefusion", "pipefusion_ulysses")
         if model == "wan21" or model == "cogvideox" or not strategy.startswith("cfg")]
QUICK = {("wan21", "ulysses"), ("cogvideox", "pipefusion")}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def trace_and_analyze(model: str, strategy: str, out: Path) -> dict:
    factory, inputs, *_ = MODELS[model]
    degree = degree_of(strategy)
    if strategy.startswith("pipefusion"):
        inputs = pipefusion_inputs(inputs, stages=mesh(strategy, degree)[0], patches=PATCHES,
                                   attentions=2, heads=HEADS, head_dim=WIDTH // HEADS,
                                   video_tokens=MODELS[model][3])
    args = [sys.executable, "-m", "tracing.module_cli", factory, "--name", f"{model}_{strategy}",
            "-o", str(out)]
    for spec in inputs:
        args += ["--input", spec]
    if strategy == "single":
        args += ["--strategy", "dp", "--mesh", "1x1"]
    else:
        plan = out / f"{model}_{strategy}.toml"
        plan.write_text(plan_toml(model, strategy, degree))
        args += ["--plan", str(plan)]
        layout = factory_kwargs(strategy, degree)
        if model == "wan21":  # cross-attention to the text: no joint sequence to order
            del layout["chunks"]
        kwargs = out / f"{model}_{strategy}_kwargs.toml"
        kwargs.write_text("".join(f"{key} = {value}\n" for key, value in layout.items()))
        args += ["--kwargs", str(kwargs)]
    traced = subprocess.run(args, cwd=out, env=_env(), capture_output=True, text=True, timeout=300)
    assert traced.returncode == 0, traced.stderr
    analysis = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli",
                               str(out / f"{model}_{strategy}.mlir"), "--hw", "h100-sxm",
                               "--format", "json"], env=_env(), capture_output=True, text=True,
                              timeout=300)
    assert analysis.returncode == 0, analysis.stderr
    return json.loads(analysis.stdout)


@pytest.mark.parametrize("model, strategy", [
    pytest.param(*case, marks=() if case in QUICK else pytest.mark.slow) for case in CASES])
def test_gemm_flops_and_collectives_equal_the_layout_formula(tmp_path, model, strategy):
    analysis = trace_and_analyze(model, strategy, tmp_path)
    gemm, collectives = expected(model, strategy)
    assert analysis["totals"]["gemm_flops"] == gemm
    sent = {kind: entry["bytes_per_device"] for kind, entry in analysis["comm_by_kind"].items()}
    assert sent == pytest.approx(collectives)
    if strategy.startswith("pipefusion"):
        assert analysis["memory"]["stale_kv_bytes"] == stale_kv_bytes(model, strategy)


def test_the_meshes_of_the_plans():
    assert mesh("ulysses", 8) == (1, 8) and mesh("cfg_ulysses", 4) == (2, 4)
    with pytest.raises(ValueError, match="embedded guidance"):
        plan_toml("hunyuan_video", "cfg", 2)


# -- the released sizes: one block of each kind, a short video, one device -------------------------
def _toml(kwargs: dict) -> str:
    return "".join(f"{key} = {list(value) if isinstance(value, tuple) else value}\n"
                   for key, value in kwargs.items())


FULL = {  # config name -> (input specs at 2 x 16 x 16 latents, count function)
    "hunyuan_video": (["latents=1x16x2x16x16:bfloat16", "t=1:bfloat16", "text=1x256x4096:bfloat16",
                       "pooled=1x768:bfloat16", "guidance=1:bfloat16"], 1, hunyuan_count,
                      {"double_layers": 1, "single_layers": 1, "refiner_layers": 2}),
    "wan21_14b": (["latents=2x16x2x16x16:bfloat16", "t=2:bfloat16", "text=2x512x4096:bfloat16"], 2,
                  wan21_count, {"layers": 1}),
    "wan21_1.3b": (["latents=2x16x2x16x16:bfloat16", "t=2:bfloat16", "text=2x512x4096:bfloat16"], 2,
                   wan21_count, {"layers": 1}),
    "cogvideox_5b": (["latents=2x2x16x16x16:bfloat16", "t=2:bfloat16", "text=2x226x4096:bfloat16"],
                     2, cogvideox_count, {"layers": 1}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_full_size_hand_count_equals_a_one_block_trace(tmp_path, name):
    """The hand count at the released width, heads, text length and embeddings (one block of
    each kind, 2 latent frames of 16 x 16: 128 video tokens) equals the traced GEMM FLOPs."""
    from models.zoo.videodit.configs import MODELS as CONFIGS

    config = CONFIGS[name]
    inputs, batch, count_of, layers = FULL[name]
    kwargs = {**config.kwargs, **layers}
    (tmp_path / "kwargs.toml").write_text(_toml(kwargs))
    args = [sys.executable, "-m", "tracing.module_cli", config.factory, "--kwargs",
            str(tmp_path / "kwargs.toml"), "--strategy", "dp", "--mesh", "1x1", "--dtype",
            "bfloat16", "--name", "full", "-o", str(tmp_path)]
    for spec in inputs:
        args += ["--input", spec]
    traced = subprocess.run(args, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                            timeout=600)
    assert traced.returncode == 0, traced.stderr
    analysis = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(tmp_path / "full.mlir"),
                               "--hw", "h100-sxm", "--format", "json"], env=_env(),
                              capture_output=True, text=True, timeout=600)
    assert analysis.returncode == 0, analysis.stderr
    hand = {key: value for key, value in kwargs.items()
            if key in inspect.signature(count_of).parameters}
    tokens = config.video_tokens(5, 128, 128)  # 2 latent frames of 16 x 16 -> 128 tokens
    count = count_of(batch, tokens, config.text_tokens, **hand)
    assert json.loads(analysis.stdout)["totals"]["gemm_flops"] == count.total


@pytest.mark.slow
@pytest.mark.trace
def test_the_official_library_calls_are_one_kernel_each(tmp_path):
    """Under ``--exec torch`` (eager PyTorch, one kernel per library call) the attention of every
    block is one flash-attention kernel, as the official code calls it, and each LayerNorm one
    kernel: the model marks them (``layers.attend``, ``layer_norm``) and trace-module's sidecar
    lists their source lines. Tiny Wan in bfloat16, 2 blocks: a self- and a cross-attention and
    two LayerNorms without affine each, and the cross-attention's norm3 with it."""
    factory, inputs, *_ = MODELS["wan21"]
    args = [sys.executable, "-m", "tracing.module_cli", factory, "--strategy", "dp", "--mesh", "1x1",
            "--dtype", "bfloat16", "--name", "wan", "-o", str(tmp_path)]
    for spec in inputs:
        args += ["--input", spec.replace("float32", "bfloat16")]
    traced = subprocess.run(args, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert traced.returncode == 0, traced.stderr
    analysis = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(tmp_path / "wan.mlir"),
                               "--hw", "h100-sxm", "--format", "json"], env=_env(), capture_output=True,
                              text=True, timeout=300)
    assert analysis.returncode == 0, analysis.stderr
    mapping = json.loads(analysis.stdout)["mapping"]
    assert mapping["execution"] == "torch"
    kernels = {entry["class"]: entry["kernels"] for entry in mapping["classes"]}
    assert kernels["flash_attention"] == 2 * 2
    assert kernels["layer_norm"] == 2 * 3 + 1  # and the head's


def test_each_ring_step_is_one_flash_attention_kernel(tmp_path):
    """Ring attention as xDiT runs it: every ring step calls flash-attn on one K/V block
    (``layers.attend_block``, output and log-sum-exp), the steps merged element-wise. Tiny Wan
    under ``ring`` (R = 4), 2 blocks: 4 fused kernels per self-attention and one per
    cross-attention (its text keys are whole), 2 x (4 + 1) in all."""
    mapping = trace_and_analyze("wan21", "ring", tmp_path)["mapping"]
    assert mapping["execution"] == "torch"
    kernels = {entry["class"]: entry["kernels"] for entry in mapping["classes"]}
    assert kernels["flash_attention"] == 2 * (4 + 1)
    # the step's row sums and its normalisation run inside the fused kernel: no other kernel of
    # the call (before: a reduction reading the block's 2 x 4 heads x 16 x 16 probabilities)
    assert [k["name"] for k in mapping["kernels"]
            if k["kind"] != "flash_attention" and k["name"].endswith("(flash_attention)")] == []
    # fused execution (TX8): no reduction over a block's probabilities outside the fused
    # attentions (before: XLA's fusions of the row sum with the log-sum-exp, 6 of them)
    fused = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(tmp_path / "wan21_ring.mlir"),
                            "--hw", "tx8", "--format", "json"], env=_env(), capture_output=True, text=True,
                           timeout=300)
    assert fused.returncode == 0, fused.stderr
    probabilities = "2x1x4x16x16"  # (batch, ring block, heads, queries, keys)
    assert [k["name"] for k in json.loads(fused.stdout)["mapping"]["kernels"]
            if k["kind"] != "flash_attention" and "reduce" in k["name"] and probabilities in k["shapes"]] == []
