"""HunyuanVideo's transformer (13B; docs/videodit.md; configuration sources in docs/sources.md):
a 3-D patch convolution (1, 2, 2) over 16-channel latents; the LLM text (256 tokens of 4096)
refined by a small token refiner (Linear 4096 -> h, then blocks of self-attention and a SiLU MLP
gated by the timestep and the text's mean); a conditioning vector, the sum of the timestep, the
CLIP pooled text (768) and the embedded guidance scale, each by Linear -> SiLU -> Linear;

* dual-stream blocks: video and text keep their own weights (modulation h -> 6h, fused QKV
  h -> 3h, RMSNorm over the head on q and k, output projection, MLP h -> 4h -> h, GELU tanh),
  and attend together over [video, text] (3-D RoPE on the video tokens);
* single-stream blocks over [video, text]: modulation h -> 3h, one fused Linear h -> 3h + 4h
  (QKV and the MLP's up projection, here the two modules ``qkv`` and ``fc1``: the same GEMM
  work), attention, and one Linear (h + 4h) -> h over [attention, GELU(up)] (here ``proj`` plus
  ``fc2``, summed);
* a final modulated LayerNorm and Linear h -> 16 * 1 * 2 * 2 on the video tokens.

Guidance is embedded (the distilled model takes the scale as an input): one batch of one, 50
steps. The fused QKV is laid out head-major (heads, 3, D) so that a column split gives whole
heads (the released weights are (3, heads, D); a reorder of rows, no change of work).

Inputs: ``latents`` (B, 16, T, H, W), ``t`` (B,), ``text`` (B, 256, 4096), ``pooled`` (B, 768),
``guidance`` (B,).
"""

from __future__ import annotations

from torch import Tensor, nn

from models.zoo.videodit.layers import (
    AttentionCore,
    LayerNorm,
    Linear,
    Mark,
    Mlp,
    RMSNorm,
    StageShift,
    activate,
    fused_heads,
    install_stale,
    join,
    layer_norm,
    modulate,
    rope_3d,
    sinusoidal,
    unjoin,
)

EPS = 1e-6
ROPE_THETA = 256.0
FREQUENCIES = 256  # sinusoidal frequencies of the timestep and guidance embeddings


def joint_rope(x: Tensor, grid: tuple[int, int, int], dims: tuple[int, int, int],
               chunks: int) -> Tensor:
    """RoPE on the video tokens of a joint sequence; the text tokens as they are."""
    video, text = unjoin(x, grid[0] * grid[1] * grid[2], chunks)
    return join(rope_3d(video, grid, dims, ROPE_THETA), text, chunks)


