"""How a generation's VAE decode is cut into calls (models/opensora/vae_config.py), by hand."""

import pytest

from models.opensora.vae_config import FULL_VAE, TINY_VAE, decode_plan, get_vae_config


def test_released_vae_chunks_and_frames():
    """17 frames make 5 latent frames; the temporal decoder upsamples 4x in time (20 frames) and
    drops the 3 frames that pad 17 to a multiple of 4."""
    assert (FULL_VAE.micro_z_frames, FULL_VAE.time_factor, FULL_VAE.time_padding) == (5, 4, 3)
    assert TINY_VAE.time_factor == 4  # the tiny decoder keeps the chunking


@pytest.mark.parametrize("shape, chunks, calls, last, height, width", [
    ("204_640_360", 12, 51, 4, 45, 80),    # 60 latent frames; 204 = 51 x 4
    ("408_640_360", 24, 102, 4, 45, 80),
    ("51_1280_720", 3, 13, 3, 90, 160),    # 15 latent frames; 51 = 12 x 4 + 3
    ("102_1280_720", 6, 26, 2, 90, 160),   # 102 = 25 x 4 + 2
])
def test_decode_plan_of_the_reference_shapes(shape, chunks, calls, last, height, width):
    plan = decode_plan(shape)
    assert (plan.chunks, plan.spatial_calls, plan.last_call_frames) == (chunks, calls, last)
    assert (plan.latent_height, plan.latent_width) == (height, width)
    assert plan.frames == 17 * chunks
    assert plan.spatial_call_equivalents == pytest.approx(plan.frames / 4)


def test_frames_that_make_no_whole_chunk_are_refused():
    with pytest.raises(ValueError, match="multiple of 17 frames"):
        decode_plan("100_640_360")  # 29 latent frames
    with pytest.raises(ValueError, match="expected one of full, tiny"):
        get_vae_config("huge")
