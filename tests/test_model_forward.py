"""The STDiT3 re-implementation runs, slices into stages, and exposes its hooks (tiny config)."""

import math

import pytest

torch = pytest.importorskip("torch")

from models.opensora.config import get_config
from models.opensora.errors import StageRangeError
from models.opensora.inputs import make_inputs
from models.opensora.stdit3 import (
    ANNOTATION_POINTS,
    LayerNorm,
    RMSNorm,
    RotaryEmbedding,
    StageState,
    STDiT3,
    no_annotation,
    plain_attention,
)
from models.opensora.token_order import FRAME_MAJOR, SPACE_MAJOR

TINY = get_config("tiny")


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return STDiT3(TINY).eval()


@pytest.mark.parametrize("shape, latent", [
    ("17_64_64", (5, 8, 8)),      # even latent: no padding
    ("17_72_56", (5, 7, 9)),      # odd latent H and W: padded to 8x10 inside, cropped back
])
def test_tiny_forward_output_matches_latent(tiny_model, shape, latent):
    inputs = make_inputs(TINY, shape, batch=2)
    assert tuple(inputs["z"].shape) == (2, 4, *latent)
    with torch.no_grad():
        out = tiny_model(**inputs)
    # Same batch and (T, H, W) as z; channels = out_channels (noise + learned sigma = 2 x 4).
    assert tuple(out.shape) == (2, 8, *latent)
    assert torch.isfinite(out).all()


def test_stage_slicing_equals_whole_model(tiny_model):
    inputs = make_inputs(TINY, "17_64_64")
    with torch.no_grad():
        whole = tiny_model(**inputs)
        state = tiny_model.embed(**inputs)
        # Stage 1 is built from plain tensors of the recorded shapes, as the tracer does.
        after_stage0 = tiny_model.run_blocks(state, 0, 0)
        rebuilt = StageState(x=after_stage0.x.clone(), y=after_stage0.y.clone(),
                             t=after_stage0.t.clone(), t_mlp=after_stage0.t_mlp.clone(),
                             T=5, S=16, H_lat=8, W_lat=8)
        staged = tiny_model.finalize(tiny_model.run_blocks(rebuilt, 1, 1))
    torch.testing.assert_close(staged, whole, rtol=0, atol=0)


def test_stage_state_shapes(tiny_model):
    inputs = make_inputs(TINY, "17_64_64", batch=2)
    with torch.no_grad():
        state = tiny_model.embed(**inputs)
    h = TINY.hidden_size
    assert tuple(state.x.shape) == (2, 5 * 16, h)
    assert tuple(state.y.shape) == (1, 2 * 8, h)
    assert tuple(state.t.shape) == (2, h)
    assert tuple(state.t_mlp.shape) == (2, 6 * h)
    assert (state.T, state.S, state.N) == (5, 16, 80)


@pytest.mark.parametrize("first, last", [(-1, 0), (1, 0), (0, 2)])
def test_bad_block_range(tiny_model, first, last):
    state = tiny_model.embed(**make_inputs(TINY, "17_64_64"))
    with pytest.raises(StageRangeError, match=rf"{first}\.\.{last}"):
        tiny_model.run_blocks(state, first, last)


def test_module_order_exposes_stage_split(tiny_model):
    names = [name for name, _ in tiny_model.named_children()]
    assert names == ["x_embedder", "t_embedder", "fps_embedder", "y_embedder", "t_block",
                     "spatial_blocks", "temporal_blocks", "final_layer"]
    pairs = tiny_model.block_pairs()
    assert len(pairs) == TINY.depth
    assert all(not s.temporal and t.temporal for s, t in pairs)
    assert len(tiny_model.embedding_modules()) == 5
    # No library norm that lowers to batch-norm-training.
    assert not any(isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm)) for m in tiny_model.modules())


def shape_recorder(seen: dict[tuple[str, bool], set]):
    """recorder(temporal) -> an annotate hook that adds each point's shape to ``seen``."""
    def recorder(temporal):
        def annotate(point, tensor):
            seen.setdefault((point, temporal), set()).add(tuple(tensor.shape))
            return tensor
        return annotate
    return recorder


