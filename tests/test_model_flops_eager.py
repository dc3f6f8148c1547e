"""The analytic counts against FlopCounterMode on an eager forward (needs torch)."""

import pytest

from models.opensora.flops import gemm_flops, parameter_count

torch = pytest.importorskip("torch")

from test_model_flops import FULL, TINY
from torch.utils.flop_counter import FlopCounterMode

from models.opensora.inputs import make_inputs
from models.opensora.stdit3 import STDiT3
from models.opensora.token_order import TOKEN_ORDERS


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return STDiT3(TINY).eval()


# Space-major tokens add transposes of x, which are no FLOPs: the count must not move.
# The official path embeds the timestep 0 too: t_embedder and t_block run twice.
@pytest.mark.parametrize("official", [False, True])
@pytest.mark.parametrize("token_order", TOKEN_ORDERS)
@pytest.mark.parametrize("shape, batch", [("17_64_64", 2), ("17_72_56", 2), ("30_40_24", 3)])
def test_flop_counter_agrees_exactly_with_analytic_count(tiny_model, shape, batch, token_order, official):
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        tiny_model(**make_inputs(TINY, shape, batch=batch), token_order=token_order, official=official)
    counts = gemm_flops(TINY, shape, batch=batch, official=official)
    assert counter.get_total_flops() == counts["forward"]["total"]

    measured = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    for name, flops in counts["embedding_modules"].items():
        assert measured[f"STDiT3.{name}"] == flops, name
    assert measured["STDiT3.final_layer"] == counts["forward"]["final_layer"]
    per_block = counts["per_block"]
    for pair in range(TINY.depth):
        spatial, temporal = f"STDiT3.spatial_blocks.{pair}", f"STDiT3.temporal_blocks.{pair}"
        assert measured[f"{spatial}.attn"] == per_block["spatial_self_attention"]
        assert measured[f"{temporal}.attn"] == per_block["temporal_self_attention"]
        assert (measured[f"{spatial}.cross_attn"] + measured[f"{temporal}.cross_attn"]
                == per_block["cross_attention"])
        assert measured[f"{spatial}.mlp"] + measured[f"{temporal}.mlp"] == per_block["mlp"]


def test_built_models_have_the_predicted_parameter_count(tiny_model):
    assert sum(p.numel() for p in tiny_model.parameters()) == parameter_count(TINY)
    with torch.device("meta"):  # no storage: the full model would need ~4.8 GB in float32
        full = STDiT3(FULL)
    assert sum(p.numel() for p in full.parameters()) == parameter_count(FULL) == 1_207_643_936
