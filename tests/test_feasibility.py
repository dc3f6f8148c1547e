"""The strategies' feasibility rules (plans.feasibility): one rule per strategy, hand-derived
verdicts and messages, and the tracer's strategies refusing exactly what the rules refuse. No
torch: the strategies' classes import without it."""

import pytest

from hlo_trace.errors import UsageError
from models.opensora.config import get_config
from models.opensora.inputs import geometry
from models.opensora.parallel import STRATEGY_NAMES
from models.opensora.token_order import FRAME_MAJOR, SPACE_MAJOR
from plans.config import build_config
from plans.feasibility import RULES, Layout, StrategyError, check_layout, check_stage, token_order
from tracing.strategies import get_strategy, strategy_names

FULL = get_config("full")  # 16 heads, hidden 1152, mlp hidden 4608, 300 caption tokens


def layout(mesh: tuple[int, int], shape: str = "204_640_360", **kwargs) -> Layout:
    # 204_640_360: T = 60, S = 920
    return Layout(model=FULL, geometry=geometry(FULL, shape), batch=2, mesh_shape=mesh, **kwargs)


def test_one_rule_per_strategy_of_the_table_and_of_the_tracer():
    assert sorted(RULES) == sorted(STRATEGY_NAMES) == strategy_names()


@pytest.mark.parametrize(("strategy", "mesh", "message"), [
    # megatron splits the 16 heads over all 3 devices
    ("megatron", (1, 3), "strategy megatron: heads = 16 is not divisible by the 3 devices of "
                         "mesh x*y (mesh 1x3)"),
    # dp splits the batch of 2 over all 4 devices
    ("dp", (2, 2), "strategy dp: batch = 2 is not divisible by the 4 devices of mesh x*y (mesh 2x2)"),
    # T = 60 and S = 920 are both not divisible by 7
    ("ds_ulysses", (1, 7), "strategy ds_ulysses: neither the temporal tokens T = 60 nor the "
                           "spatial tokens S = 920 are divisible by the 7 devices of mesh axis y "
                           "(mesh 1x7); the sequence split needs one of them"),
    # S = 920 = 8 * 115 splits 8 ways, the 16 heads too; 920 is not divisible by 3
    ("opensora_sp", (1, 3), "strategy opensora_sp: spatial tokens S = 920 is not divisible by the "
                            "3 devices of mesh axis y (mesh 1x3)"),
    # the batch of 2 on axis x of 4 devices
    ("two_dimension", (4, 4), "strategy two_dimension: batch = 2 is not divisible by the 4 devices "
                              "of mesh axis x (mesh 4x4)"),
    ("none", (1, 2), "strategy none runs on one device: use --mesh 1x1, not 1x2"),
])
def test_a_layout_that_does_not_divide_is_refused_with_the_tracers_message(strategy, mesh, message):
    with pytest.raises(StrategyError) as planned:
        check_layout(strategy, layout(mesh))
    assert str(planned.value) == message
    with pytest.raises(StrategyError) as traced:
        get_strategy(strategy, layout(mesh))
    assert str(traced.value) == message


def test_usp_checks_the_heads_against_its_ulysses_groups():
    # y = 6 as ring 2 x ulysses 3: T = 60 splits 6 ways, the 16 heads not 3 ways
    message = ("strategy usp: heads = 16 is not divisible by the 3 devices of mesh the Ulysses "
               "groups (ulysses degree 3) (mesh 1x6)")
    with pytest.raises(StrategyError) as error:
        check_layout("usp", layout((1, 6), ring_degree=2))
    assert str(error.value) == message
    check_layout("usp", layout((1, 6), ring_degree=3))  # ulysses 2 divides the heads
    # degrees that do not multiply to y are refused first, as the tracer's strategy refuses them
    with pytest.raises(UsageError, match="ring degree x Ulysses degree must equal the 6 devices"):
        check_layout("usp", layout((1, 6), ring_degree=4))
    with pytest.raises(UsageError, match="ring degree x Ulysses degree must equal the 6 devices"):
        get_strategy("usp", layout((1, 6), ring_degree=4))


@pytest.mark.parametrize("strategy", sorted(RULES))
def test_the_token_order_follows_the_split_factor(strategy):
    # 204_640_360 on 2x8 (none on one device, dp on 2: the batch of 2): T = 60 is not divisible
    # by 8, S = 920 is, so the sequence-parallel strategies split S, space-major
    mesh = {"none": (1, 1), "dp": (2, 1)}.get(strategy, (2, 8))
    check_layout(strategy, layout(mesh))
    order = token_order(strategy, layout(mesh))
    split_tokens = strategy in ("ds_ulysses", "ring_attention", "usp", "megatron_sp", "opensora_sp")
    assert order == (SPACE_MAJOR if split_tokens else FRAME_MAJOR)
    assert get_strategy(strategy, layout(mesh)).token_order == order


def test_an_unknown_strategy_names_the_known_ones():
    with pytest.raises(StrategyError, match="unknown strategy 'tp': expected one of dp, ds_ulysses"):
        check_layout("tp", layout((1, 2)))


def test_check_stage_uses_the_stages_submesh():
    # two stages of a 1x4 mesh split as two 1x2 submeshes: megatron's 16 heads fit on 2
    config = build_config(config="full", shape="204_640_360", strategy="megatron", mesh=(1, 4),
                          stage_ids=[[0, 13], [14, 27]], submeshes=[[1, 2, 0, 0], [1, 2, 0, 2]])
    check_stage(config, 1)
