"""PipeFusion's patches: the latent cut into M patches along its height (no torch).

Note 000, "Init Pipeline" (``pipeline_patches_height_list``): a patch holds ``rows =
ceil(H_patches / M)`` rows of patch tokens, all W_patches columns and all T frames, so a stage
traced on one patch is the stage traced on a latent ``rows`` patches high
(``tracing.pipefusion`` traces it, with the spatial attentions' stale K/V); the plan search
sizes a plan's patches with the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from models.opensora.config import STDiT3Config
from models.opensora.inputs import geometry, parse_shape
from plans.config import PipelineConfig, PipelineConfigError

__all__ = ["PatchPlan", "patch_config", "patch_plan"]


@dataclass(frozen=True)
class PatchPlan:
    """One patch of M along the latent height."""

    patches: int
    full_shape: str
    patch_shape: str  # the video shape whose latent is one patch high
    rows: int  # patch-token rows in a patch
    S_full: int
    S_patch: int
    T: int

    def to_dict(self) -> dict:
        return {"patches": self.patches, "full_shape": self.full_shape,
                "patch_shape": self.patch_shape, "rows": self.rows, "S_full": self.S_full,
                "S_patch": self.S_patch, "T": self.T}


def patch_plan(model: STDiT3Config, shape: str, patches: int) -> PatchPlan:
    """The patch of ``shape`` cut in ``patches`` along the latent height."""
    full = geometry(model, shape)
    if patches < 1 or patches > full.H_patches:
        raise PipelineConfigError(
            f"patches = {patches}: expected 1..{full.H_patches} (the latent of {shape} is "
            f"{full.H_patches} patch rows high)")
    rows = math.ceil(full.H_patches / patches)
    video = parse_shape(shape)
    _, ph, _ = model.patch_size
    patch_shape = f"{video.frames}_{video.width}_{rows * ph * model.vae_downsample}"
    patch = geometry(model, patch_shape)
    return PatchPlan(patches=patches, full_shape=str(video), patch_shape=patch_shape, rows=rows,
                     S_full=full.S, S_patch=patch.S, T=full.T)


def patch_config(config: PipelineConfig) -> PipelineConfig:
    """The configuration a stage of ``config`` is traced with: under PipeFusion one patch of its
    latent (the patch's shape, no patches), so the strategy's checks see the patch's tokens, as
    the tracer does; ``config`` itself without patches."""
    if config.patches == 1:
        return config
    plan = patch_plan(config.model, config.shape, config.patches)
    return dataclasses.replace(config, shape=plan.patch_shape, patches=1)
