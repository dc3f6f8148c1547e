"""Shape strings, geometry, configs and the input builder."""

import pytest

from models.opensora.config import get_config

TINY = get_config("tiny")

torch = pytest.importorskip("torch")

from models.opensora.inputs import make_inputs


def test_make_inputs_shapes_and_determinism():
    a = make_inputs(TINY, "17_72_56", batch=2)
    assert {k: tuple(v.shape) for k, v in a.items()} == {
        "z": (2, 4, 5, 7, 9), "y": (2, 1, 8, 32), "t": (2,), "fps": (1,)}
    b = make_inputs(TINY, "17_72_56", batch=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    bf16 = make_inputs(TINY, "17_64_64", dtype=torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in bf16.values())


def test_make_inputs_full_size_on_meta():
    inputs = make_inputs(get_config("full"), "204_640_360", device="meta")
    assert tuple(inputs["z"].shape) == (2, 4, 60, 45, 80)
    assert tuple(inputs["y"].shape) == (2, 1, 300, 4096)
    assert inputs["z"].device.type == "meta"
