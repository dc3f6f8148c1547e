"""HunyuanVideo's VAE decoder, one call (one tile) of the official tiled decode
(models/zoo/videodit/hunyuan_vae.py): the shapes of a call, the released size's parameter count,
the calls of a decode at 720p, and a call's convolution and attention FLOPs traced with
trace-module against a hand count written here from the configuration alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vae_trace import flops, traced_ops  # noqa: E402

from models.zoo.videodit.companions import COMPANIONS  # noqa: E402
from models.zoo.videodit.hunyuan_vae import hunyuan_vae_decoder  # noqa: E402

TINY = dict(widths=(8, 16, 32, 32), z_dim=4, layers=2, groups=4, temporal=2)   # the factory's defaults
RELEASED = dict(widths=(128, 256, 512, 512), z_dim=16, layers=2, groups=32, temporal=2)
#: the released decoder's parameters and post_quant_conv's (272), counted by building diffusers
#: 0.42's AutoencoderKLHunyuanVideo with the released configuration on the meta device
#: (docs/sources.md)
RELEASED_DECODER_PARAMETERS = 146_136_067 + 272


def hand_flops(widths: tuple[int, ...], z: int, layers: int, frames: int, h: int, w: int) -> tuple[int, int]:
    """(convolution FLOPs, attention score and value FLOPs) of one call on ``frames`` latent
    frames of an h x w tile. Every causal convolution pads by replication (a copy: its taps all
    count): 2 x in x out x 27 x frames x pixels for 3x3x3, without the 27 for 1x1x1. Widths
    512, 512, 256, 128; the upsamplings 2x in height and width, the last two also 2x in time
    less one (the first frame kept single): frames F -> 2F - 1 -> 4F - 3."""
    def k3(cin, cout, t, hh, ww):
        return 2 * cin * cout * 27 * t * hh * ww

    def k1(cin, cout, t, hh, ww):
        return 2 * cin * cout * t * hh * ww

    def res(cin, cout, t, hh, ww):
        return k3(cin, cout, t, hh, ww) + k3(cout, cout, t, hh, ww) + (k1(cin, cout, t, hh, ww) if cin != cout else 0)

    c0, c1, c2, c3 = reversed(widths)
    f1, f2 = 2 * frames - 1, 4 * frames - 3
    n = layers + 1
    total = k1(z, z, frames, h, w) + k3(z, c0, frames, h, w) + 2 * res(c0, c0, frames, h, w)  # post-quant, in, middle
    total += n * res(c0, c0, frames, h, w) + k3(c0, c0, frames, 2 * h, 2 * w)                # stage 0, 2-D up
    total += res(c0, c1, frames, 2 * h, 2 * w) + (n - 1) * res(c1, c1, frames, 2 * h, 2 * w)
    total += k3(c1, c1, f1, 4 * h, 4 * w)                                                    # stage 1, 3-D up
    total += res(c1, c2, f1, 4 * h, 4 * w) + (n - 1) * res(c2, c2, f1, 4 * h, 4 * w)
    total += k3(c2, c2, f2, 8 * h, 8 * w)                                                    # stage 2, 3-D up
    total += res(c2, c3, f2, 8 * h, 8 * w) + (n - 1) * res(c3, c3, f2, 8 * h, 8 * w)
    total += k3(c3, 3, f2, 8 * h, 8 * w)                                                     # head
    tokens = frames * h * w
    return total, 2 * (2 * tokens * tokens * c0)


def test_a_call_decodes_its_tile_four_times_in_time_less_three():
    video = hunyuan_vae_decoder()(torch.randn(1, 4, 5, 4, 6))
    assert video.shape == (1, 3, 17, 32, 48)


def test_the_released_decoder_has_the_released_parameter_count():
    with torch.device("meta"):
        decoder = hunyuan_vae_decoder(**RELEASED)
    assert sum(p.numel() for p in decoder.parameters()) == RELEASED_DECODER_PARAMETERS


def test_the_decode_at_720p_is_three_temporal_tiles_of_28_spatial_tiles():
    """33 x 90 x 160 latent: frames from 0, 12, 24 (17, 17, 9 of them); rows from 0, 24, 48, 72
    (32, 32, 32, 18 high), columns from 0, 24, ..., 144 (six 32 wide, one 16)."""
    calls = {c.shape: c.count for c in COMPANIONS["hunyuan_video"].decode_calls(129, 720, 1280)}
    by_hand = {}
    for (th, tw), tiles in {(32, 32): 18, (32, 16): 3, (18, 32): 6, (18, 16): 1}.items():
        by_hand[f"17x{th}x{tw}"] = 2 * tiles
        by_hand[f"9x{th}x{tw}"] = tiles
    assert calls == by_hand


@pytest.mark.trace
def test_traced_flops_of_a_tiny_call_equal_the_hand_count(tmp_path):
    pytest.importorskip("torch_xla")
    ops = traced_ops(tmp_path, "models.zoo.videodit.hunyuan_vae:hunyuan_vae_decoder", TINY, "1x4x5x4x6",
                     "float32")
    traced = flops(ops, "stablehlo.convolution"), flops(ops, "stablehlo.dot_general", "einsum")
    assert traced == hand_flops(TINY["widths"], 4, 2, 5, 4, 6)


@pytest.mark.slow
@pytest.mark.trace
def test_traced_flops_of_a_released_tile_call_equal_the_hand_count(tmp_path):
    """The released decoder on a full 17 x 32 x 32 tile in float16 (a trace of about 5 s and
    1 GiB: placeholders, no data)."""
    pytest.importorskip("torch_xla")
    ops = traced_ops(tmp_path, "models.zoo.videodit.hunyuan_vae:hunyuan_vae_decoder", RELEASED,
                     "1x16x17x32x32", "float16")
    traced = flops(ops, "stablehlo.convolution"), flops(ops, "stablehlo.dot_general", "einsum")
    assert traced == hand_flops(RELEASED["widths"], 16, 2, 17, 32, 32)
