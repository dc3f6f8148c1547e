"""OpenSora v1.2's VAE decoders (models/opensora/vae.py) and ``trace-vae-decode``.

The spatial decoder must compute what diffusers' ``AutoencoderKL`` decoder computes (the SDXL VAE
OpenSora loads); the temporal decoder must be causal in time and make 17 frames of 5 latent ones.
The traced tiny decoders are then mapped with ``--exec torch`` on h100-sxm and their kernels
counted by hand from the tiny config (TINY_VAE):

* spatial: widths (16, 8) from the widest; conv_in, a mid block of two residual blocks around a
  one-head attention, two up blocks of two residual blocks (the second 16 -> 8 with a 1x1
  shortcut), one upsampler (nearest 2x + conv), conv_out, and a 1x1 post_quant_conv. GroupNorms:
  2 x 2 (mid) + 1 (attention) + 4 x 2 (up) + 1 (norm_out) = 14. Convolutions with a 3x3 window:
  1 + 4 + 8 + 1 + 1 = 15; convolutions in all 17. The attention returns its result channels-last
  (``transpose(-1, -2).reshape``) and adds the residual to it, so the residual stream is
  channels-last from there on: the upsampling keeps it so, and the upsampler's convolution reads
  it as cuDNN wants it; the 14 other windowed convolutions read a GroupNorm's contiguous output
  (or the latent) and pay cuDNN's two layout transposes (28).
  GEMMs: 17 convolutions, q, k, v and out projections, the two attention products, and the
  1-wide outer product the upsampling's index lowering makes (24); the upsampling itself is no GEMM.
* temporal: widths (8, 16, 16); conv1, one residual block at the top, three levels of one block
  each (the last 16 -> 8 with a 1x1x1 shortcut), two time upsamplers, conv_out, and a 1x1x1
  post_quant_conv. GroupNorms: 2 + 3 x 2 + 1 = 9; 3x3x3 convolutions: 1 + 2 + 6 + 2 + 1 = 12
  (24 transposes: nothing is channels-last there); convolutions in all 14, no other GEMM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from models.opensora.vae import CausalConv3d, SpatialDecoder, TemporalDecoder  # noqa: E402
from models.opensora.vae_config import TINY_VAE, VAEConfig  # noqa: E402

SHAPE = "51_64_64"  # 3 chunks of 5 latent frames at 8 x 8; 51 frames = 12.75 spatial calls


def _diffusers_name(name: str) -> str:
    """diffusers' decoder parameter name -> the project's."""
    name = name.removeprefix("decoder.")
    for old, new in (("mid_block.resnets.0", "mid.0"), ("mid_block.attentions.0", "mid.1"),
                     ("mid_block.resnets.1", "mid.2"), ("conv_norm_out", "norm_out"), ("to_out.0", "to_out")):
        name = name.replace(old, new)
    name = re.sub(r"up_blocks\.(\d+)\.resnets\.(\d+)", r"up_blocks.\1.\2", name)
    return re.sub(r"up_blocks\.(\d+)\.upsamplers\.0\.conv", r"upsamplers.\1", name)


def test_spatial_decoder_is_the_sdxl_vae_decoder_of_diffusers():
    """The same random weights (norms too) in both: the same images, to float32 rounding."""
    diffusers = pytest.importorskip("diffusers")
    config = VAEConfig(spatial_block_channels=(32, 64), spatial_layers_per_block=1, spatial_groups=8,
                       spatial_attention_head_dim=64)
    torch.manual_seed(0)
    reference = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=8,
        block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2).eval()
    state = {name: torch.randn_like(value) * 0.2 for name, value in reference.state_dict().items()}
    reference.load_state_dict(state)
    ours = SpatialDecoder(config).eval()
    ours.load_state_dict({_diffusers_name(name): value for name, value in state.items()
                          if name.startswith(("decoder.", "post_quant_conv."))}, strict=True)
    z = torch.randn(3, 4, 6, 5)
    with torch.no_grad():
        expected = reference.decode(z / config.scaling_factor).sample
        got = ours(z)
    assert got.shape == (3, 3, 12, 10)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_temporal_decoder_makes_17_frames_of_5_latent_ones():
    decoder = TemporalDecoder(TINY_VAE).eval()
    with torch.no_grad():
        assert decoder(torch.randn(1, 4, 5, 6, 7)).shape == (1, 4, 17, 6, 7)


def test_causal_convolution_reads_no_later_frame():
    """Output frame t of a 3x3x3 causal convolution reads input frames t-2..t: changing frame 5
    of 8 leaves frames 0-4 alone and changes 5-7 (same length out: padded 2 frames in front)."""
    torch.manual_seed(0)
    conv = CausalConv3d(3, 4, 3).eval()
    x = torch.randn(1, 3, 8, 5, 5)
    changed = x.clone()
    changed[:, :, 5] += 1.0
    with torch.no_grad():
        before, after = conv(x), conv(changed)
    assert before.shape == (1, 4, 8, 5, 5)
    assert torch.equal(before[:, :, :5], after[:, :, :5])
    assert all(not torch.allclose(before[:, :, t], after[:, :, t]) for t in (5, 6, 7))


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    pytest.importorskip("torch_xla")
    out = tmp_path_factory.mktemp("vae")
    mappings = {}
    for part in ("spatial", "temporal"):
        subprocess.run([sys.executable, "-m", "tracing.vae_decode", "--part", part, "--shape", SHAPE,
                        "--config", "tiny", "-o", str(out)], check=True, capture_output=True)
        dump = out / f"vae_tiny_{SHAPE}_{part}.mlir"
        report = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", "h100-sxm",
                                 "--format", "json"], check=True, capture_output=True, text=True)
        mappings[part] = (json.loads(dump.with_suffix(".json").read_text()), json.loads(report.stdout)["mapping"])
    return mappings


def _classes(mapping: dict) -> Counter:
    return Counter(k["kind"] if k["kind"] != "vector" else k["name"].split("(")[0] for k in mapping["kernels"])


@pytest.mark.parametrize("part, group_norms, transposing, gemms", [("spatial", 14, 14, 24), ("temporal", 9, 12, 14)])
def test_traced_decoders_one_kernel_per_library_call(traced, part, group_norms, transposing, gemms):
    sidecar, mapping = traced[part]
    assert mapping["execution"] == "torch"  # the sidecar's library calls: a traced PyTorch model
    classes = _classes(mapping)
    assert classes["group_norm"] == group_norms
    assert classes["layout_transpose"] == 2 * transposing
    assert classes["gemm"] == gemms
    assert sidecar["calls_per_sample"] == pytest.approx(3 if part == "temporal" else 51 / 4)


def test_the_upsampling_is_one_memory_bound_kernel(traced):
    _, mapping = traced["spatial"]
    upsampling = [k for k in mapping["kernels"] if "upsample" in k["name"]]
    assert len(upsampling) == 1 and upsampling[0]["kind"] == "vector"


def test_the_channels_last_residual_stream_is_copied_before_each_group_norm(traced):
    """After the mid block's attention, every GroupNorm that reads the residual stream copies it
    first (PyTorch's GroupNorm needs it contiguous): norm1 of the mid block's second residual
    block and of the four up-block residual blocks (their norm2 reads conv1's contiguous result),
    and norm_out: 6 transpose copies of the stream. The attention's residual add and each of
    those five residual blocks' (its contiguous conv2 result onto the channels-last stream) mix
    layouts: 6 strided adds; the upsampler's convolution pays no layout transposes (see above)."""
    _, mapping = traced["spatial"]
    four_d = [k for k in mapping["kernels"] if len(k["shapes"].split("->")[0].split(",")[0].split("x")) == 4]
    assert sum(k["name"] == "transpose_copy(transposed input)" for k in four_d) == 6
    assert sum(k["name"] == "strided(add)" for k in four_d) == 6


def test_bad_shape_is_one_line_and_exit_code_2(tmp_path):
    pytest.importorskip("torch_xla")
    result = subprocess.run([sys.executable, "-m", "tracing.vae_decode", "--part", "spatial", "--shape",
                             "100_640_360", "-o", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: ") and "multiple of 17 frames" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())
