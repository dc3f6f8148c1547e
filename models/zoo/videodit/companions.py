"""What runs outside the sampling loop of each video DiT: its text encoder(s), run once per prompt
before the loop, and its VAE, whose decoder turns the final latent into frames after it.
Torch-free data: names, parameter counts (each with where the count comes from: docs/sources.md,
"Video DiTs: outside the loop"), and the VAE's compression, which lives with the transformer's
configuration (``configs.VideoDiT.vae_stride`` and ``latent_channels``: one home for each fact).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from models.zoo.videodit.configs import COGVIDEOX_5B, HUNYUAN_VIDEO, WAN21_1_3B, WAN21_14B, VideoDiT

#: Bytes of one parameter in bfloat16.
BF16_BYTES = 2


@dataclass(frozen=True)
class Component:
    """One network outside the loop: a text encoder or a VAE."""

    role: str          # "text encoder" or "VAE"
    name: str
    parameters: int
    basis: str         # how the count is known (the source: docs/sources.md)

    @property
    def bf16_bytes(self) -> int:
        return BF16_BYTES * self.parameters


@dataclass(frozen=True)
class Tiling:
    """The official decode's spatial tiling: tiles of ``size`` (height, width) latent pixels
    starting every ``stride`` (neighbours overlap by size - stride, blended), the last in each
    direction cut at the latent's edge; used where the latent exceeds a tile."""

    size: tuple[int, int]
    stride: tuple[int, int]

    def grid(self, height: int, width: int) -> tuple[list[int], list[int]]:
        """The heights of the tiles' rows and the widths of their columns (latent pixels), in order."""
        if height <= self.size[0] and width <= self.size[1]:
            return [height], [width]
        return ([min(self.size[0], height - i) for i in range(0, height, self.stride[0])],
                [min(self.size[1], width - j) for j in range(0, width, self.stride[1])])

    def tiles(self, height: int, width: int) -> Counter[tuple[int, int]]:
        """How many tiles of each (height, width) a latent of ``height`` x ``width`` is cut into."""
        rows, cols = self.grid(height, width)
        return Counter((r, c) for r in rows for c in cols)