@pytest.mark.parametrize("token_order", [FRAME_MAJOR, SPACE_MAJOR])
def test_annotation_points_and_layouts(tiny_model, token_order):
    """Every hook point fires with the documented layout (B=2, T=5, S=16, TOKEN=8, h=64), in
    either token order: each attention still sees (B*T, S) or (B*S, T); the order only decides
    which of the two needs a transpose of x."""
    seen: dict[tuple[str, bool], set] = {}
    recorder = shape_recorder(seen)
    for spatial, temporal in tiny_model.block_pairs():
        for block in (spatial, temporal):
            fn = recorder(block.temporal)
            block.annotate = block.attn.annotate = block.cross_attn.annotate = block.mlp.annotate = fn
    tiny_model.annotate = recorder(False)
    try:
        with torch.no_grad():
            tiny_model(**make_inputs(TINY, "17_64_64"), token_order=token_order)
    finally:
        for spatial, temporal in tiny_model.block_pairs():
            for block in (spatial, temporal):
                block.annotate = block.attn.annotate = no_annotation
                block.cross_attn.annotate = block.mlp.annotate = no_annotation
        tiny_model.annotate = no_annotation
    B, T, S, N, TOKEN, h, heads, hd = 2, 5, 16, 80, 8, 64, 4, 16
    # select_grad is the official path's per-frame select (inputs with x_mask), not run here
    assert {p for p, _ in seen} == set(ANNOTATION_POINTS) - {"select_grad"}
    assert seen[("final_in", False)] == {(B, N, h)}
    for temporal, (bp, length) in ((False, (B * T, S)), (True, (B * S, T))):
        assert seen[("x", temporal)] == {(B, N, h)}
        assert seen[("attn_in", temporal)] == {(bp, length, h)}
        for point in ("q", "k", "v"):
            assert seen[(point, temporal)] == {(bp, heads, length, hd)}
        assert seen[("attn_out", temporal)] == seen[("proj_out", temporal)] == {(bp, length, h)}
        assert seen[("qkv", temporal)] == {(bp, length, 3 * h)}
        assert seen[("cross_q_tokens", temporal)] == {(B, N, heads, hd)}
        assert seen[("cross_q", temporal)] == {(1, heads, B * N, hd)}
        assert seen[("cross_k", temporal)] == seen[("cross_v", temporal)] == {(1, heads, B * TOKEN, hd)}
        assert seen[("cross_out", temporal)] == {(1, B * N, h)}
        assert seen[("mlp_hidden", temporal)] == {(B, N, 4 * h)}


def test_attention_fn_is_replaceable(tiny_model):
    calls = []

    def spy(q, k, v, mask, scale):
        calls.append((tuple(q.shape), mask is not None))
        return plain_attention(q, k, v, mask, scale)

    block = tiny_model.spatial_blocks[0]
    block.attn.attention_fn = block.cross_attn.attention_fn = spy
    try:
        with torch.no_grad():
            tiny_model(**make_inputs(TINY, "17_64_64"))
    finally:
        block.attn.attention_fn = block.cross_attn.attention_fn = plain_attention
    assert calls == [((10, 4, 16, 16), False), ((1, 4, 160, 16), True)]


def test_flattened_cross_attention_equals_per_sample_attention(tiny_model):
    """The block-diagonal mask makes each sample attend only to its own caption."""
    cross = tiny_model.spatial_blocks[0].cross_attn
    torch.manual_seed(1)
    x = torch.randn(3, 7, TINY.hidden_size)
    y = torch.randn(1, 3 * 5, TINY.hidden_size)
    with torch.no_grad():
        flattened = cross(x, y)
        separate = torch.cat([cross(x[i:i + 1], y[:, 5 * i:5 * (i + 1)]) for i in range(3)])
    torch.testing.assert_close(flattened, separate, rtol=1e-5, atol=1e-6)


def test_written_out_norms_match_torch():
    torch.manual_seed(2)
    x = torch.randn(3, 5, 24)
    torch.testing.assert_close(LayerNorm(1e-6)(x), torch.nn.functional.layer_norm(x, (24,), eps=1e-6))
    rms = RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        rms.weight.uniform_(0.5, 1.5)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * rms.weight
    torch.testing.assert_close(rms(x), expected)


def test_rotary_embedding_is_a_relative_rotation():
    """RoPE keeps norms, and q_i . k_j depends only on i - j."""
    rope = RotaryEmbedding(8)
    torch.manual_seed(3)
    q, k = torch.randn(8), torch.randn(8)
    length = 6
    qs = rope(q.expand(1, length, 8))[0]
    ks = rope(k.expand(1, length, 8))[0]
    torch.testing.assert_close(qs.norm(dim=-1), q.norm().expand(length))
    torch.testing.assert_close(qs[0], q)  # position 0: no rotation
    torch.testing.assert_close(qs[3] @ ks[1], qs[2] @ ks[0])
    torch.testing.assert_close(qs[5] @ ks[2], qs[4] @ ks[1])
    # Position 1 rotates the first channel pair by exactly 1 radian.
    c, s = math.cos(1.0), math.sin(1.0)
    torch.testing.assert_close(qs[1, :2], torch.stack((q[0] * c - q[1] * s, q[1] * c + q[0] * s)))


