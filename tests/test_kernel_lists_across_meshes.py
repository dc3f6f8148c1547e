"""``analyze-hlo --exec torch``: one kernel list per library call on every mesh (issue 31).

The eager official code launches the same kernels on every GPU whatever the device count: one
per library call, on the device's slice. So the kernel list of a pair traced on 1, 2 and 8
devices must be the same, up to the per-device shapes (and the collectives of the strategy).

The stage is stage 0 of ``--stage-ids 0-0,1-1`` of the tiny STDiT3 (hidden 64, 4 heads of 16,
MLP 256, caption TOKEN 8) at 28_64_64, batch 2, official path: T = 8 frames, S = 16 positions,
N = 128 tokens per sample; it holds the embeddings and pair 0 (a spatial and a temporal
block). Traced with ``none`` on 1x1, ``ds_ulysses`` on 1x2 (both samples per device, T split
over 2) and on 2x4 (a sample per device, T split over 4), the study's 8-GPU layout.

Kernels of one block, by hand from ``models/opensora/stdit3.py`` (``STDiT3Block.forward``):

* modulation: ``scale_shift_table[None] + t_mlp.reshape(B, 6, h)`` and the same with ``t0_mlp``
  (the official text-to-video path): 2 adds that read the (1, 6, h) table broadcast over B;
* ``norm1(x)`` twice and ``norm2(x)`` twice (modulated by t and by t0): 4 LayerNorms, each
  copying the channel-major residual x first (4 ``transpose_copy``), each followed by
  ``modulate``: ``1 + scale`` (1 element-wise on (B, 1, h)), ``* (1 + scale)`` and ``+ shift``
  (2 broadcast): 4 element-wise, 8 broadcast;
* gates: ``gate * h`` for t and for t0, after the attention and after the MLP: 4 broadcast;
  ``t_mask_select`` of h_attn, of the attention's gated output, of h_mlp, of the MLP's: 4 select;
* residual adds ``x + ...`` after the attention, the cross-attention and the MLP: 3 strided
  (x channel-major, the update contiguous);
* self-attention: qkv and proj linears (2 GEMMs); RMSNorm of q and of k, one statement a line
  as LlamaRMSNorm: ``x.float()``, ``pow(2)``, ``mean`` (a reduction), ``+ eps``, ``rsqrt``,
  ``x32 * rsqrt`` (broadcast), ``.to(dtype)``, ``weight * normed`` (broadcast): 10 element-wise,
  2 reductions, 4 broadcast; ``q * scale``: 1 element-wise; L <= B' in both blocks (16 <= 16,
  8 <= 32), so the plain product: score and value GEMMs (2), copies of the permuted q, k and v
  for ``torch.matmul`` (3 ``copy``), ``scores.float()``, softmax, ``probs.to(v.dtype)`` (2
  element-wise, 1 softmax), the output transpose + reshape (1 ``copy``);
* temporal block only: RoPE on q and on k (``x * cos`` and ``rotate_half(x) * sin`` broadcast;
  a cast, ``neg``, ``stack`` and the add element-wise): 4 broadcast, 8 element-wise; each of
  the two calls computes its own frequencies (``RotaryEmbedding.forward``: the step of
  ``arange(0, d, 2)``, ``/ d``, ``theta **``, ``1.0 /``: 4 element-wise; the outer product with
  the positions, ``cos``, ``sin``: 3 broadcast), which belong to the pair that reads them: 6
  broadcast, 8 element-wise; and the two rearranges ``B (T S) C -> (B S) T C`` and back (2
  ``copy``);
* cross-attention: the q linear copies x first (1 ``transpose_copy``), q, kv and proj linears
  (3 GEMMs), ``q * scale`` (1 element-wise), one xformers attention (1 ``flash_attention``);
* MLP: fc1 and fc2 (2 GEMMs), GELU (1).

Per pair (spatial + temporal): GEMM 2 * 9 = 18; LayerNorm 8; transpose_copy 2 * 5 = 10;
strided 6; select 8; GELU 2; flash_attention 2; softmax 2; reduction 4; copy 4 + 6 = 10;
broadcast (2 + 8 + 4 + 4) + (18 + 4 + 6) = 46; element-wise (4 + 10 + 1 + 2 + 1) + (18 + 8 + 8)
= 52.

With one sample per device (2x4) the two modulation adds of a block read a (1, 6, h) table
and a (1, 6, h) slice of t_mlp: no broadcast, so 4 of the 46 broadcast kernels are plain
element-wise ones there. ds_ulysses adds its 8 all-to-alls (q, k, v and the output of the
split temporal attention, q and the output of both cross-attentions).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("torch_xla")

from hlo_analyzer.cli import analyze_command  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402

MESHES = {"1x1": "none", "1x2": "ds_ulysses", "2x4": "ds_ulysses"}
PAIR = {"gemm": 18, "layer_norm": 8, "transpose_copy": 10, "strided": 6, "select": 8, "gelu": 2,
        "flash_attention": 2, "softmax": 2, "reduction": 4, "copy": 10, "broadcast": 46,
        "elementwise": 52}
#: The modulation adds that read a broadcast table when a device holds both samples.
MODULATION_ADDS = 4
ALL_TO_ALLS = 8


def kernel_class(kernel: dict) -> str:
    """``layer_norm``, ``copy(permuted input)`` -> ``copy``, ``stablehlo.dot_general+linear`` ->
    ``gemm`` (the report's kernel classes)."""
    if kernel["kind"] != "vector":
        return kernel["kind"]
    return kernel["name"].split("(", 1)[0]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> dict[str, dict[int | None, list[dict]]]:
    """Each mesh's kernels by pair (None: the embeddings)."""
    found = {}
    for mesh, strategy in MESHES.items():
        out = tmp_path_factory.mktemp(f"mesh{mesh}")
        subprocess.run([sys.executable, "-m", "tracing.cli", "--config", "tiny", "--strategy", strategy,
                        "--mesh", mesh, "--stage", "0", "--stage-ids", "0-0,1-1", "-o", str(out)],
                       check=True, capture_output=True, timeout=600)
        report = out / "report.json"
        assert run_click(analyze_command, [str(next(out.glob("*.mlir"))), "--hw", "h100-sxm",
                                           "--format", "json", "-o", str(report)]) == 0
        by_pair: dict[int | None, list[dict]] = {}
        for kernel in json.loads(report.read_text())["mapping"]["kernels"]:
            by_pair.setdefault(kernel["pair"], []).append(kernel)
        found[mesh] = by_pair
    return found


def test_one_device_launches_the_hand_count(kernels):
    assert Counter(map(kernel_class, kernels["1x1"][0])) == PAIR


def test_two_devices_launch_what_one_does_and_their_all_to_alls(kernels):
    """Both samples on each device: the same kernels, each on half the frames."""
    assert Counter(map(kernel_class, kernels["1x2"][0])) == {**PAIR, "collective": ALL_TO_ALLS}


def test_eight_devices_launch_both_norm_calls_and_both_copies(kernels):
    """XLA's common-subexpression elimination in the SPMD partitioner once merged the two
    ``norm1(x)`` (and ``norm2(x)``) of a block and their copies of x: 4 LayerNorms and 6
    transpose copies a pair. The official code runs both on every GPU."""
    expected = {**PAIR, "collective": ALL_TO_ALLS, "broadcast": PAIR["broadcast"] - MODULATION_ADDS,
                "elementwise": PAIR["elementwise"] + MODULATION_ADDS}
    assert Counter(map(kernel_class, kernels["2x4"][0])) == expected


def test_the_kernel_lists_agree_up_to_the_per_device_shapes(kernels):
    """The same kernels by name (class and what made it) on every mesh, the embeddings too, and
    every device's LayerNorm is one over its slice: 1/2 and 1/8 of the tokens."""
    def names(mesh: str, pair: int | None) -> Counter:
        return Counter(k["name"] for k in kernels[mesh][pair] if k["kind"] != "collective")

    for pair in (None, 0):
        one = names("1x1", pair)
        assert names("1x2", pair) == one
        eight = names("2x4", pair)
        # Pair 0: the modulation adds (module docstring). The embeddings: the sinusoidal
        # embeddings of t, t0 and fps multiply the (B, 1) values by the (1, 128) frequencies;
        # with one sample a device that is one value times a vector, no broadcast tensor.
        moved = Counter({"broadcast(add)": MODULATION_ADDS}) if pair == 0 else Counter({"broadcast(mul)": 3})
        assert eight - one == Counter({name.replace("broadcast", "elementwise"): n for name, n in moved.items()})
        assert one - eight == moved
    norm = {mesh: {k["shapes"] for k in kernels[mesh][0] if k["name"] == "layer_norm"} for mesh in MESHES}
    assert norm == {"1x1": {"2x128x64,1->2x128x64"}, "1x2": {"2x64x64,1->2x64x64"},
                    "2x4": {"1x32x64,1->1x32x64"}}
