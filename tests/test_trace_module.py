"""trace-module on the zoo (models/zoo): GEMM FLOPs and collective bytes per device against
formulas written here from each model's dimensions, the blocks that ``analyze-hlo --hw`` finds in
the dumps and their time, and the errors that need the model (torch) to be found.

Sizes: the zoo's defaults. GPT-2: hidden d=64, 2 layers, 4 heads, MLP 4d, vocabulary 256.
Llama: d=128, 2 layers, 8 query heads and 4 key/value heads of 16, SwiGLU hidden 256, vocabulary
256. ViT: 32x32x3 images in 8x8 patches (16 patches + a class token = 17 tokens), d=64, 2
layers, 4 heads, MLP 4d, 10 classes. DiT: see DIT_* below. Conv net: 3 -> 16 -> 32 -> 64 channels, 3x3 kernels with
padding 1 (strides 1, 2, 2) on 16x16 images, 10 classes. f32 everywhere: 4 bytes an element.

Collective bytes sent per device on n devices (``hardware.collectives``' ring forms): an
all-reduce of S bytes sends 2 (n-1)/n S, an all-to-all of a local S bytes sends (n-1)/n S.

Each trace takes a few seconds; the GPT-2 megatron one runs in the default run, the others are
marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

REPO_ROOT = Path(__file__).resolve().parent.parent
PLANS = REPO_ROOT / "models" / "zoo" / "plans"
F32 = 4
N = 4  # devices of every mesh here (2x2 and 1x4)
B, S = 4, 16  # batch and sequence of the decoders
LAYERS = 2


def ring_all_reduce(size: int, n: int = N) -> float:
    return 2 * (n - 1) / n * size


def all_to_all(local: int, n: int = N) -> float:
    return (n - 1) / n * local


# -- the models' FLOPs, by hand ---------------------------------------------------------------------
def attention_products(batch: int, length: int, width: int) -> int:
    """q k^T and probs v over all heads: each 2 * batch * heads * L * L * head_dim."""
    return 2 * 2 * batch * length * length * width


def gpt2_layer(batch: int = B, length: int = S, d: int = 64) -> int:
    tokens = batch * length
    return (2 * tokens * d * 3 * d          # fused QKV
            + 2 * tokens * d * d            # attention output projection
            + 2 * 2 * tokens * d * 4 * d    # MLP up and down
            + attention_products(batch, length, d))


def llama_layer(batch: int = B, length: int = S, d: int = 128, kv: int = 4 * 16,
                ffn: int = 256) -> int:
    tokens = batch * length
    return (2 * tokens * d * (d + 2 * kv)   # q, k, v (grouped-query: k and v are 4 heads of 16)
            + 2 * tokens * d * d            # o_proj
            + 3 * 2 * tokens * d * ffn      # gate, up, down
            + attention_products(batch, length, d))


def lm_head(batch: int, length: int, d: int, vocab: int = 256) -> int:
    return 2 * batch * length * d * vocab


VIT_TOKENS = 17
VIT_PATCH_EMBED = 2 * B * 16 * (3 * 8 * 8) * 64  # 16 patches of 3x8x8 -> 64 features
VIT_HEAD = 2 * B * 64 * 10  # on the class token


def taps(size: int, kernel: int = 3, stride: int = 1, pad: int = 1) -> int:
    """Kernel taps inside the image summed over the output positions of one dimension (taps
    that fall on the zero padding are no multiply-adds)."""
    out = (size + 2 * pad - kernel) // stride + 1
    return sum(sum(0 <= o * stride - pad + i < size for i in range(kernel)) for o in range(out))


def conv(batch: int, cin: int, cout: int, size: int, stride: int) -> int:
    return 2 * batch * cin * cout * taps(size, stride=stride) ** 2


CONV1, CONV2, CONV3 = conv(B, 3, 16, 16, 1), conv(B, 16, 32, 16, 2), conv(B, 32, 64, 8, 2)
CONV_FC = 2 * B * 64 * 10
CONV2_OUT_BYTES = B * 32 * 8 * 8 * F32


# DiT: 16x16x4 latents in 2x2 patches (64 tokens), d=64, 2 layers, 4 heads, MLP 4d, 64 timestep
# frequencies: the blocks are GPT-2's on 64 tokens (no mask) plus each block's adaLN modulation
# d -> 6d; outside them the patch convolution, the timestep MLP (64 -> d -> d), the final
# modulation d -> 2d and the projection back to 2x2x4 patch values.
DIT_TOKENS = 64
DIT_MODULATION = 2 * B * 64 * 6 * 64
DIT_OUTSIDE = (2 * B * DIT_TOKENS * (4 * 2 * 2) * 64 + 2 * B * 64 * 64 * 2 + 2 * B * 64 * 2 * 64
               + 2 * B * DIT_TOKENS * 64 * 16)


def gpt2_parameters(d: int = 64, vocab: int = 256, positions: int = 128) -> int:
    layer = (2 * 2 * d                       # two LayerNorms (weight, bias)
             + d * 3 * d + 3 * d + d * d + d   # c_attn, attn.c_proj
             + d * 4 * d + 4 * d + 4 * d * d + d)  # c_fc, mlp.c_proj
    return LAYERS * layer + vocab * d + positions * d + 2 * d + d * vocab


#: name -> (factory, arguments, GEMM FLOPs per device, {collective kind: bytes per device}).
CASES = {
    "gpt2_megatron": ("models.zoo.gpt2:gpt2", ["--input", f"ids={B}x{S}:int64", "--strategy",
                                              "megatron", "--mesh", "2x2"],
                      LAYERS * gpt2_layer() // N + lm_head(B, S, 64),
                      {"all_reduce": 2 * LAYERS * ring_all_reduce(B * S * 64 * F32)}),
    "gpt2_dp": ("models.zoo.gpt2:gpt2", ["--input", f"ids={B}x{S}:int64", "--strategy", "dp",
                                        "--mesh", "2x2"],
                (LAYERS * gpt2_layer() + lm_head(B, S, 64)) // N, {}),
    "llama_megatron": ("models.zoo.llama:llama", ["--input", f"ids={B}x{S}:int64", "--strategy",
                                                  "megatron", "--mesh", "2x2"],
                       LAYERS * llama_layer() // N + lm_head(B, S, 128),
                       {"all_reduce": 2 * LAYERS * ring_all_reduce(B * S * 128 * F32)}),
    "llama_dp": ("models.zoo.llama:llama", ["--input", f"ids={B}x{S}:int64", "--strategy", "dp",
                                            "--mesh", "2x2"],
                 (LAYERS * llama_layer() + lm_head(B, S, 128)) // N, {}),
    # Ulysses on 1x4, one sequence of 16: q, k, v to heads and the attention output back to the
    # sequence, an all-to-all each per layer; everything else (lm_head too) on S/4 tokens.
    "llama_sp": ("models.zoo.llama:llama", ["--input", f"ids=1x{S}:int64", "--strategy", "sp",
                                            "--mesh", "1x4"],
                 (LAYERS * llama_layer(batch=1) + lm_head(1, S, 128)) // N,
                 {"all_to_all": LAYERS * all_to_all(S // N * (128 + 64 + 64 + 128) * F32)}),
    "vit_megatron": ("models.zoo.vit:vit", ["--input", f"images={B}x3x32x32:float32",
                                            "--strategy", "megatron", "--mesh", "2x2"],
                     VIT_PATCH_EMBED + LAYERS * gpt2_layer(length=VIT_TOKENS) // N + VIT_HEAD,
                     {"all_reduce": 2 * LAYERS * ring_all_reduce(B * VIT_TOKENS * 64 * F32)}),
    "vit_dp": ("models.zoo.vit:vit", ["--input", f"images={B}x3x32x32:float32", "--strategy",
                                      "dp", "--mesh", "2x2"],
               (VIT_PATCH_EMBED + LAYERS * gpt2_layer(length=VIT_TOKENS) + VIT_HEAD) // N, {}),
    "dit_megatron": ("models.zoo.dit:dit", ["--input", f"latents={B}x4x16x16:float32", "--input",
                                            f"t={B}:float32", "--strategy", "megatron", "--mesh",
                                            "2x2"],
                     DIT_OUTSIDE + LAYERS * (gpt2_layer(length=DIT_TOKENS) // N + DIT_MODULATION),
                     {"all_reduce": 2 * LAYERS * ring_all_reduce(B * DIT_TOKENS * 64 * F32)}),
    "dit_dp": ("models.zoo.dit:dit", ["--input", f"latents={B}x4x16x16:float32", "--input",
                                      f"t={B}:float32", "--strategy", "dp", "--mesh", "2x2"],
               (DIT_OUTSIDE + LAYERS * (gpt2_layer(length=DIT_TOKENS) + DIT_MODULATION)) // N, {}),
    # conv1 split by output channels, conv2 by input channels (partial sums all-reduced)
    "convnet_megatron": ("models.zoo.convnet:convnet", ["--input", f"images={B}x3x16x16:float32",
                                                        "--plan", str(PLANS / "convnet_megatron.toml")],
                         CONV1 // N + CONV2 // N + CONV3 + CONV_FC,
                         {"all_reduce": ring_all_reduce(CONV2_OUT_BYTES)}),
    "convnet_dp": ("models.zoo.convnet:convnet", ["--input", f"images={B}x3x16x16:float32",
                                                  "--strategy", "dp", "--mesh", "2x2"],
                   (CONV1 + CONV2 + CONV3 + CONV_FC) // N, {}),
    # A training step: every GEMM thrice (forward, input gradient, weight gradient); dp
    # all-reduces every parameter's gradient, but of the position table only the S rows used
    # (GSPMD sums the (S, d) gradient before scattering it into the table), and the loss.
    "gpt2_dp_train": ("models.zoo.gpt2:gpt2", ["--input", f"ids={B}x{S}:int64", "--strategy",
                                              "dp", "--mesh", "2x2", "--mode", "train"],
                      3 * (LAYERS * gpt2_layer() + lm_head(B, S, 64)) // N,
                      {"all_reduce": ring_all_reduce((gpt2_parameters() - (128 - S) * 64) * F32)
                       + ring_all_reduce(F32)}),
    # megatron: the two row-parallel outputs of each layer in the forward, the two
    # column-parallel input gradients in the backward; replicated weights' gradients are
    # computed whole on every device (nothing to sum)
    "gpt2_megatron_train": ("models.zoo.gpt2:gpt2", ["--input", f"ids={B}x{S}:int64",
                                                    "--strategy", "megatron", "--mesh", "2x2",
                                                    "--mode", "train"],
                            3 * (LAYERS * gpt2_layer() // N + lm_head(B, S, 64)),
                            {"all_reduce": 4 * LAYERS * ring_all_reduce(B * S * 64 * F32)}),
}
QUICK = {"gpt2_megatron"}

#: The blocks analyze-hlo finds: labels and kind of each model's blocks.
BLOCKS = {
    "gpt2": ({"qkv", "scores", "values", "proj", "fc1", "fc2"}, "attention + GELU MLP"),
    "vit": ({"qkv", "scores", "values", "proj", "fc1", "fc2"}, "attention + GELU MLP"),
    "dit": ({"qkv", "scores", "values", "proj", "fc1", "fc2"}, "attention + GELU MLP"),
    "llama": ({"q", "k", "v", "scores", "values", "proj", "gate", "up", "down"},
              "attention (GQA) + SwiGLU MLP"),
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def trace(case: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    factory, args, _, _ = CASES[case]
    return subprocess.run([sys.executable, "-m", "tracing.module_cli", factory, *args, "--name",
                           case, "-o", str(out), *extra], cwd=out, env=_env(),
                          capture_output=True, text=True, timeout=300)


def analyze(dump: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), *args],
                          env=_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """case -> (its dump, the analysis on h100-sxm as JSON), traced and analyzed once."""
    out = tmp_path_factory.mktemp("trace_module")
    done: dict[str, tuple[Path, dict]] = {}

    def get(case: str) -> tuple[Path, dict]:
        if case not in done:
            completed = trace(case, out)
            assert completed.returncode == 0, completed.stderr
            dump = out / f"{case}.mlir"
            analysis = analyze(dump, "--hw", "h100-sxm", "--format", "json")
            assert analysis.returncode == 0, analysis.stderr
            done[case] = dump, json.loads(analysis.stdout)
        return done[case]

    return get


def _cases(which: str):
    return [pytest.param(case, marks=() if case in QUICK else pytest.mark.slow) for case in CASES
            if (which == "all" or case.split("_")[0] in BLOCKS) and
            (which != "blocks" or not case.endswith("train"))]


@pytest.mark.parametrize("case", _cases("all"))
def test_gemm_flops_and_collectives_equal_the_hand_formulas(traced, case):
    _, analysis = traced(case)
    _, _, gemm_flops, collectives = CASES[case]
    assert analysis["totals"]["gemm_flops"] == gemm_flops
    sent = {kind: entry["bytes_per_device"] for kind, entry in analysis["comm_by_kind"].items()}
    assert sent == pytest.approx(collectives)


@pytest.mark.parametrize("case", _cases("blocks"))
def test_analyze_finds_the_blocks_and_times_each(traced, case):
    dump, analysis = traced(case)
    labels, kind = BLOCKS[case.split("_")[0]]
    transformer = analysis["transformer"]
    assert transformer["blocks"] == LAYERS and transformer["consistent"]
    assert [set(block["ops"]) for block in transformer["labels"]] == [labels] * LAYERS
    assert {block["kind"] for block in transformer["labels"]} == {kind}
    # each block's labelled GEMMs are its layer's share of the hand formula
    _, _, total, _ = CASES[case]
    flops = {row["position"]: row["flops"] for row in analysis["ops"]}
    per_block = [sum(flops[p] for positions in block["ops"].values() for p in positions)
                 for block in transformer["labels"]]
    layer = {"gpt2": gpt2_layer(), "vit": gpt2_layer(length=VIT_TOKENS),
             "dit": gpt2_layer(length=DIT_TOKENS),
             "llama": llama_layer(batch=1) if case == "llama_sp" else llama_layer()}[case.split("_")[0]]
    assert per_block == [layer // N] * LAYERS
    # every kernel is charged to one block or to the work outside them; the layers cost the same
    mapping = analysis["mapping"]
    times = {group["block"]: group["latency_s"] for group in mapping["blocks"]}
    assert set(times) == {None, *range(LAYERS)}
    assert sum(times.values()) == pytest.approx(mapping["totals"]["step_latency_s"])
    assert times[0] > 0 and times[0] == pytest.approx(times[1])
    if case.startswith("dit"):  # a block's own modulation (side work only it reads) is its work
        charged = [k for k in mapping["kernels"] if k["block"] == 0]
        assert sum(k["flops"] for k in charged if k["kind"] in ("gemm", "flash_attention")) == \
            layer // N + DIT_MODULATION // (1 if case == "dit_megatron" else N)
    table = analyze(dump, "--hw", "h100-sxm", "--by", "block")
    assert table.returncode == 0, table.stderr
    assert f"Time per block ({LAYERS} blocks" in table.stdout


def test_a_traced_pytorch_model_on_a_gpu_runs_as_pytorch_and_has_no_caption_line(traced):
    """The sidecar names torch-xla: on a GPU the default execution is PyTorch's, one kernel per
    library call (docs/gpu.md), as for trace-stage's dumps; GPT-2 has no cross-attention, so
    the report says nothing about caption lengths."""
    dump, analysis = traced("gpt2_megatron")
    assert analysis["mapping"]["execution"] == "torch"
    assert analysis["mapping"]["options"]["cross_attention"] == "none"
    table = analyze(dump, "--hw", "h100-sxm")
    assert table.returncode == 0, table.stderr
    assert "execution: torch" in table.stdout
    assert "cross-attention" not in table.stdout and "caption" not in table.stdout
    fused = analyze(dump, "--hw", "tx8")
    assert "execution: fused" in fused.stdout  # a compiled graph on TX8


def test_the_analysis_page_of_a_traced_decoder_times_its_blocks(traced, tmp_path):
    """hlo-report analysis on the GPT-2 dump: the blocks of the text report, not one group
    "outside the pairs"."""
    from hlo_report.analysis import analysis_page
    from hlo_report.document import Document
    from hlo_report.page import Figure

    _, analysis = traced("gpt2_megatron")
    saved = tmp_path / "analysis.json"
    saved.write_text(json.dumps(analysis))
    page = analysis_page(Document.load(saved, "analyze-hlo DUMP --format json output"))
    figures = {item.key: item for section in page.sections for item in section.items
               if isinstance(item, Figure)}
    assert "pairs" not in figures
    names = figures["blocks"].data[0]["x"]
    assert names == ["outside the blocks"] + [f"block {i}" for i in range(LAYERS)]


@pytest.mark.slow
def test_a_conv_net_has_no_blocks_and_by_block_times_the_whole_program(traced):
    dump, analysis = traced("convnet_dp")
    assert "transformer" not in analysis and analysis["mapping"]["blocks"] == []
    completed = analyze(dump, "--hw", "h100-sxm", "--by", "block")
    assert completed.returncode == 0, completed.stderr
    assert "Time per block: no blocks found" in completed.stdout
    assert "outside the blocks" in completed.stdout


SLOW = pytest.mark.slow


@pytest.mark.parametrize("args, message", [
    pytest.param(["no_such_package.nets:make", "--input", "x=4x4:float32"],
                 "cannot import module no_such_package.nets", marks=SLOW),
    pytest.param(["models.zoo.gpt2:no_factory", "--input", "ids=4x16:int64"],
                 "module models.zoo.gpt2 has no factory no_factory", marks=SLOW),
    pytest.param(["models.zoo.gpt2:gpt2", "--input", "ids=4x16:int64", "--kwargs", "{kwargs}"],
                 "the factory raised TypeError", marks=SLOW),
    (["models.zoo.gpt2:gpt2", "--input", "ids=4x16:int64", "--plan", "{plan}"],
     "pattern 'blocks.*.fc9.weight' matches no parameter of the model"),
    pytest.param(["models.zoo.gpt2:gpt2", "--input", "ids=6x16:int64"],
                 "input ids: dimension 0 of shape [6, 16] is 6, not divisible by the 4 devices of "
                 "mesh axes x, y", marks=SLOW),
    pytest.param(["models.zoo.gpt2:gpt2", "--input", "images=4x16:int64"],
                 "the model's forward(images=[4, 16]) raised TypeError", marks=SLOW),
])
def test_errors_that_need_the_model_are_one_line(tmp_path, args, message):
    kwargs = tmp_path / "kwargs.toml"
    kwargs.write_text("hidden = 64\nwidth = 3\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('[[parameters]]\npattern = "blocks.*.fc9.weight"\nspec = ["x", "none"]\n')
    args = [a.format(kwargs=kwargs, plan=plan) for a in args]
    if "--plan" not in args:
        args += ["--strategy", "dp"]
    completed = subprocess.run([sys.executable, "-m", "tracing.module_cli", *args, "--mesh", "2x2",
                                "-o", str(tmp_path)], env=_env(), capture_output=True, text=True,
                               timeout=300)
    errors = [line for line in completed.stderr.splitlines() if line.startswith("Error:")]
    assert completed.returncode == 2 and len(errors) == 1 and message in errors[0], completed.stderr
    assert "Traceback" not in completed.stderr
    assert not list(tmp_path.glob("*.mlir"))
