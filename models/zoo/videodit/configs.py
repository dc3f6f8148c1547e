"""The released sizes of the three video DiTs and how their official samplers run them (every
value's source: docs/sources.md, "Video DiTs"). Torch-free: the factories' keyword arguments,
the latent shape of a video, the tokens it makes, the sampler's batch, steps and text, and how a
whole model is put together from traces of its parts (one block of each kind, and one more).

**Full size by blocks.** A model too large to trace whole is traced as its *parts*: the base
(one block of each kind: HunyuanVideo's dual- and single-stream blocks, the others' one kind,
``VideoDiT.blocks``) and, per kind, the base with one more block of that kind. A block of a kind
is the difference of its part and the base; every additive figure of the whole model (FLOPs,
collective bytes, weights, predicted seconds) is :func:`scaled`: the base's, plus per kind its
layer count less one times that difference. (No part without blocks: a plan's rules must each
match a module.) The blocks of one kind are identical and run one after another, so the whole
model's peak of live activations is the largest of its parts' (:func:`peak`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The part with one block of each kind.
BASE = "base"


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
    #: the factory's layer-count arguments, one per kind of block
    blocks: tuple[str, ...] = ("layers",)
    #: conditioning vectors per sample beside the text: (name, width; 0 for a scalar per sample)
    vectors: tuple[tuple[str, int], ...] = ()

    @property
    def model(self) -> str:
        """The factory's name (``plans.NAMES``' key)."""
        return self.factory.rpartition(":")[2]

    def counts(self) -> dict[str, int]:
        """Blocks of each kind in the released model."""
        return {kind: self.kwargs[kind] for kind in self.blocks}

    def inputs(self, frames: int, height: int, width: int, dtype: str) -> list[str]:
        """``trace-module --input`` specs of one call of the transformer as the sampler makes it."""
        t, h, w = self.latent(frames, height, width)
        video = (t, self.latent_channels) if self.frames_first else (self.latent_channels, t)
        shapes = [("latents", (self.batch, *video, h, w)), ("t", (self.batch,)),
                  ("text", (self.batch, self.text_tokens, self.text_dim))]
        shapes += [(name, (self.batch, size) if size else (self.batch,)) for name, size in self.vectors]
        return [f"{name}={'x'.join(map(str, shape))}:{dtype}" for name, shape in shapes]

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
    vae_stride=(4, 8, 8), patch=(1, 2, 2), blocks=("double_layers", "single_layers"),
    vectors=(("pooled", 768), ("guidance", 0)))

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


def parts(blocks: tuple[str, ...]) -> tuple[str, ...]:
    """The parts a model of these kinds of block is traced as: the base, and one per kind (the
    base with one more block of that kind)."""
    return (BASE, *blocks)


def part_kwargs(kwargs: Mapping[str, Any], blocks: tuple[str, ...], part: str) -> dict[str, Any]:
    """The factory's keyword arguments of one part (:func:`parts`)."""
    if part != BASE and part not in blocks:
        raise ValueError(f"part {part!r}: expected {BASE!r} or one of {', '.join(blocks)}")
    return {**kwargs, **{kind: 1 + int(kind == part) for kind in blocks}}


def scaled(figures: Mapping[str, float], counts: Mapping[str, int]) -> float:
    """An additive figure of the whole model from its parts' (``figures`` by part): the base's
    plus, per kind, the blocks beyond the base's one times the part's excess over the base."""
    base = figures[BASE]
    return base + sum((count - 1) * (figures[kind] - base) for kind, count in counts.items())


def peak(figures: Mapping[str, float]) -> float:
    """The whole model's peak of live activations: the largest of its parts' peaks."""
    return max(figures.values())
