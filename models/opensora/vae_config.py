"""OpenSora v1.2's VAE (``OpenSoraVAE_V1_2``): its configuration and how a generation's decode is
cut into calls. No torch: the GPU predictions and the docs read it too.

A generation ends by decoding the latent video (B, 4, T_lat, H/8, W/8) that the sampling loop
produced, in two steps (OpenSora's ``VideoAutoencoderPipeline.decode``):

1. **temporal**: the latent is scaled and shifted per channel, cut into chunks of
   ``micro_z_frames`` = 5 latent frames, and each chunk goes through the temporal VAE's decoder
   (``VAE_Temporal_SD``: causal 3-D convolutions, 4x upsampling in time) to 20 frames, of which the
   first 3 (the causal padding of 17 frames to a multiple of 4) are dropped: 17 frames a chunk, 4
   channels, still at the latent's height and width;
2. **spatial**: the B*T frames go through the SDXL VAE's decoder (diffusers ``AutoencoderKL``,
   8x upsampling in height and width) ``micro_batch`` = 4 frames a call.

So a generation's decode is ``chunks`` temporal calls and ``spatial_calls`` spatial calls of one
traced program each (:func:`decode_plan`); the last spatial call may hold fewer frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.opensora.inputs import latent_frames, parse_shape

__all__ = ["FULL_VAE", "MAX_DIMENSION", "TINY_VAE", "DecodePlan", "VAEConfig", "check_traceable",
           "decode_plan", "get_vae_config", "largest_dimension"]

#: Largest dimension XLA takes (its shapes' dimensions are int32: "exceeds the INT_MAX limit").
MAX_DIMENSION = 2**31 - 1


@dataclass(frozen=True)
class VAEConfig:
    """The sizes of OpenSoraVAE_V1_2's two decoders (defaults: the released model)."""

    latent_channels: int = 4
    #: SDXL VAE (``PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers``, subfolder ``vae``): encoder
    #: order of the block widths; the decoder runs them reversed.
    spatial_block_channels: tuple[int, ...] = (128, 256, 512, 512)
    spatial_layers_per_block: int = 2        # the decoder has one more resnet per block
    spatial_groups: int = 32
    spatial_eps: float = 1e-6
    spatial_attention_head_dim: int = 512    # the mid block's attention: one head over all channels
    image_channels: int = 3
    #: ``VAE_Temporal_SD``: filters 128, 4 residual blocks a level, multipliers (1, 2, 2, 4), time
    #: upsampled by 2 where the encoder downsampled (levels 1 and 2).
    temporal_filters: int = 128
    temporal_res_blocks: int = 4
    temporal_multipliers: tuple[int, ...] = (1, 2, 2, 4)
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    temporal_groups: int = 32
    temporal_eps: float = 1e-5               # nn.GroupNorm's default
    #: The pipeline (``OpenSoraVAE_V1_2``'s defaults in the v1.2 inference configs).
    micro_frame_size: int = 17
    micro_batch: int = 4
    spatial_factor: int = 8                  # pixels per latent cell along H and W
    scaling_factor: float = 0.18215          # the SDXL VAE's latent scale
    shift: tuple[float, ...] = (-0.10, 0.34, 0.27, 0.98)
    scale: tuple[float, ...] = (3.85, 2.32, 2.33, 3.06)

    @property
    def time_factor(self) -> int:
        """How many frames one latent frame decodes to, before the causal padding is cut."""
        return 2 ** sum(self.temporal_downsample)

    @property
    def micro_z_frames(self) -> int:
        """Latent frames of one temporal chunk (5 for 17 frames)."""
        return latent_frames(self.micro_frame_size)

    @property
    def time_padding(self) -> int:
        """Frames the temporal decoder makes in front of a chunk's ``micro_frame_size`` and drops."""
        return -self.micro_frame_size % self.time_factor


FULL_VAE = VAEConfig()
#: A small decoder of the same structure (tests: seconds to trace).
TINY_VAE = VAEConfig(spatial_block_channels=(8, 16), spatial_layers_per_block=1, spatial_groups=4,
                     spatial_attention_head_dim=16, temporal_filters=8, temporal_res_blocks=1,
                     temporal_multipliers=(1, 2, 2), temporal_downsample=(True, True),
                     temporal_groups=4)


def get_vae_config(name: str) -> VAEConfig:
    """``full`` or ``tiny``; ValueError otherwise."""
    configs = {"full": FULL_VAE, "tiny": TINY_VAE}
    if name not in configs:
        raise ValueError(f"VAE config {name!r}: expected one of {', '.join(configs)}")
    return configs[name]


