"""PipeFusion's stale-K/V attention in the video DiTs (``layers.StaleKV``, ``layers.StageShift``),
run eagerly on the CPU: a patch's call whose K/V buffers hold the keys and values of the whole
video gives exactly the whole model's output on the patch's tokens (with fresh buffers PipeFusion
is the model: what makes it approximate is only that the buffers are one step stale), and the
stage hand-off is a cyclic shift of the stages' patches. Tiny configurations, float32.

The buffers are kept patch-major (the patch's own tokens first: keys' order does not change
attention), so the traced patch, the first of M = 2 along the latent height, writes its fresh
K/V at offset 0.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from models.zoo.videodit.cogvideox import cogvideox  # noqa: E402
from models.zoo.videodit.hunyuan_video import hunyuan_video  # noqa: E402
from models.zoo.videodit.layers import AttentionCore, StageShift  # noqa: E402
from models.zoo.videodit.wan21 import wan21  # noqa: E402

PATCHES = 2
T, H, W = 4, 8, 8  # latent frames, height, width: (T, H / 2, W / 2) = 4 x 4 x 4 video tokens


def _inputs(batch: int, frames_first: bool, extra: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (batch, T, 4, H, W) if frames_first else (batch, 4, T, H, W)
    inputs = {"latents": torch.randn(shape, generator=generator),
              "t": torch.tensor([500.0] * batch), "text": torch.randn(batch, 8, 32, generator=generator)}
    if extra:
        inputs |= {"pooled": torch.randn(batch, 16, generator=generator),
                   "guidance": torch.tensor([6.0] * batch)}
    return inputs


def _patch_major(x: torch.Tensor) -> torch.Tensor:
    """(B, T*h*w, ...) tokens in (frame, row, column) order -> patch-major: the first patch's
    rows of every frame, then the second's."""
    h, w = H // 2, W // 2
    grid = x.unflatten(1, (T, PATCHES, h // PATCHES, w))
    return grid.transpose(1, 2).flatten(1, 4)


def _cores(model) -> list[AttentionCore]:
    if hasattr(model, "double_blocks"):
        return [b.attn for b in (*model.double_blocks, *model.single_blocks)]
    return [b.self_attn.core if hasattr(b, "self_attn") else b.attn for b in model.blocks]


CASES = {"wan21": (wan21, 2, False, False), "hunyuan_video": (hunyuan_video, 1, False, True),
         "cogvideox": (cogvideox, 2, True, False)}


@pytest.mark.parametrize("name", CASES)
def test_a_patch_with_fresh_buffers_is_the_whole_model_on_its_tokens(name):
    factory, batch, frames_first, extra = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    for parameter in model.parameters():  # zero-initialised modulation tables: make them count
        torch.nn.init.normal_(parameter, std=0.2)
    inputs = _inputs(batch, frames_first, extra)
    video = T * (H // 2) * (W // 2)
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []

    def video_part(x: torch.Tensor) -> torch.Tensor:  # the joint sequence's video tokens
        return {"hunyuan_video": x[:, :video], "cogvideox": x[:, -video:]}.get(name, x)

    def keep(core):  # the whole video's K and V as each attention meets them (after RoPE)
        keys.append((video_part(core.k_in.kept), video_part(core.v_in.kept)))

    for core in _cores(model):
        for mark in (core.k_in, core.v_in):
            mark.register_forward_hook(lambda m, a, out: setattr(m, "kept", out))
        core.out.register_forward_hook(lambda m, a, out, core=core: keep(core))
    with torch.no_grad():
        whole = model(**inputs)
        stale_k = torch.stack([_patch_major(k) for k, _ in keys])
        stale_v = torch.stack([_patch_major(v) for _, v in keys])
        patch_inputs = dict(inputs, latents=inputs["latents"][..., : H // PATCHES, :])
        patch = model(**patch_inputs, stale_k=stale_k, stale_v=stale_v)
    # the whole model's output on the first patch's tokens (Wan and HunyuanVideo: (B, tokens, .))
    expected = _patch_major(whole)[:, : video // PATCHES]
    assert patch.shape == expected.shape
    torch.testing.assert_close(patch, expected, rtol=1e-4, atol=1e-5)
    # and the patch differs from attending over its own tokens only (the buffer is used; a
    # call without buffers holds none from the call before)
    with torch.no_grad():
        alone = model(**patch_inputs)
    assert not torch.allclose(alone, expected, rtol=1e-3, atol=1e-4)


def test_the_hand_off_is_a_cyclic_shift_of_the_stages():
    shift = StageShift(3)
    x = torch.arange(3 * 2 * 5.0).reshape(6, 5, 1)  # 3 stages of a batch of 2
    out = shift(x)
    stages = out.unflatten(0, (3, 2))
    # stage s now holds what stage s - 1 sent; stage 0 what the last stage sent
    assert torch.equal(stages[1], x[:2]) and torch.equal(stages[2], x[2:4])
    assert torch.equal(stages[0], x[4:])
    assert StageShift(1)(x) is x


def test_buffers_of_the_wrong_shape_are_refused():
    model = wan21()
    inputs = _inputs(2, False, False)
    wrong = torch.zeros(3, 2, 64, 4, 16)  # three attentions for two blocks
    with pytest.raises(ValueError, match="2 attentions first"):
        model(**inputs, stale_k=wrong, stale_v=wrong)
