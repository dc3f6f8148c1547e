"""Which token order (frame-major: split T, space-major: split S) the sequence-parallel strategies
choose, and that stages run and hand on x in it.  No torch-xla needed: the stages run eagerly on
the CPU, as the reference of ``trace-stage --check`` does."""

import pytest

from models.opensora.config import get_config
from models.opensora.inputs import REFERENCE_SHAPES, geometry
from models.opensora.token_order import FRAME_MAJOR, SPACE_MAJOR
from plans.config import build_config
from tracing.strategies import Layout, StrategyError, get_strategy, strategy_names
from tracing.strategies.base import stage_token_order

FULL = get_config("full")
TINY = get_config("tiny")
SEQUENCE_PARALLEL = ("ds_ulysses", "megatron_sp", "ring_attention", "usp")  # split the tokens


def layout(config, shape: str, mesh: tuple[int, int]) -> Layout:
    return Layout(model=config, geometry=geometry(config, shape), batch=2, mesh_shape=mesh)


# The study's shapes on 16 devices, mesh 2x8: (T, S) = (60, 920), (120, 920), (15, 3600),
# (30, 3600).  8 divides T only for 408_640_360, and every S (920 = 8*115, 3600 = 8*450).
STUDY_ORDERS = dict(zip(REFERENCE_SHAPES, (SPACE_MAJOR, FRAME_MAJOR, SPACE_MAJOR, SPACE_MAJOR)))


@pytest.mark.parametrize("strategy", SEQUENCE_PARALLEL)
@pytest.mark.parametrize("shape", REFERENCE_SHAPES)
def test_study_shapes_on_2x8_split_t_only_when_8_divides_it(strategy, shape):
    chosen = get_strategy(strategy, layout(FULL, shape, (2, 8)))
    assert chosen.token_order == STUDY_ORDERS[shape]
    # The attention over the split factor is the split one: temporal for T, spatial for S.
    temporal_split = STUDY_ORDERS[shape] == FRAME_MAJOR
    assert chosen.sequence_split(temporal=True) is temporal_split
    assert chosen.sequence_split(temporal=False) is not temporal_split


@pytest.mark.parametrize("strategy", SEQUENCE_PARALLEL)
def test_t_wins_when_both_divide(strategy):
    assert get_strategy(strategy, layout(TINY, "28_64_64", (2, 2))).token_order == FRAME_MAJOR


@pytest.mark.parametrize("strategy", SEQUENCE_PARALLEL)
def test_neither_t_nor_s_divisible_names_both_and_axis_y(strategy):
    # 17_64_64: T = 5, S = 16; neither splits 3 ways.
    with pytest.raises(StrategyError) as error:
        get_strategy(strategy, layout(TINY, "17_64_64", (2, 3)))
    message = str(error.value)
    assert "T = 5" in message and "S = 16" in message and "axis y" in message
    assert "2x3" in message


def test_opensora_sp_splits_the_spatial_tokens_as_opensora_does():
    # OpenSora v1.2 splits S (dim 2 of B T S C) over the sequence-parallel group: space-major.
    config = build_config(config="tiny", shape="17_64_64", strategy="opensora_sp", mesh="1x2")
    assert stage_token_order(config, 0) == SPACE_MAJOR


@pytest.mark.parametrize("strategy", sorted(set(strategy_names()) - set(SEQUENCE_PARALLEL) - {"opensora_sp"}))
def test_other_strategies_keep_frame_major(strategy):
    # The strategy's own checks may reject the layout; the order asked of it is still frame-major.
    config = build_config(config="tiny", shape="17_64_64", strategy=strategy, mesh="2x2")
    assert stage_token_order(config, 0) == FRAME_MAJOR
