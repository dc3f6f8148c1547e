"""CogVideoX-5B's transformer (docs/videodit.md; configuration sources in docs/sources.md): each
latent frame cut into 2x2 patches by a convolution, the T5 text (226 tokens of 4096) projected
to the width and put in front of the video tokens; a timestep embedding (sinusoidal over the
width -> Linear -> SiLU -> Linear to 512); blocks of full 3-D attention over text and video
tokens together with the *expert adaptive LayerNorm*: one Linear 512 -> 6h of the timestep gives
the video tokens and the text tokens each their own shift, scale and gate:

    v, c = modulate(norm1(v)), modulate'(norm1(c))        norm1: LayerNorm with affine
    q, k, v = to_q, to_k, to_v of [c, v]                  LayerNorm over the head on q and k;
    a = to_out(attention)                                 3-D RoPE on the video tokens' q and k
    v += gate * a_video;  c += gate' * a_text
    (the same with norm2 and the MLP h -> 4h, GELU tanh, 4h -> h)

then a final LayerNorm, a modulated LayerNorm (Linear 512 -> 2h) and Linear h -> 2 * 2 * 16.
The official sampler (diffusers) runs classifier-free guidance as one batch of two, 50 steps.

Inputs: ``latents`` (B, T, 16, H, W) (frames before channels, as diffusers orders them), ``t``
(B,), ``text`` (B, 226, 4096).
"""

from __future__ import annotations

from torch import Tensor, nn

from models.zoo.videodit.layers import (
    AttentionCore,
    LayerNorm,
    Linear,
    Mark,
    Mlp,
    StageShift,
    heads,
    install_stale,
    join,
    layer_norm,
    modulate,
    pad_tokens,
    rope_3d,
    sinusoidal,
    unjoin,
)

EPS = 1e-5
QK_EPS = 1e-6
ROPE_THETA = 10000.0


def rope_dims(head_dim: int) -> tuple[int, int, int]:
    """CogVideoX's cut of a head: frames a quarter, rows and columns three eighths each."""
    return head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3


class ExpertNorm(nn.Module):
    """The expert adaptive LayerNorm: one Linear of the timestep embedding, separate shift,
    scale and gate for the video and the text tokens."""

    def __init__(self, time_dim: int, dim: int) -> None:
        super().__init__()
        self.linear = Linear(time_dim, 6 * dim)
        self.norm = LayerNorm(dim, EPS)

    def forward(self, video: Tensor, text: Tensor, time: Tensor):
        shift, scale, gate, text_shift, text_scale, text_gate = \
            self.linear(nn.functional.silu(time)).chunk(6, dim=-1)
        return (modulate(self.norm(video), shift, scale), modulate(self.norm(text), text_shift,
                                                                   text_scale),
                gate[:, None], text_gate[:, None])