@dataclass(frozen=True)
class Decoder:
    """A VAE decode traced as calls of the official code's loop: the factory of a call's module
    (``trace-module``'s import path), its released size (less the latent's channels and the tile's
    size, which :meth:`Companions.decode_calls` adds), the dtype the official code runs it in, the
    latent frames one call takes (the first call also the remainder; with a cache carried
    between the calls), or else the temporal tiling ((size, stride): tiles of size + 1 latent
    frames every stride, each one call, where the latent has more than size frames), the
    spatial tiling, and how the calls' frames are joined."""

    factory: str
    kwargs: dict[str, Any] = field(hash=False)
    dtype: str
    frames_per_call: int = 1
    tiling: Tiling | None = None
    time_tiling: tuple[int, int] | None = None
    #: each call's frames joined to the video so far (Wan's loop), else a tile's calls joined once
    running_join: bool = False

    def time_tiles(self, latent_frames: int) -> list[list[int]]:
        """The latent frames of each call the official decode makes on one spatial tile of a
        latent of ``latent_frames`` frames, by temporal tile, in order: one call per temporal
        tile, or else one temporal tile of ``latent_frames // frames_per_call`` calls (at least
        one), the first taking the remainder too."""
        if self.time_tiling is not None:
            size, stride = self.time_tiling
            if latent_frames <= size:
                return [[latent_frames]]
            return [[min(size + 1, latent_frames - i)] for i in range(0, latent_frames, stride)]
        calls = max(latent_frames // self.frames_per_call, 1)
        first = latent_frames - (calls - 1) * self.frames_per_call
        return [[first] + [self.frames_per_call] * (calls - 1)]

    def calls(self, latent_frames: int) -> Counter[int]:
        """How many calls of each frame count the official decode makes on one spatial tile
        (:meth:`time_tiles`)."""
        return Counter(f for tile in self.time_tiles(latent_frames) for f in tile)


@dataclass(frozen=True)
class DecodeCall:
    """One shape of call of a decode: the factory's keyword arguments, ``trace-module``'s inputs,
    how many such calls one decode makes, and a name for the shape."""

    kwargs: dict[str, Any] = field(hash=False)
    inputs: tuple[str, ...]
    count: int
    shape: str


@dataclass(frozen=True)
class Companions:
    """A video DiT's text encoders and VAE, and the standard video shapes it samples."""

    model: VideoDiT
    text_encoders: tuple[Component, ...]
    vae: Component
    #: (frames, height, width) of the shapes the model card names
    shapes: tuple[tuple[int, int, int], ...]
    #: the VAE decode's traced call, where its architecture is written (``None``: not traced)
    decoder: Decoder | None = None

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(channels, T, H, W) of the latent the VAE decodes for a video of this shape."""
        return (self.model.latent_channels, *self.model.latent(frames, height, width))

    def decode_calls(self, frames: int, height: int, width: int) -> tuple[DecodeCall, ...]:
        """The calls of one decode of a video of this shape, one entry per shape of call (tile and
        latent frames), as the official code's loop makes them (the model's decoder must be
        traced)."""
        if self.decoder is None:
            raise ValueError(f"{self.model.name}: its VAE decode is not traced")
        t, h, w = self.model.latent(frames, height, width)
        tiles = self.decoder.tiling.tiles(h, w) if self.decoder.tiling else Counter({(h, w): 1})
        calls = []
        for (th, tw), n_tiles in sorted(tiles.items(), reverse=True):
            for ft, n_calls in sorted(self.decoder.calls(t).items()):
                latent = (1, self.model.latent_channels, ft, th, tw)
                kwargs = {**self.decoder.kwargs, "z_dim": self.model.latent_channels, "height": th, "width": tw}
                calls.append(DecodeCall(kwargs, (f"latent={'x'.join(map(str, latent))}:{self.decoder.dtype}",),
                                        n_tiles * n_calls, f"{ft}x{th}x{tw}"))
        return tuple(calls)

    def assembly(self, frames: int, height: int, width: int) -> DecodeCall:
        """The blending and assembly of the decoded calls into the video, one traced program
        (``vae_assembly.py``): the factory's keyword arguments (the calls of each temporal tile,
        the tiles' rows and columns, the tiling's size and stride in latent units, the VAE's
        compression) and one input per call's decoded frames (:func:`decoded_outputs`)."""
        if self.decoder is None:
            raise ValueError(f"{self.model.name}: its VAE decode is not traced")
        t, h, w = self.model.latent(frames, height, width)
        tiling = self.decoder.tiling or Tiling((h, w), (h, w))
        rows, cols = tiling.grid(h, w)
        calls = self.decoder.time_tiles(t)
        scale = (self.model.vae_stride[0], self.model.vae_stride[1])
        kwargs = dict(calls=calls, rows=rows, cols=cols, tile=tiling.size, stride=tiling.stride,
                      time_tile=self.decoder.time_tiling or (0, 0), scale=scale,
                      running=self.decoder.running_join)
        inputs = tuple(f"{name}={'x'.join(map(str, shape))}:{self.decoder.dtype}"
                       for name, shape in decoded_outputs(calls, rows, cols, scale))
        return DecodeCall(kwargs, inputs, 1, "assembly")


#: The factory of a decode's assembly (``trace-module``'s import path).
ASSEMBLY_FACTORY = "models.zoo.videodit.vae_assembly:vae_decode_assembly"
#: The channels of a decoded video (RGB).
VIDEO_CHANNELS = 3


def decoded_outputs(calls: list[list[int]], rows: list[int], cols: list[int],
                    scale: tuple[int, int]) -> list[tuple[str, tuple[int, ...]]]:
    """The name and shape of each call's decoded frames, in the official loop's order: temporal
    tile k, tile row i, column j, call c: ``out_k_i_j_c``, (1, 3, frames, height, width). A
    causal VAE's first call on a sequence (a temporal tile) makes 1 + scale x (f - 1) frames of
    its f latent frames, a later one (its cache carried) scale x f; a tile of h x w latent
    pixels decodes to scale x h by scale x w."""
    time, space = scale
    return [(f"out_{k}_{i}_{j}_{c}",
             (1, VIDEO_CHANNELS, time * f - (time - 1 if c == 0 else 0), space * h, space * w))
            for k, tile in enumerate(calls) for i, h in enumerate(rows) for j, w in enumerate(cols)
            for c, f in enumerate(tile)]


LLAVA_LLAMA3_8B = Component(
    "text encoder", "MLLM: LLaVA-LLaMA-3-8B's language model (hidden states, 4096 wide)",
    8_030_261_248, "Meta Llama 3 8B model card: 8.03 B")
