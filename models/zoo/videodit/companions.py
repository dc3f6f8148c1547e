"""What runs outside the sampling loop of each video DiT: its text encoder(s), run once per prompt
before the loop, and its VAE, whose decoder turns the final latent into frames after it.
Torch-free data: names, parameter counts (each with where the count comes from: docs/sources.md,
"Video DiTs: outside the loop"), and the VAE's compression, which lives with the transformer's
configuration (``configs.VideoDiT.vae_stride`` and ``latent_channels``: one home for each fact).
"""

from __future__ import annotations

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
class Decoder:
    """A VAE decode traced as one call of the official code's loop: the factory of the call's
    module (``trace-module``'s import path), its released size (less the latent's channels and
    size, which :meth:`Companions.decode_call` adds), the dtype the official code runs it in, and
    the latent frames one call takes."""

    factory: str
    kwargs: dict[str, Any] = field(hash=False)
    dtype: str
    frames_per_call: int = 1

    def calls(self, latent_frames: int) -> int:
        """Calls the official decode makes for a latent of ``latent_frames`` frames."""
        return -(-latent_frames // self.frames_per_call)


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

    def decode_call(self, frames: int, height: int, width: int) -> tuple[dict[str, Any], list[str], int]:
        """The decoder factory's keyword arguments, ``trace-module``'s inputs of one call, and the
        calls of one decode, for a video of this shape (the model's decoder must be traced)."""
        if self.decoder is None:
            raise ValueError(f"{self.model.name}: its VAE decode is not traced")
        t, h, w = self.model.latent(frames, height, width)
        latent = (1, self.model.latent_channels, self.decoder.frames_per_call, h, w)
        inputs = [f"latent={'x'.join(map(str, latent))}:{self.decoder.dtype}"]
        kwargs = {**self.decoder.kwargs, "z_dim": self.model.latent_channels, "height": h, "width": w}
        return kwargs, inputs, self.decoder.calls(t)


LLAVA_LLAMA3_8B = Component(
    "text encoder", "MLLM: LLaVA-LLaMA-3-8B's language model (hidden states, 4096 wide)",
    8_030_261_248, "Meta Llama 3 8B model card: 8.03 B")
CLIP_L = Component("text encoder", "CLIP ViT-L/14 text encoder (pooled, 768 wide)", 123_060_480,
                   "openai/clip-vit-large-patch14's text model: 123.06 M")
UMT5_XXL = Component("text encoder", "umT5-XXL encoder (4096 wide)", 5_680_000_000,
                     "released bf16 encoder file of 11.36 GB / 2 bytes")
#: Wan-VAE's decoder (``wan_vae.py``): released width 96, multipliers (1, 2, 4, 4), 2 residual
#: blocks per encoder stage, temporal downsampling in the last two (upsampling in the decoder's
#: first two); the official decode runs it in float32 (``WanVAE``'s default dtype), one latent
#: frame a call, no spatial tiling.
WAN_VAE_DECODER = Decoder("models.zoo.videodit.wan_vae:wan_vae_decoder",
                          dict(dim=96, mult=(1, 2, 4, 4), res_blocks=2,
                               temporal=(True, True, False)), "float32")
WAN_VAE = Component("VAE", "Wan-VAE (causal 3D, feature cache)", 127_000_000, "Wan paper: 127 M")
T5_XXL = Component("text encoder", "T5 v1.1 XXL encoder (4096 wide)", 4_762_310_656,
                   "t5x's XXL configuration (the OpenSora study's count)")

COMPANIONS = {c.model.name: c for c in (
    Companions(HUNYUAN_VIDEO, (LLAVA_LLAMA3_8B, CLIP_L),
               Component("VAE", "HunyuanVideo causal 3D VAE", 246_500_000,
                         "released float32 weights of 986 MB / 4 bytes"),
               ((129, 720, 1280), (129, 544, 960))),
    Companions(WAN21_14B, (UMT5_XXL,), WAN_VAE, ((81, 480, 832), (81, 720, 1280)), WAN_VAE_DECODER),
    Companions(WAN21_1_3B, (UMT5_XXL,), WAN_VAE, ((81, 480, 832),), WAN_VAE_DECODER),
    Companions(COGVIDEOX_5B, (T5_XXL,),
               Component("VAE", "CogVideoX causal 3D VAE", 215_610_000,
                         "released 16-bit weights of 431.2 MB / 2 bytes"),
               ((49, 480, 720),)),
)}