class Stream(nn.Module):
    """One stream of a dual-stream block: its modulation, QKV, q/k norms, projection and MLP."""

    def __init__(self, dim: int, count: int) -> None:
        super().__init__()
        self.heads = count
        self.mod = Linear(dim, 6 * dim)
        self.qkv = Linear(dim, 3 * dim)
        self.q_norm, self.k_norm = RMSNorm(dim // count, EPS), RMSNorm(dim // count, EPS)
        self.proj = Linear(dim, dim)
        self.mlp = Mlp(dim, 4 * dim)

    def qkv_of(self, x: Tensor, vec: Tensor):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.mod(nn.functional.silu(vec)).chunk(6, -1)
        q, k, v = fused_heads(self.qkv(modulate(layer_norm(x, EPS), shift1, scale1)), self.heads, 3)
        return (self.q_norm(q), self.k_norm(k), v), (gate1, shift2, scale2, gate2)

    def finish(self, x: Tensor, attended: Tensor, gates) -> Tensor:
        gate1, shift2, scale2, gate2 = gates
        x = x + gate1[:, None] * self.proj(attended.flatten(-2))
        return x + gate2[:, None] * self.mlp(modulate(layer_norm(x, EPS), shift2, scale2))


class DoubleBlock(nn.Module):
    def __init__(self, dim: int, count: int, rope: tuple[int, int, int], chunks: int,
                 ring: int) -> None:
        super().__init__()
        self.rope, self.chunks = rope, chunks
        self.img, self.txt = Stream(dim, count), Stream(dim, count)
        self.attn = AttentionCore(ring)

    def forward(self, img: Tensor, txt: Tensor, vec: Tensor, grid: tuple[int, int, int]):
        (iq, ik, iv), img_gates = self.img.qkv_of(img, vec)
        (tq, tk, tv), txt_gates = self.txt.qkv_of(txt, vec)
        iq, ik = (rope_3d(x, grid, self.rope, ROPE_THETA) for x in (iq, ik))
        out = self.attn(*(join(a, b, self.chunks) for a, b in ((iq, tq), (ik, tk), (iv, tv))))
        img_out, txt_out = unjoin(out, img.shape[1], self.chunks)
        return self.img.finish(img, img_out, img_gates), self.txt.finish(txt, txt_out, txt_gates)


class SingleBlock(nn.Module):
    def __init__(self, dim: int, count: int, rope: tuple[int, int, int], chunks: int,
                 ring: int) -> None:
        super().__init__()
        self.heads, self.rope, self.chunks = count, rope, chunks
        self.mod = Linear(dim, 3 * dim)
        self.qkv, self.fc1 = Linear(dim, 3 * dim), Linear(dim, 4 * dim)
        self.q_norm, self.k_norm = RMSNorm(dim // count, EPS), RMSNorm(dim // count, EPS)
        self.attn = AttentionCore(ring)
        self.proj, self.fc2 = Linear(dim, dim), Linear(4 * dim, dim, bias=False)
        self.combined = Mark()  # the sum of the two halves of the fused output projection

    def forward(self, x: Tensor, vec: Tensor, grid: tuple[int, int, int]) -> Tensor:
        shift, scale, gate = self.mod(nn.functional.silu(vec)).chunk(3, dim=-1)
        y = modulate(layer_norm(x, EPS), shift, scale)
        q, k, v = fused_heads(self.qkv(y), self.heads, 3)
        q, k = (joint_rope(x, grid, self.rope, self.chunks) for x in (self.q_norm(q), self.k_norm(k)))
        out = self.proj(self.attn(q, k, v).flatten(-2)) + self.fc2(activate(self.fc1(y), "gelu_tanh"))
        return x + gate[:, None] * self.combined(out)


class RefinerBlock(nn.Module):
    """A token-refiner block: gated self-attention and SiLU MLP over the text tokens."""

    def __init__(self, dim: int, count: int) -> None:
        super().__init__()
        self.heads = count
        self.norm1, self.norm2 = LayerNorm(dim, EPS), LayerNorm(dim, EPS)
        self.qkv, self.proj = Linear(dim, 3 * dim), Linear(dim, dim)
        self.attn = AttentionCore()
        self.mlp = Mlp(dim, 4 * dim, activation="silu")
        self.gates = Linear(dim, 2 * dim)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        gate1, gate2 = self.gates(nn.functional.silu(c)).chunk(2, dim=-1)
        q, k, v = fused_heads(self.qkv(self.norm1(x)), self.heads, 3)
        x = x + gate1[:, None] * self.proj(self.attn(q, k, v).flatten(-2))
        return x + gate2[:, None] * self.mlp(self.norm2(x))


class TokenRefiner(nn.Module):
    def __init__(self, text_dim: int, dim: int, count: int, layers: int) -> None:
        super().__init__()
        self.input_embedder = Linear(text_dim, dim)
        self.t_embedder = Mlp(FREQUENCIES, dim, dim, activation="silu")
        self.c_embedder = Mlp(text_dim, dim, dim, activation="silu")
        self.blocks = nn.ModuleList(RefinerBlock(dim, count) for _ in range(layers))

    def forward(self, text: Tensor, t: Tensor) -> Tensor:
        c = self.t_embedder(sinusoidal(t, FREQUENCIES).to(text.dtype)) + \
            self.c_embedder(text.mean(dim=1))
        x = self.input_embedder(text)
        for block in self.blocks:
            x = block(x, c)
        return x


class HunyuanVideo(nn.Module):
    def __init__(self, *, dim: int, count: int, double_layers: int, single_layers: int,
                 refiner_layers: int, in_channels: int, text_dim: int, pooled_dim: int,
                 rope: tuple[int, int, int], patch: tuple[int, int, int], chunks: int,
                 ring: int, stages: int) -> None:
        super().__init__()
        self.chunks = chunks
        if dim % count or sum(rope) != dim // count:
            raise ValueError(f"dim {dim} must be heads {count} x head dim, and the RoPE parts "
                             f"{rope} must add up to the head dim")
        self.img_in = nn.Conv3d(in_channels, dim, kernel_size=patch, stride=patch)
        self.txt_in = TokenRefiner(text_dim, dim, count, refiner_layers)
        self.time_in = Mlp(FREQUENCIES, dim, dim, activation="silu")
        self.vector_in = Mlp(pooled_dim, dim, dim, activation="silu")
        self.guidance_in = Mlp(FREQUENCIES, dim, dim, activation="silu")
        self.tokens, self.text_tokens = Mark(), Mark()
        self.double_blocks = nn.ModuleList(DoubleBlock(dim, count, rope, chunks, ring)
                                           for _ in range(double_layers))
        self.single_blocks = nn.ModuleList(SingleBlock(dim, count, rope, chunks, ring)
                                           for _ in range(single_layers))
        self.handoff = StageShift(stages)
        self.final_modulation = Linear(dim, 2 * dim)
        self.final_linear = Linear(dim, in_channels * patch[0] * patch[1] * patch[2])
        self.output = Mark()

    def forward(self, latents: Tensor, t: Tensor, text: Tensor, pooled: Tensor,
                guidance: Tensor, stale_k: Tensor | None = None,
                stale_v: Tensor | None = None) -> Tensor:
        x = self.img_in(latents)
        grid = tuple(x.shape[2:])
        img = self.tokens(x.flatten(2).transpose(1, 2))
        txt = self.text_tokens(self.txt_in(text, t))
        vec = (self.time_in(sinusoidal(t, FREQUENCIES).to(img.dtype)) + self.vector_in(pooled)
               + self.guidance_in(sinusoidal(guidance, FREQUENCIES).to(img.dtype)))
        install_stale([b.attn for b in (*self.double_blocks, *self.single_blocks)], stale_k,
                      stale_v, img.shape[1])
        for block in self.double_blocks:
            img, txt = block(img, txt, vec, grid)
        x = join(img, txt, self.chunks)
        for block in self.single_blocks:
            x = block(x, vec, grid)
        x = self.handoff(x)
        shift, scale = self.final_modulation(nn.functional.silu(vec)).chunk(2, dim=-1)
        img, _ = unjoin(x, img.shape[1], self.chunks)
        return self.output(self.final_linear(modulate(layer_norm(img, EPS), shift, scale)))


def hunyuan_video(dim: int = 64, heads: int = 4, double_layers: int = 1, single_layers: int = 1,
                  refiner_layers: int = 1, in_channels: int = 4, text_dim: int = 32,
                  pooled_dim: int = 16, rope: tuple[int, int, int] = (4, 6, 6),
                  patch: tuple[int, int, int] = (1, 2, 2), chunks: int = 1,
                  ring: int = 1, stages: int = 1) -> HunyuanVideo:
    """HunyuanVideo (tiny by default: width 64, 4 heads of 16, one block of each kind;
    ``configs.HUNYUAN_VIDEO`` is the released size). ``chunks``: the order of the joint
    sequence (``layers.join``), the sequence-parallel degree under xDiT's layouts;
    ``stages``: PipeFusion's tick (``layers.StageShift``; the forward's ``stale_k``/``stale_v``:
    the joint attentions' K/V buffers of the video tokens, ``layers.install_stale``)."""
    return HunyuanVideo(dim=dim, count=heads, double_layers=double_layers,
                        single_layers=single_layers, refiner_layers=refiner_layers,
                        in_channels=in_channels, text_dim=text_dim, pooled_dim=pooled_dim,
                        rope=tuple(rope), patch=tuple(patch), chunks=chunks,
                        ring=ring, stages=stages)
