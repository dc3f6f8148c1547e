"""CogVideoX's VAE decoder, one call of the official tiled decode (models/zoo/videodit/cogvideox_vae.py):
the shapes of a call, the released size's parameter count, the calls of a decode, and a call's
convolution FLOPs traced with trace-module against a hand count written here from the
configuration alone."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from vae_trace import flops, traced_ops  # noqa: E402

from models.zoo.videodit.cogvideox_vae import cogvideox_vae_decoder  # noqa: E402
from models.zoo.videodit.companions import COMPANIONS  # noqa: E402

TINY = dict(widths=(8, 16, 16, 32), z_dim=4, layers=3, groups=4, temporal=2)   # the factory's defaults
RELEASED = dict(widths=(128, 256, 256, 512), z_dim=16, layers=3, groups=32, temporal=2)
#: the released decoder's parameters, counted by building diffusers 0.42's AutoencoderKLCogVideoX
#: with the released vae/config.json on the meta device (docs/sources.md)
RELEASED_DECODER_PARAMETERS = 123_368_451


def frames_after(frames: int) -> int:
    """Nearest 2x in time, an odd count's first frame kept single."""
    return 2 * frames - frames % 2 if frames > 1 else frames


def conv_flops(widths: tuple[int, ...], z: int, layers: int, frames: int, h: int, w: int) -> int:
    """Convolution FLOPs of one call on ``frames`` latent frames of an h x w tile: a causal 3x3x3
    convolution 2 x in x out x 3 x output frames x (3H - 2)(3W - 2) (height and width padded
    implicitly: the analyzer counts the taps on real pixels only; time joined to two cached
    frames), a 3x3 one per frame the same without the 3, a 1x1x1 one 2 x in x out x frames x
    pixels; every spatial norm two 1x1x1 convolutions of the latent (z -> width)."""
    def k3(cin, cout, t, hh, ww, time=3):
        return 2 * cin * cout * time * t * (3 * hh - 2) * (3 * ww - 2)

    def k1(cin, cout, t, hh, ww):
        return 2 * cin * cout * t * hh * ww

    def res(cin, cout, t, hh, ww):
        norms = 2 * k1(z, cin, t, hh, ww) + 2 * k1(z, cout, t, hh, ww)
        short = k1(cin, cout, t, hh, ww) if cin != cout else 0
        return norms + k3(cin, cout, t, hh, ww) + k3(cout, cout, t, hh, ww) + short

    c0, c1, c2, c3 = reversed(widths)
    f1 = frames_after(frames)
    f2 = frames_after(f1)
    total = k3(z, c0, frames, h, w) + 2 * res(c0, c0, frames, h, w)                    # in, middle
    total += layers * res(c0, c0, frames, h, w) + res(c0, c0, frames, h, w)           # stage 0
    total += k3(c0, c0, f1, 2 * h, 2 * w, time=1)                                     # up, 2x in time
    total += res(c0, c1, f1, 2 * h, 2 * w) + layers * res(c1, c1, f1, 2 * h, 2 * w)   # stage 1
    total += k3(c1, c1, f2, 4 * h, 4 * w, time=1)                                     # up, 2x in time
    total += (layers + 1) * res(c2, c2, f2, 4 * h, 4 * w)                             # stage 2
    total += k3(c2, c2, f2, 8 * h, 8 * w, time=1)                                     # up, 2-D
    total += res(c2, c3, f2, 8 * h, 8 * w) + layers * res(c3, c3, f2, 8 * h, 8 * w)   # stage 3
    return total + 2 * k1(z, c3, f2, 8 * h, 8 * w) + k3(c3, 3, f2, 8 * h, 8 * w)      # head


@pytest.mark.parametrize("frames, out", [(2, 8), (3, 9)])
def test_a_call_decodes_its_latent_frames_and_updates_every_cache(frames, out):
    decoder = cogvideox_vae_decoder()
    video, *caches = decoder(torch.randn(1, 4, frames, 4, 4))
    assert video.shape == (1, 3, out, 32, 32)
    buffers = [b for name, b in decoder.named_buffers() if name.endswith("cache")]
    # 3x3x3 convolutions: in, 2 x 2 middle, 2 x 16 stages, head
    assert len(caches) == len(buffers) == 1 + 4 + 32 + 1
    assert [c.shape for c in caches] == [b.shape for b in buffers]


def test_the_released_decoder_has_the_released_parameter_count():
    with torch.device("meta"):
        decoder = cogvideox_vae_decoder(**RELEASED, height=30, width=45)
    assert sum(p.numel() for p in decoder.parameters()) == RELEASED_DECODER_PARAMETERS


def test_the_decode_at_480p_is_nine_tiles_of_six_calls():
    """60 x 90 latent pixels in tiles of 30 x 45 every 25 x 36: rows at 0, 25, 50 (30, 30, 10
    high), columns at 0, 36, 72 (45, 45, 18 wide); 13 latent frames: a call of 3, five of 2."""
    calls = {c.shape: c.count for c in COMPANIONS["cogvideox_5b"].decode_calls(49, 480, 720)}
    by_hand = {}
    for (th, tw), tiles in {(30, 45): 4, (30, 18): 2, (10, 45): 2, (10, 18): 1}.items():
        by_hand[f"3x{th}x{tw}"] = tiles
        by_hand[f"2x{th}x{tw}"] = 5 * tiles
    assert calls == by_hand
    frames = sum(frames_after(frames_after(int(s.split("x")[0]))) * n for s, n in calls.items()) / 9
    assert frames == 49


def _traced_conv_flops(tmp_path: Path, kwargs: dict, latent: str, dtype: str) -> int:
    ops = traced_ops(tmp_path, "models.zoo.videodit.cogvideox_vae:cogvideox_vae_decoder", kwargs, latent, dtype)
    return flops(ops, "stablehlo.convolution")


@pytest.mark.trace
@pytest.mark.parametrize("frames", [2, 3])
def test_traced_convolution_flops_of_a_tiny_call_equal_the_hand_count(tmp_path, frames):
    pytest.importorskip("torch_xla")
    latent = f"1x4x{frames}x4x6"
    traced = _traced_conv_flops(tmp_path, {**TINY, "height": 4, "width": 6}, latent, "float32")
    assert traced == conv_flops(TINY["widths"], 4, 3, frames, 4, 6)


@pytest.mark.slow
@pytest.mark.trace
def test_traced_convolution_flops_of_a_released_tile_call_equal_the_hand_count(tmp_path):
    """The released decoder on a full 30 x 45 tile, 2 latent frames, in bfloat16 (a trace of
    about 5 s and 1 GiB: placeholders, no data)."""
    pytest.importorskip("torch_xla")
    traced = _traced_conv_flops(tmp_path, {**RELEASED, "height": 30, "width": 45}, "1x16x2x30x45", "bfloat16")
    assert traced == conv_flops(RELEASED["widths"], 16, 3, 2, 30, 45)
