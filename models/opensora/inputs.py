"""Model inputs for a video shape string `F_W_H` (frames, width, height in pixels).

The VAE of OpenSora v1.2 compresses time by 17 -> 5 and space by 8, so the latent `z` is
`(B, in_channels, F*5//17, H//8, W//8)`. The patch embedding pads the latent to a multiple of the
patch, giving T = ceil(T_lat / p_t) temporal and S = ceil(H_lat / p_h) * ceil(W_lat / p_w) spatial
tokens, N = T * S in all. `parse_shape` and `geometry` do not need torch; `make_inputs` does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hlo_trace.numbers import brief, parse_int
from models.opensora.config import MAX_SIZE, STDiT3Config
from models.opensora.errors import ShapeError

if TYPE_CHECKING:
    import torch

__all__ = [
    "OPENSORA_DURATIONS",
    "OPENSORA_RESOLUTIONS",
    "REFERENCE_SHAPES",
    "Geometry",
    "VideoShape",
    "geometry",
    "latent_frames",
    "make_inputs",
    "opensora_shape",
    "parse_shape",
]

# The four shapes the reference notes measure (frames_width_height).
REFERENCE_SHAPES = ("204_640_360", "408_640_360", "51_1280_720", "102_1280_720")

#: OpenSora v1.2's named resolutions at its default aspect ratio "9:16" as (width, height) in
#: pixels: ``opensora/datasets/aspect.py`` (tag v1.2.0), ``ASPECT_RATIO_MAP["9:16"] = "0.56"`` and
#: ``ASPECT_RATIO_360P / _480P / _720P["0.56"]`` = (height, width) (360, 640), (480, 854),
#: (720, 1280); ``get_image_size(resolution, "9:16")`` reads them, and "9:16" is the gradio
#: demo's default (``gradio/app.py``), the setting of the README's published timings.
OPENSORA_RESOLUTIONS = {"360p": (640, 360), "480p": (854, 480), "720p": (1280, 720)}
#: Frames of a named duration: ``NUM_FRAMES_MAP`` of the same file.
OPENSORA_DURATIONS = {"2s": 51, "4s": 102, "8s": 204, "16s": 408}

#: ASCII digits only, no blanks: ``\d`` and ``int()`` would also take other scripts' digits.
_SHAPE_RE = re.compile(r"([0-9]+)_([0-9]+)_([0-9]+)")


@dataclass(frozen=True)
class VideoShape:
    """A generated video's size in pixels and frames."""

    frames: int
    width: int
    height: int

    def __str__(self) -> str:
        return f"{self.frames}_{self.width}_{self.height}"


@dataclass(frozen=True)
class Geometry:
    """Latent and token sizes of one video shape under one config (batch not included)."""

    T_lat: int  # latent frames
    H_lat: int  # latent height
    W_lat: int  # latent width
    T: int  # temporal tokens (latent frames after temporal patching)
    H_patches: int  # spatial tokens along the height
    W_patches: int  # spatial tokens along the width
    token: int  # caption tokens per sample (TOKEN)

    @property
    def S(self) -> int:
        """Spatial tokens per frame."""
        return self.H_patches * self.W_patches

    @property
    def N(self) -> int:
        """Video tokens per sample."""
        return self.T * self.S


def parse_shape(text: str | VideoShape) -> VideoShape:
    """`"204_640_360"` -> VideoShape(frames=204, width=640, height=360)."""
    if isinstance(text, VideoShape):
        return text
    match = _SHAPE_RE.fullmatch(str(text))
    if not match:
        raise ShapeError(
            f"bad video shape {brief(text)}: expected FRAMES_WIDTH_HEIGHT in ASCII digits, "
            "e.g. 204_640_360")
    try:  # digits counted before they are converted: no 5,000-digit int()
        frames, width, height = (parse_int(g, minimum=0, maximum=MAX_SIZE) for g in match.groups())
    except ValueError:
        raise ShapeError(f"bad video shape {brief(text)}: frames, width and height must be at "
                         f"most {MAX_SIZE} (an int32 size)") from None
    if min(frames, width, height) <= 0:
        raise ShapeError(f"bad video shape {brief(text)}: frames, width and height must be positive")
    return VideoShape(frames, width, height)


def opensora_shape(resolution: str, duration: str) -> str:
    """The shape ``FRAMES_WIDTH_HEIGHT`` of an OpenSora v1.2 video named by resolution and
    duration (``"480p", "4s"`` -> ``"102_854_480"``); ShapeError for a name it does not have."""
    if resolution not in OPENSORA_RESOLUTIONS or duration not in OPENSORA_DURATIONS:
        raise ShapeError(f"no OpenSora v1.2 video {resolution!r} x {duration!r}: expected one of "
                         f"{', '.join(OPENSORA_RESOLUTIONS)} and {', '.join(OPENSORA_DURATIONS)}")
    width, height = OPENSORA_RESOLUTIONS[resolution]
    return f"{OPENSORA_DURATIONS[duration]}_{width}_{height}"


def latent_frames(frames: int) -> int:
    """Latent frames of the OpenSora v1.2 VAE: 17 video frames become 5 latent frames."""
    return frames * 5 // 17


def geometry(config: STDiT3Config, shape: str | VideoShape) -> Geometry:
    """The latent and token sizes; ShapeError when the video is too small to give one patch."""
    video = parse_shape(shape)
    t_lat = latent_frames(video.frames)
    h_lat = video.height // config.vae_downsample
    w_lat = video.width // config.vae_downsample
    if t_lat < 1 or h_lat < 1 or w_lat < 1:
        raise ShapeError(
            f"video shape {video} is too small to patch: latent (frames, height, width) = "
            f"({t_lat}, {h_lat}, {w_lat}); expected at least 4 frames and "
            f"{config.vae_downsample} pixels per side")
    pt, ph, pw = config.patch_size
    return Geometry(
        T_lat=t_lat, H_lat=h_lat, W_lat=w_lat,
        T=math.ceil(t_lat / pt), H_patches=math.ceil(h_lat / ph), W_patches=math.ceil(w_lat / pw),
        token=config.model_max_length,
    )


def make_inputs(config: STDiT3Config, shape: str | VideoShape, batch: int = 2,
                dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs of one denoising step: z, y (caption features), t (timesteps), fps.

    `batch` is 2 by default: classifier-free guidance runs the conditional and the unconditional
    sample together. Values are drawn on the CPU from `seed` (so two calls agree) and then moved;
    on the `meta` device nothing is drawn.
    """
    import torch

    if batch < 1:
        raise ShapeError(f"batch={batch}: expected a positive batch size")
    dtype = torch.float32 if dtype is None else dtype
    geo = geometry(config, shape)
    shapes = {
        "z": (batch, config.in_channels, geo.T_lat, geo.H_lat, geo.W_lat),
        "y": (batch, 1, config.model_max_length, config.caption_channels),
    }
    if device is not None and torch.device(device).type == "meta":
        out = {name: torch.empty(s, dtype=dtype, device="meta") for name, s in shapes.items()}
        out["t"] = torch.empty((batch,), dtype=dtype, device="meta")
        out["fps"] = torch.empty((1,), dtype=dtype, device="meta")
        return out
    gen = torch.Generator().manual_seed(seed)
    out = {name: torch.randn(s, generator=gen) for name, s in shapes.items()}
    out["t"] = torch.rand((batch,), generator=gen) * 1000.0  # diffusion timestep in [0, 1000)
    out["fps"] = torch.tensor([24.0])
    return {name: v.to(dtype=dtype, device=device) for name, v in out.items()}