class Block(nn.Module):
    def __init__(self, dim: int, count: int, time_dim: int, ffn: int, chunks: int,
                 ring: int) -> None:
        super().__init__()
        self.heads, self.chunks = count, chunks
        self.norm1, self.norm2 = ExpertNorm(time_dim, dim), ExpertNorm(time_dim, dim)
        self.q_proj, self.k_proj, self.v_proj = Linear(dim, dim), Linear(dim, dim), Linear(dim, dim)
        self.norm_q, self.norm_k = LayerNorm(dim // count, QK_EPS), LayerNorm(dim // count, QK_EPS)
        self.attn = AttentionCore(ring)
        self.o_proj = Linear(dim, dim)
        self.mlp = Mlp(dim, ffn)

    def forward(self, video: Tensor, text: Tensor, time: Tensor,
                grid: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
        length, chunks = text.shape[1], self.chunks
        v, c, gate, text_gate = self.norm1(video, text, time)
        joint = join(c, v, chunks)
        q = self.norm_q(heads(self.q_proj(joint), self.heads))
        k = self.norm_k(heads(self.k_proj(joint), self.heads))
        q, k = (self.rope(x, grid, length) for x in (q, k))
        out = self.o_proj(self.attn(q, k, heads(self.v_proj(joint), self.heads)).flatten(-2))
        out_text, out_video = unjoin(out, length, chunks)
        video, text = video + gate * out_video, text + text_gate * out_text
        v, c, gate, text_gate = self.norm2(video, text, time)
        out_text, out_video = unjoin(self.mlp(join(c, v, chunks)), length, chunks)
        return video + gate * out_video, text + text_gate * out_text

    def rope(self, x: Tensor, grid: tuple[int, int, int], length: int) -> Tensor:
        """RoPE on the video tokens of the joint sequence; the text tokens as they are."""
        text, video = unjoin(x, length, self.chunks)
        return join(text, rope_3d(video, grid, rope_dims(x.shape[-1]), ROPE_THETA), self.chunks)


class CogVideoX(nn.Module):
    def __init__(self, *, count: int, head_dim: int, layers: int, in_channels: int, patch: int,
                 text_dim: int, time_dim: int, chunks: int, ring: int, stages: int) -> None:
        super().__init__()
        dim = count * head_dim
        self.dim, self.chunks = dim, chunks
        self.patch_embed = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)
        self.text_proj = Linear(text_dim, dim)
        self.time_embedding = Mlp(dim, time_dim, time_dim, activation="silu")
        self.tokens, self.text_tokens = Mark(), Mark()
        self.blocks = nn.ModuleList(Block(dim, count, time_dim, 4 * dim, chunks, ring) for _ in range(layers))
        self.handoff, self.text_handoff = StageShift(stages), StageShift(stages)
        self.norm_final = LayerNorm(dim, EPS)
        self.norm_out = Linear(time_dim, 2 * dim)
        self.proj_out = Linear(dim, patch * patch * in_channels)
        self.output = Mark()

    def forward(self, latents: Tensor, t: Tensor, text: Tensor, stale_k: Tensor | None = None,
                stale_v: Tensor | None = None) -> Tensor:
        batch, frames = latents.shape[:2]
        x = self.patch_embed(latents.flatten(0, 1))  # (B * T, h, H / p, W / p)
        grid = (frames, *x.shape[2:])
        video = x.unflatten(0, (batch, frames)).permute(0, 1, 3, 4, 2).flatten(1, 3)
        # each token set padded to a multiple of the sequence-parallel degree (17,550 video
        # tokens at 49 x 480 x 720 and 226 text tokens split over 4 or 8 devices)
        video = self.tokens(pad_tokens(video, self.chunks))
        context = self.text_tokens(pad_tokens(self.text_proj(text), self.chunks))
        time = self.time_embedding(sinusoidal(t, self.dim).to(video.dtype))
        install_stale([block.attn for block in self.blocks], stale_k, stale_v, video.shape[1])
        for block in self.blocks:
            video, context = block(video, context, time, grid)
        video, context = self.handoff(video), self.text_handoff(context)
        _, video = unjoin(self.norm_final(join(context, video, self.chunks)), context.shape[1],
                          self.chunks)
        shift, scale = self.norm_out(nn.functional.silu(time)).chunk(2, dim=-1)
        return self.output(self.proj_out(modulate(layer_norm(video, QK_EPS), shift, scale)))


def cogvideox(heads: int = 4, head_dim: int = 16, layers: int = 2, in_channels: int = 4,
              patch: int = 2, text_dim: int = 32, time_dim: int = 32, chunks: int = 1,
              ring: int = 1, stages: int = 1) -> CogVideoX:
    """CogVideoX (tiny by default: 4 heads of 16, 2 blocks; ``configs.COGVIDEOX_5B`` is the
    released size). ``chunks``: the order of the joint sequence (``layers.join``), the
    sequence-parallel degree under xDiT's layouts; ``ring``: attention as ring attention over
    that many sequence blocks (``layers.AttentionCore``); ``stages``: PipeFusion's tick
    (``layers.StageShift``; the forward's ``stale_k``/``stale_v``: the attentions' K/V
    buffers of the video tokens, ``layers.install_stale``)."""
    return CogVideoX(count=heads, head_dim=head_dim, layers=layers, in_channels=in_channels,
                     patch=patch, text_dim=text_dim, time_dim=time_dim, chunks=chunks, ring=ring,
                     stages=stages)
