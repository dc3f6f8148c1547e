"""Shape strings, geometry, configs and the input builder."""

import pytest

from hlo_trace.errors import UsageError
from models.opensora.config import CONFIGS, STDiT3Config, get_config
from models.opensora.errors import ConfigError, ShapeError
from models.opensora.inputs import VideoShape, geometry, parse_shape

TINY = get_config("tiny")


def test_parse_shape():
    assert parse_shape("204_640_360") == VideoShape(frames=204, width=640, height=360)
    assert str(parse_shape("51_1280_720")) == "51_1280_720"


@pytest.mark.parametrize("text", ["", "204x640x360", "204_640", "204_640_360_1", "a_b_c",
                                  "204_-640_360", "0_640_360", "204_640_360.5",
                                  " 51_1280_720 ", "\u0662\u0668_64_64"])  # issue 24: strict ASCII
def test_malformed_shape_strings(text):
    with pytest.raises(ShapeError) as info:
        parse_shape(text)
    message = str(info.value)
    assert isinstance(info.value, UsageError)
    assert repr(text) in message and "\n" not in message


@pytest.mark.parametrize("text", ["3_640_360", "204_4_360", "204_640_7"])
def test_too_small_to_patch(text):
    with pytest.raises(ShapeError, match=f"{text} is too small to patch"):
        geometry(TINY, text)


def test_tiny_geometry_and_padding():
    geo = geometry(TINY, "17_64_64")
    assert (geo.T_lat, geo.H_lat, geo.W_lat, geo.T, geo.S, geo.N) == (5, 8, 8, 5, 16, 80)
    odd = geometry(TINY, "17_72_56")  # latent 7 x 9 -> patches ceil(7/2) x ceil(9/2) = 4 x 5
    assert (odd.H_lat, odd.W_lat, odd.H_patches, odd.W_patches, odd.S) == (7, 9, 4, 5, 20)


def test_configs():
    assert get_config("tiny") is CONFIGS["tiny"]
    assert (TINY.hidden_size, TINY.depth, TINY.num_heads, TINY.caption_channels,
            TINY.model_max_length, TINY.head_dim) == (64, 2, 4, 32, 8, 16)
    full = get_config("full")
    assert (full.hidden_size, full.depth, full.num_heads, full.head_dim, full.patch_size,
            full.caption_channels, full.model_max_length) == (1152, 28, 16, 72, (1, 2, 2), 4096, 300)


def test_config_from_toml(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text("hidden_size = 128\ndepth = 3\nnum_heads = 8\npatch_size = [1, 2, 2]\n")
    config = get_config(path)
    assert config == STDiT3Config(hidden_size=128, depth=3, num_heads=8)
    (tmp_path / "bad.toml").write_text("hidden_size = 128\ncolour = 'red'\n")
    with pytest.raises(ConfigError, match="unknown keys \\['colour'\\]"):
        get_config(tmp_path / "bad.toml")


def test_unknown_config_name():
    with pytest.raises(ConfigError, match="unknown model config 'huge'"):
        get_config("huge")


def test_inconsistent_config():
    with pytest.raises(ConfigError, match="not a multiple of num_heads"):
        STDiT3Config(hidden_size=100, num_heads=3)