CLIP_L = Component("text encoder", "CLIP ViT-L/14 text encoder (pooled, 768 wide)", 123_060_480,
                   "openai/clip-vit-large-patch14's text model: 123.06 M")
#: HunyuanVideo's decoder (``hunyuan_vae.py``): released widths 128, 256, 512, 512, 2 layers a
#: block, 32 groups, time compression 4 (the last two upsampling stages upsample in time); the
#: official ``sample_video.py`` decodes in float16 (``--vae-precision`` fp16) with tiling on
#: (``--vae-tiling`` defaults to true): temporal tiles of 64 / 4 = 16 (+ 1) latent frames every
#: int(16 x 3/4) = 12, spatial tiles of 256 / 8 = 32 latent pixels every int(32 x 3/4) = 24 (the
#: class's defaults: sample size 256, 64 frames, overlap 1/4), each tile one call, no cache.
HUNYUAN_VAE_DECODER = Decoder("models.zoo.videodit.hunyuan_vae:hunyuan_vae_decoder",
                              dict(widths=(128, 256, 512, 512), layers=2, groups=32, temporal=2),
                              "float16", tiling=Tiling((32, 32), (24, 24)), time_tiling=(16, 12))
UMT5_XXL = Component("text encoder", "umT5-XXL encoder (4096 wide)", 5_680_000_000,
                     "released bf16 encoder file of 11.36 GB / 2 bytes")
#: Wan-VAE's decoder (``wan_vae.py``): released width 96, multipliers (1, 2, 4, 4), 2 residual
#: blocks per encoder stage, temporal downsampling in the last two (upsampling in the decoder's
#: first two); the official decode runs it in float32 (``WanVAE``'s default dtype), one latent
#: frame a call, no spatial tiling, each call's frames joined to the video so far.
WAN_VAE_DECODER = Decoder("models.zoo.videodit.wan_vae:wan_vae_decoder",
                          dict(dim=96, mult=(1, 2, 4, 4), res_blocks=2,
                               temporal=(True, True, False)), "float32", running_join=True)
WAN_VAE = Component("VAE", "Wan-VAE (causal 3D, feature cache)", 127_000_000, "Wan paper: 127 M")
#: CogVideoX's decoder (``cogvideox_vae.py``): the released ``vae/config.json`` (block widths 128,
#: 256, 256, 512, 3 layers a block, 32 groups, temporal compression 4: the first two decoder stages
#: upsample in time); the official pipeline runs it in bfloat16 with tiling enabled (the model
#: card's and the CogVideo demo's ``enable_tiling``): tiles of half the 480 x 720 sample size,
#: 240 x 360 pixels = 30 x 45 latent pixels, overlapping by 1/6 in height and 1/5 in width (a
#: stride of int(30 x 5/6) = 25, int(45 x 4/5) = 36), 2 latent frames a call.
COGVIDEOX_VAE_DECODER = Decoder("models.zoo.videodit.cogvideox_vae:cogvideox_vae_decoder",
                                dict(widths=(128, 256, 256, 512), layers=3, groups=32, temporal=2),
                                "bfloat16", frames_per_call=2, tiling=Tiling((30, 45), (25, 36)))
T5_XXL = Component("text encoder", "T5 v1.1 XXL encoder (4096 wide)", 4_762_310_656,
                   "t5x's XXL configuration (the OpenSora study's count)")

COMPANIONS = {c.model.name: c for c in (
    Companions(HUNYUAN_VIDEO, (LLAVA_LLAMA3_8B, CLIP_L),
               Component("VAE", "HunyuanVideo causal 3D VAE", 246_500_000,
                         "released float32 weights of 986 MB / 4 bytes"),
               ((129, 720, 1280), (129, 544, 960)), HUNYUAN_VAE_DECODER),
    Companions(WAN21_14B, (UMT5_XXL,), WAN_VAE, ((81, 480, 832), (81, 720, 1280)), WAN_VAE_DECODER),
    Companions(WAN21_1_3B, (UMT5_XXL,), WAN_VAE, ((81, 480, 832),), WAN_VAE_DECODER),
    Companions(COGVIDEOX_5B, (T5_XXL,),
               Component("VAE", "CogVideoX causal 3D VAE", 215_610_000,
                         "released 16-bit weights of 431.2 MB / 2 bytes"),
               ((49, 480, 720),), COGVIDEOX_VAE_DECODER),
)}
