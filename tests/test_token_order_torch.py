"""Which token order (frame-major: split T, space-major: split S) the sequence-parallel strategies
choose, and that stages run and hand on x in it.  No torch-xla needed: the stages run eagerly on
the CPU, as the reference of ``trace-stage --check`` does."""

import pytest

from models.opensora.config import get_config
from models.opensora.token_order import FRAME_MAJOR, SPACE_MAJOR
from plans.config import build_config
from tracing.strategies.base import stage_token_order

FULL = get_config("full")
TINY = get_config("tiny")
SEQUENCE_PARALLEL = ("ds_ulysses", "megatron_sp", "ring_attention", "usp")  # split the tokens

torch = pytest.importorskip("torch")

from models.opensora.inputs import make_inputs
from models.opensora.stdit3 import STDiT3
from tracing.stages import compute_boundary_shapes, run_stage, stage_spec


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return STDiT3(TINY).eval()


def run_pipeline(model, config, inputs):
    """Every stage in turn, each fed the previous one's outputs, as a real pipeline would."""
    tensors = inputs
    with torch.no_grad():
        for index in range(config.num_stages):
            tensors = run_stage(model, stage_spec(config, index), tensors, config)
    return tensors["out"]


@pytest.mark.parametrize("submeshes, orders", [
    (None, (SPACE_MAJOR, SPACE_MAJOR)),  # both stages on 2x2: y = 2 splits S = 16, not T = 5
    ([[2, 1, 0, 0], [2, 2, 0, 0]], (FRAME_MAJOR, SPACE_MAJOR)),  # stage 0 on 2x1 splits T
    ([[2, 2, 0, 0], [2, 1, 0, 0]], (SPACE_MAJOR, FRAME_MAJOR)),
])
def test_staged_pipeline_equals_whole_model(tiny_model, submeshes, orders):
    """x crosses the boundary in the order of the stage that wrote it; the next stage reorders
    it when it runs in the other order."""
    config = build_config(config="tiny", shape="17_64_64", strategy="ds_ulysses", mesh="2x2",
                          stage_ids="0-0,1-1", submeshes=submeshes, dtype="float32")
    assert tuple(stage_token_order(config, index) for index in (0, 1)) == orders
    inputs = make_inputs(TINY, "17_64_64")
    with torch.no_grad():
        whole = tiny_model(**inputs)
    torch.testing.assert_close(run_pipeline(tiny_model, config, inputs), whole,
                               rtol=1e-5, atol=1e-5)


def test_boundary_shapes_do_not_depend_on_the_token_order():
    """Why the stage-shape cache key can leave the strategy out."""
    space = build_config(config="tiny", shape="17_64_64", strategy="ring_attention", mesh="2x2",
                         stage_ids="0-0,1-1")
    frame = build_config(config="tiny", shape="17_64_64", strategy="megatron", mesh="2x2",
                         stage_ids="0-0,1-1")
    assert stage_token_order(space, 0) == SPACE_MAJOR
    assert compute_boundary_shapes(space) == compute_boundary_shapes(frame)
