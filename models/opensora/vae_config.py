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

__all__ = ["FULL_VAE", "TINY_VAE", "DecodePlan", "VAEConfig", "decode_plan", "get_vae_config"]


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
