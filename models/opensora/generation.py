"""One OpenSora v1.2 generation as its gradio demo runs it (``gradio/app.py``, tag v1.2.0), eagerly
on one device: the models it keeps resident and the phases a generation goes through.

Run on a GPU by ``benchmarks/gpu_generation.py`` (time and memory of each phase), and on the
``meta`` device by ``tracing.allocations`` (the order of every allocation and free, which
``models.cuda_runtime`` replays). With random weights:

* **weights** (:class:`DemoModels`), held for the whole run: the T5 v1.1 XXL encoder in float32
  (its parameter bytes as one tensor: text encoding is a few milliseconds of GEMMs on 300 tokens
  and is not run), STDiT3 (the project's model with the official library kernels of
  ``models.opensora.official``) and the VAE's two decoders in bfloat16, the VAE's encoders (built
  by the demo, never run) as one bf16 tensor;
* **loop**: ``steps`` forwards of the CFG batch of 2 and the guidance update;
* **decode**: the temporal decoder on each 5-frame latent chunk, joined, then the spatial decoder
  4 frames a call, joined (``VideoAutoencoderPipeline.decode``);
* **save**: ``save_sample``'s normalisation on the device and the copy to host ``uint8`` frames.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from models.opensora.config import get_config
from models.opensora.inputs import make_inputs
from models.opensora.memory import (
    GENERATION_PHASES,
    SPATIAL_VAE_PARTS,
    TEMPORAL_VAE_PARTS,
    t5_encoder_parameters,
)
from models.opensora.official import official_kernels
from models.opensora.stdit3 import STDiT3
from models.opensora.vae import SpatialDecoder, TemporalDecoder
from models.opensora.vae_config import FULL_VAE, TINY_VAE, decode_plan

#: The demo's guidance scale (gradio/app.py's "CFG Scale" slider default).
CFG_SCALE = 7.0


class DemoModels:
    """The weights the demo keeps on the device for the whole run, in the order they are loaded.

    The modules are built on the default device, then moved to ``device`` in ``dtype`` under
    ``loading()``: the recorder of ``tracing.allocations`` builds them on ``meta`` and records
    only the move, as a GPU sees only the move."""

    def __init__(self, config_name: str, device: str, dtype: torch.dtype,
                 loading: Callable[[], AbstractContextManager] = nullcontext) -> None:
        tiny = config_name == "tiny"
        self.config = get_config(config_name)
        self.vae = TINY_VAE if tiny else FULL_VAE
        self.device, self.dtype = device, dtype
        t5 = 1024 if tiny else t5_encoder_parameters()
        encoders = 1024 if tiny else sum(part["encoder"] + part["quant_conv"]
                                         for part in (TEMPORAL_VAE_PARTS, SPATIAL_VAE_PARTS))
        stdit, temporal, spatial = STDiT3(self.config), TemporalDecoder(self.vae), SpatialDecoder(self.vae)
        with loading():
            self.t5 = torch.empty(t5, dtype=torch.float32, device=device)
            self.vae_encoders = torch.empty(encoders, dtype=dtype, device=device)
            self.stdit = stdit.to(device, dtype).eval()
            self.temporal = temporal.to(device, dtype).eval()
            self.spatial = spatial.to(device, dtype).eval()
        official_kernels(self.stdit, self.config)


def generate(models: DemoModels, shape: str, steps: int, mark: Callable[[str], None]) -> None:
    """One generation of ``shape`` on the models' device, ``steps`` denoising steps; ``mark(phase)``
    is called as each of ``GENERATION_PHASES`` ends (its tensors already freed). The caller chooses the
    attention kernels (``models.opensora.official``) and the inference mode."""
    vae, plan = models.vae, decode_plan(shape, models.vae)
    weights, loop, decode, save = GENERATION_PHASES
    mark(weights)
    inputs = make_inputs(models.config, shape, dtype=models.dtype, device=models.device)
    z = inputs.pop("z")
    for _ in range(steps):
        out = models.stdit(z, **inputs, official=True)
        cond, uncond = out[:, : z.shape[1]].chunk(2)
        velocity = uncond + CFG_SCALE * (cond - uncond)
        z = z + velocity.repeat(2, 1, 1, 1, 1) / steps
        del out, cond, uncond, velocity
    latent = z[:1]
    del z, inputs
    mark(loop)

    width = vae.micro_z_frames
    chunks = [models.temporal(latent[:, :, i * width:(i + 1) * width]) for i in range(plan.chunks)]
    frames = torch.cat(chunks, dim=2)[0].transpose(0, 1)   # (frames, 4, h, w)
    del chunks, latent
    pieces = [models.spatial(frames[i:i + vae.micro_batch]) for i in range(0, plan.frames, vae.micro_batch)]
    video = torch.cat(pieces).transpose(0, 1)               # (3, frames, H, W)
    del pieces, frames
    mark(decode)

    video.clamp_(min=-1, max=1)
    video.sub_(-1).div_(2)
    host = video.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 3, 0)
    # to the host as uint8: the device converts first (a uint8 copy on it), then copies; on meta
    # there is no host copy to make, the conversion is what the device allocates
    host = host.to("cpu", torch.uint8) if host.device.type != "meta" else host.to(torch.uint8)
    del video, host
    mark(save)
