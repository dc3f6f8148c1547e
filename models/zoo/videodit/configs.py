"""The released sizes of the three video DiTs and how their official samplers run them (every
value's source: docs/sources.md, "Video DiTs"). Torch-free: the factories' keyword arguments,
the latent shape of a video, the tokens it makes, and the sampler's batch, steps and text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class VideoDiT:
    name: str
    factory: str                 # trace-module's import path
    kwargs: dict[str, Any] = field(hash=False)
    batch: int                   # 2: classifier-free guidance's two branches; 1: embedded guidance
    steps: int                   # the official sampler's default
    text_tokens: int             # the text length the transformer attends to
    text_dim: int
    latent_channels: int
    vae_stride: tuple[int, int, int]  # the VAE's compression (frames, height, width)
    patch: tuple[int, int, int]
    frames_first: bool = False   # latents (B, T, C, H, W) instead of (B, C, T, H, W)

    def latent(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        """(T, H, W) of the latent of a video: the VAE keeps the first frame and compresses the
        rest by its temporal stride."""
        st, sh, sw = self.vae_stride
        return (frames - 1) // st + 1, height // sh, width // sw

    def video_tokens(self, frames: int, height: int, width: int) -> int:
        t, h, w = self.latent(frames, height, width)
        pt, ph, pw = self.patch
        return (t // pt) * (h // ph) * (w // pw)


HUNYUAN_VIDEO = VideoDiT(
    "hunyuan_video", "models.zoo.videodit.hunyuan_video:hunyuan_video",
    dict(dim=3072, heads=24, double_layers=20, single_layers=40, refiner_layers=2,
         in_channels=16, text_dim=4096, pooled_dim=768, rope=(16, 56, 56), patch=(1, 2, 2)),
    batch=1, steps=50, text_tokens=256, text_dim=4096, latent_channels=16,
    vae_stride=(4, 8, 8), patch=(1, 2, 2))

WAN21_14B = VideoDiT(
    "wan21_14b", "models.zoo.videodit.wan21:wan21",
    dict(dim=5120, ffn=13824, heads=40, layers=40, in_channels=16, text_dim=4096,
         frequencies=256, patch=(1, 2, 2)),
    batch=2, steps=50, text_tokens=512, text_dim=4096, latent_channels=16,
    vae_stride=(4, 8, 8), patch=(1, 2, 2))

WAN21_1_3B = VideoDiT(
    "wan21_1.3b", "models.zoo.videodit.wan21:wan21",
    dict(dim=1536, ffn=8960, heads=12, layers=30, in_channels=16, text_dim=4096,
         frequencies=256, patch=(1, 2, 2)),
    batch=2, steps=50, text_tokens=512, text_dim=4096, latent_channels=16,
    vae_stride=(4, 8, 8), patch=(1, 2, 2))

COGVIDEOX_5B = VideoDiT(
    "cogvideox_5b", "models.zoo.videodit.cogvideox:cogvideox",
    dict(heads=48, head_dim=64, layers=42, in_channels=16, patch=2, text_dim=4096,
         time_dim=512),
    batch=2, steps=50, text_tokens=226, text_dim=4096, latent_channels=16,
    vae_stride=(4, 8, 8), patch=(1, 2, 2), frames_first=True)

MODELS = {m.name: m for m in (HUNYUAN_VIDEO, WAN21_14B, WAN21_1_3B, COGVIDEOX_5B)}