# --- token order -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, batch", [("17_64_64", 2), ("17_72_56", 2), ("30_40_24", 3)])
def test_space_major_forward_equals_frame_major(tiny_model, shape, batch):
    """Only per-token work and attention over whole sequences: the order of the tokens in x
    changes nothing but the float summation order (17_72_56 also pads and crops)."""
    inputs = make_inputs(TINY, shape, batch=batch)
    with torch.no_grad():
        frame_major = tiny_model(**inputs)
        space_major = tiny_model(**inputs, token_order=SPACE_MAJOR)
    assert space_major.shape == frame_major.shape
    torch.testing.assert_close(space_major, frame_major, rtol=1e-5, atol=1e-5)


def test_space_major_embedding_puts_token_s_t_at_s_times_T_plus_t(tiny_model):
    inputs = make_inputs(TINY, "17_64_64")  # T = 5, S = 16
    with torch.no_grad():
        frame = tiny_model.embed(**inputs)
        space = tiny_model.embed(**inputs, token_order=SPACE_MAJOR)
    assert (frame.token_order, space.token_order) == (FRAME_MAJOR, SPACE_MAJOR)
    assert space.x.shape == frame.x.shape  # stage boundaries carry the same shapes
    for t, s in ((0, 0), (0, 1), (1, 0), (4, 15), (2, 7)):
        assert torch.equal(space.x[:, s * 5 + t], frame.x[:, t * 16 + s])
    assert torch.equal(space.reordered(FRAME_MAJOR).x, frame.x)
    assert space.reordered(SPACE_MAJOR) is space


def test_space_major_stages_equal_whole_model(tiny_model):
    inputs = make_inputs(TINY, "17_64_64")
    with torch.no_grad():
        whole = tiny_model(**inputs)
        state = tiny_model.run_blocks(tiny_model.embed(**inputs, token_order=SPACE_MAJOR), 0, 0)
        rebuilt = StageState(x=state.x.clone(), y=state.y, t=state.t, t_mlp=state.t_mlp,
                             T=5, S=16, H_lat=8, W_lat=8, token_order=SPACE_MAJOR)
        staged = tiny_model.finalize(tiny_model.run_blocks(rebuilt, 1, 1))
    torch.testing.assert_close(staged, whole, rtol=1e-5, atol=1e-5)


def test_unknown_token_order_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="unknown token order 'time_major'"):
        tiny_model.embed(**make_inputs(TINY, "17_64_64"), token_order="time_major")


@pytest.mark.parametrize("token_order", [FRAME_MAJOR, SPACE_MAJOR])
def test_batch_apart_computes_the_same_blocks(tiny_model, token_order):
    """``batch_apart`` (the layout ds_ulysses and opensora_sp need when a device holds several
    samples) runs the minor-factor attention on (B, major, minor, h) and the cross-attention on
    (B, heads, N, hd) queries against all captions under a (B, 1, N, B*TOKEN) mask: the same
    function, so the same output as the merged-batch model, and the hooks see those shapes."""
    inputs = make_inputs(TINY, "17_64_64")
    seen: dict[tuple[str, bool], set] = {}
    recorder = shape_recorder(seen)
    blocks = [block for pair in tiny_model.block_pairs() for block in pair]
    with torch.no_grad():
        merged = tiny_model(**inputs, token_order=token_order)
        try:
            for block in blocks:
                block.batch_apart = block.cross_attn.batch_apart = True
                block.attn.annotate = block.cross_attn.annotate = recorder(block.temporal)
            apart = tiny_model(**inputs, token_order=token_order)
        finally:
            for block in blocks:
                block.batch_apart = block.cross_attn.batch_apart = False
                block.attn.annotate = block.cross_attn.annotate = no_annotation
    torch.testing.assert_close(apart, merged, rtol=1e-5, atol=1e-5)
    B, T, S, N, TOKEN, h, heads, hd = 2, 5, 16, 80, 8, 64, 4, 16
    # The minor factor is S frame-major (spatial block local), T space-major (temporal).
    local_temporal = token_order == SPACE_MAJOR
    major, minor = (S, T) if local_temporal else (T, S)
    assert seen[("attn_in", local_temporal)] == {(B, major, minor, h)}
    assert seen[("q", local_temporal)] == {(B, major, heads, minor, hd)}
    assert seen[("attn_in", not local_temporal)] == {(B * minor, major, h)}
    for temporal in (False, True):
        assert seen[("cross_q", temporal)] == {(B, heads, N, hd)}
        assert seen[("cross_k", temporal)] == {(1, heads, B * TOKEN, hd)}
        assert seen[("cross_out", temporal)] == {(B, N, h)}
