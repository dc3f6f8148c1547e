"""Wan-VAE's decoder, one call of the official decode loop (models/zoo/videodit/wan_vae.py): the
shapes of a steady-state call, and its convolution FLOPs traced with trace-module against a hand
count written here from the configuration alone (tiny sizes, float32)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vae_trace import flops, traced_ops  # noqa: E402

from models.zoo.videodit.wan_vae import wan_vae_decoder  # noqa: E402

TINY = dict(dim=4, z_dim=4, height=4, width=4)   # the factory's defaults


def conv_flops(dim: int, z: int, h: int, w: int) -> tuple[int, int]:
    """(convolution FLOPs, attention score and value FLOPs) of one steady-state call on a latent
    frame of h x w: every convolution 2 x in x out x kernel x output frames x output pixels, but
    a 3x3 convolution with implicit zero padding (the upsamplings') counts the taps on real pixels
    only, (3H - 2)(3W - 2) per frame; the causal ones are padded explicitly (their zeros are
    input). Widths 4, 4, 2, 1 x dim; frames 1 -> 2 -> 4 across the two temporal upsamplings."""
    c, n = dim, h * w

    def conv(cin, cout, k, frames, pixels):
        return 2 * cin * cout * k * frames * pixels

    def padded(cin, cout, frames, hh, ww):
        return 2 * cin * cout * frames * (3 * hh - 2) * (3 * ww - 2)

    def res(cin, cout, frames, pixels):
        return (conv(cin, cout, 27, frames, pixels) + conv(cout, cout, 27, frames, pixels)
                + (conv(cin, cout, 1, frames, pixels) if cin != cout else 0))

    total = conv(z, z, 1, 1, n) + conv(z, 4 * c, 27, 1, n)                      # post-quant, in
    total += 2 * res(4 * c, 4 * c, 1, n) + conv(4 * c, 12 * c, 1, 1, n) + conv(4 * c, 4 * c, 1, 1, n)
    total += (3 * res(4 * c, 4 * c, 1, n) + conv(4 * c, 8 * c, 3, 1, n)         # stage 1, 3-D up
              + padded(4 * c, 2 * c, 2, 2 * h, 2 * w))
    total += (res(2 * c, 4 * c, 2, 4 * n) + 2 * res(4 * c, 4 * c, 2, 4 * n)    # stage 2, 3-D up
              + conv(4 * c, 8 * c, 3, 2, 4 * n) + padded(4 * c, 2 * c, 4, 4 * h, 4 * w))
    total += 3 * res(2 * c, 2 * c, 4, 16 * n) + padded(2 * c, c, 4, 8 * h, 8 * w)  # stage 3, 2-D up
    total += 3 * res(c, c, 4, 64 * n) + conv(c, 3, 27, 4, 64 * n)               # stage 4, head
    return total, 2 * (2 * n * n * 4 * c)


def test_a_call_makes_four_frames_of_one_latent_frame_and_updates_every_cache():
    decoder = wan_vae_decoder(**TINY)
    with torch.no_grad():  # a decode, as the official sampler runs it
        video, *caches = decoder(torch.randn(1, 4, 1, 4, 4))
    assert video.shape == (1, 3, 4, 32, 32)
    assert float(video.abs().max()) <= 1.0
    buffers = [b for name, b in decoder.named_buffers() if name.endswith("cache")]
    # 3x3x3 convolutions: in, 2 x 2 middle, 2 x 12 stages, head; (3, 1, 1): 2 upsamplings
    assert len(caches) == len(buffers) == 1 + 4 + 24 + 1 + 2
    assert [c.shape for c in caches] == [b.shape for b in buffers]


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.parametrize("dim, z, h, w", [(4, 4, 4, 4), (96, 16, 60, 104)], ids=["tiny", "released-480p"])
def test_traced_convolution_flops_equal_the_hand_count(tmp_path, dim, z, h, w):
    """The tiny decoder, and the released one on a 480 x 832 video's latent frame (a trace of
    about 7 s and 1 GiB: placeholders, no data)."""
    pytest.importorskip("torch_xla")
    ops = traced_ops(tmp_path, "models.zoo.videodit.wan_vae:wan_vae_decoder",
                     dict(dim=dim, z_dim=z, height=h, width=w), f"1x{z}x1x{h}x{w}", "float32")
    convs = flops(ops, "stablehlo.convolution")
    attention = flops(ops, "stablehlo.dot_general", "einsum")
    assert (convs, attention) == conv_flops(dim, z, h, w)
