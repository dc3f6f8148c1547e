"""The peak memory of one OpenSora v1.2 generation (``models.opensora.memory``): its parameter
counts against the configurations and the project's own decoders, and its activation terms by
hand at one shape."""

from __future__ import annotations

import pytest

from models.opensora.config import get_config
from models.opensora.errors import ShapeError
from models.opensora.flops import parameter_count
from models.opensora.inputs import (
    OPENSORA_DURATIONS,
    OPENSORA_RESOLUTIONS,
    geometry,
    opensora_shape,
)
from models.opensora.memory import (
    SPATIAL_VAE_PARAMETERS,
    SPATIAL_VAE_PARTS,
    TEMPORAL_VAE_PARAMETERS,
    TEMPORAL_VAE_PARTS,
    generation_peak,
    stdit_step_activation_bytes,
    t5_encoder_parameters,
    vae_decode_activation_bytes,
)


def test_the_published_table_names_twelve_shapes_with_whole_latents():
    shapes = [opensora_shape(r, d) for r in OPENSORA_RESOLUTIONS for d in OPENSORA_DURATIONS]
    assert shapes[:4] == ["51_640_360", "102_640_360", "204_640_360", "408_640_360"]
    assert opensora_shape("480p", "4s") == "102_854_480"
    # 854 x 480 -> a 106 x 60 latent (854 // 8), 53 x 30 patches of 2 x 2: no padding
    geo = geometry(get_config("full"), "102_854_480")
    assert (geo.T, geo.H_patches, geo.W_patches) == (30, 30, 53)
    with pytest.raises(ShapeError):
        opensora_shape("1080p", "2s")


def test_t5_v1_1_xxl_encoder_parameters():
    # embedding 32128 x 4096; 24 layers of q, k, v, o (4096 x 4096), wi_0, wi_1, wo (4096 x 10240)
    # and two norms; 32 x 64 relative buckets; the final norm
    layer = 4 * 4096 * 4096 + 3 * 4096 * 10240 + 2 * 4096
    assert t5_encoder_parameters() == 32128 * 4096 + 24 * layer + 32 * 64 + 4096 == 4_762_310_656


def test_the_vae_counts_hold_the_project_decoders():
    torch = pytest.importorskip("torch")
    from models.opensora.vae import SpatialDecoder, TemporalDecoder
    from models.opensora.vae_config import FULL_VAE

    with torch.device("meta"):
        temporal, spatial = TemporalDecoder(FULL_VAE), SpatialDecoder(FULL_VAE)

    def count(module):
        return sum(p.numel() for p in module.parameters())

    # each decoder module is the official decoder and its post_quant_conv
    assert count(temporal) == TEMPORAL_VAE_PARTS["decoder"] + TEMPORAL_VAE_PARTS["post_quant_conv"]
    assert count(spatial) == SPATIAL_VAE_PARTS["decoder"] + SPATIAL_VAE_PARTS["post_quant_conv"]
    assert TEMPORAL_VAE_PARAMETERS + SPATIAL_VAE_PARAMETERS == 393_341_007


def test_stdit_step_by_hand_at_408_1280_720():
    # B = 2, N = 120 x 3600 tokens, hidden 1152: X = 2 * 432000 * 1152 * 2 bytes; the temporal
    # scores A = 2 * 3600 * 16 * 120 * 120 * 2 = X * 16 * 120 / 1152
    x = 2 * 432_000 * 1152 * 2
    scores = 2 * 3600 * 16 * 120 * 120 * 2
    assert stdit_step_activation_bytes("408_1280_720") == max(14 * x, 8 * x + 4 * scores) == 8 * x + 4 * scores
    # at 60 latent frames the MLP is the larger point
    x = 2 * 216_000 * 1152 * 2
    assert stdit_step_activation_bytes("204_1280_720") == 14 * x


def test_vae_decode_and_the_total():
    video = 51 * 3 * 480 * 848 * 2  # 854 pixels decode to 848 (106 latent columns)
    assert vae_decode_activation_bytes("51_854_480", 10**9) == video + 10**9
    assert vae_decode_activation_bytes("51_854_480", 1) == 2 * video
    peak = generation_peak("204_640_360", 2 * 10**9)
    assert peak.weight_bytes == 4 * 4_762_310_656 + 2 * parameter_count(get_config("full")) + 2 * 393_341_007
    assert peak.total_bytes == peak.weight_bytes + max(peak.stdit_activation_bytes, peak.vae_activation_bytes)
    assert peak.phase == "STDiT3 step"