@dataclass(frozen=True)
class DecodePlan:
    """The calls that decode one sample of a video shape."""

    chunks: int              # temporal decoder calls (micro_z_frames latent frames each)
    frames: int              # frames they make, all decoded spatially
    spatial_calls: int       # spatial decoder calls (micro_batch frames each, the last maybe fewer)
    last_call_frames: int    # frames of the last spatial call
    latent_height: int
    latent_width: int

    micro_batch: int         # frames of a full spatial call

    @property
    def spatial_call_equivalents(self) -> float:
        """Spatial calls counted as full ``micro_batch`` calls: the decoder's work is per frame,
        so a last call of fewer frames costs its share of a full one."""
        return self.frames / self.micro_batch


def decode_plan(shape: str, config: VAEConfig = FULL_VAE) -> DecodePlan:
    """How one sample of ``shape`` (``FRAMES_WIDTH_HEIGHT``) is decoded: ValueError when its
    latent frames are no whole number of chunks (OpenSora's shapes are multiples of 17 frames)."""
    video = parse_shape(shape)
    latent = latent_frames(video.frames)
    if min(video.height, video.width) < config.spatial_factor:
        raise ValueError(f"{shape}: {video.width}x{video.height} pixels make a latent of "
                         f"{video.width // config.spatial_factor}x"
                         f"{video.height // config.spatial_factor}; expected at least "
                         f"{config.spatial_factor} pixels per side (one latent cell)")
    if latent % config.micro_z_frames:
        raise ValueError(f"{shape}: {latent} latent frames are no whole number of "
                         f"{config.micro_z_frames}-frame chunks (expected a multiple of "
                         f"{config.micro_frame_size} frames)")
    chunks = latent // config.micro_z_frames
    frames = chunks * config.micro_frame_size
    calls = math.ceil(frames / config.micro_batch)
    return DecodePlan(chunks=chunks, frames=frames, spatial_calls=calls,
                      last_call_frames=frames - (calls - 1) * config.micro_batch,
                      latent_height=video.height // config.spatial_factor,
                      latent_width=video.width // config.spatial_factor,
                      micro_batch=config.micro_batch)


def largest_dimension(config: VAEConfig, plan: DecodePlan, part: str) -> tuple[str, int]:
    """The largest dimension any tensor of one traced ``part`` call holds, and where: a
    GroupNorm views its input as (batch, groups, channels / groups * frames * height * width),
    which is the largest dimension of the call (the attention's tokens, height * width of the
    latent, are fewer)."""
    h, w = plan.latent_height, plan.latent_width
    if part == "spatial":
        widths = list(reversed(config.spatial_block_channels))
        groups = config.spatial_groups
        sizes = [(widths[0], 1)]  # the mid block
        for level, width in enumerate(widths):  # level i at 2**i times the latent
            before = widths[level - 1] if level else widths[0]
            sizes += [(before, 2**level), (width, 2**level)]
        channels, scale = max(sizes, key=lambda item: item[0] * item[1] ** 2)
        return (f"the spatial decoder's GroupNorm over {channels} channels at "
                f"{h * scale}x{w * scale}"), channels // groups * h * scale * w * scale
    widths = [config.temporal_filters * m for m in config.temporal_multipliers]
    frames = config.micro_z_frames
    sizes = [(widths[-1], frames)]
    width = widths[-1]
    for level in reversed(range(len(widths))):
        sizes += [(width, frames), (widths[level], frames)]
        width = widths[level]
        if level > 0 and config.temporal_downsample[level - 1]:
            frames *= 2
            sizes.append((width, frames))
    channels, frames = max(sizes, key=lambda item: item[0] * item[1])
    return (f"the temporal decoder's GroupNorm over {channels} channels of {frames} frames at "
            f"{h}x{w}"), channels // config.temporal_groups * frames * h * w


def check_traceable(config: VAEConfig, plan: DecodePlan, part: str) -> None:
    """ValueError when one ``part`` call of ``plan`` holds a dimension beyond what XLA takes
    (``MAX_DIMENSION``): found before a trace, not by XLA's verifier after it."""
    where, size = largest_dimension(config, plan, part)
    if size > MAX_DIMENSION:
        raise ValueError(f"{where} would hold a dimension of {size:.3g} elements, more than "
                         f"the {MAX_DIMENSION} (2**31-1) XLA takes; expected a smaller shape")
