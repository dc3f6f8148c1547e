"""PipeFusion: tracing a stage on one patch of the latent, as patch-pipelined inference runs it.

The latent is cut into M patches along its height (note 000, "Init Pipeline":
``pipeline_patches_height_list``; stage 0 runs ``z[..., start:end, :]``). A patch holds
``rows = ceil(H_patches / M)`` rows of patch tokens, all W_patches columns, all T frames, so:

* the **temporal** self-attention of a patch is complete (each sequence is one spatial
  position's T frames, all inside the patch);
* the **cross**-attention reads the caption, the same for every patch;
* the **spatial** self-attention attends over a frame's S = H_patches * W_patches tokens, of
  which the patch holds ``rows * W_patches``: its queries are the patch's, its keys and values
  the full frame's. PipeFusion keeps, per spatial attention, a buffer of the previous step's
  full-sequence K and V (the *stale* K/V) and writes the patch's fresh K, V into it at the
  patch's offset before attending.

Tracing a patch therefore means: trace the stage on a latent ``rows`` patches high (the stage
shapes, inputs and outputs are the patch's), and give every spatial attention of the stage a
``kv_hook`` that writes its (B*T, heads, S_patch, hd) K and V into (B*T, heads, S, hd) stale
buffers, which are extra stage inputs named ``stale_k.<block>`` / ``stale_v.<block>``. The traced
patch is patch 0 (offset 0); every patch has the same shapes, the last one may be padded.
Position embeddings of stage 0 are computed for the patch's own grid: values differ from the
full latent's rows, shapes and FLOPs do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

    from models.opensora.config import STDiT3Config
    from models.opensora.stdit3 import STDiT3
    from plans.patches import PatchPlan
    from tracing.stages import StageSpec

STALE_PREFIX = "stale_"


def stale_buffer_shapes(model: STDiT3Config, plan: PatchPlan, stage: StageSpec,
                        batch: int) -> dict[str, tuple[int, ...]]:
    """Name -> (B*T, heads, S, head_dim) of the stale K and V of each spatial block."""
    heads = model.num_heads
    shape = (batch * plan.T, heads, plan.S_full, model.hidden_size // heads)
    shapes = {}
    for block in range(stage.first_block, stage.last_block + 1):
        shapes[f"{STALE_PREFIX}k.{block}"] = shape
        shapes[f"{STALE_PREFIX}v.{block}"] = shape
    return shapes


class StaleKV:
    """``kv_hook`` of a spatial attention: fresh (k, v) of the patch written at ``offset`` into
    the stale full-sequence buffers (sequence axis 2)."""

    def __init__(self, stale_k: Tensor, stale_v: Tensor, offset: int = 0) -> None:
        self.stale_k, self.stale_v, self.offset = stale_k, stale_v, offset

    def __call__(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        import torch

        end = self.offset + k.shape[2]
        return (torch.slice_scatter(self.stale_k, k, dim=2, start=self.offset, end=end),
                torch.slice_scatter(self.stale_v, v, dim=2, start=self.offset, end=end))


def install_stale_kv(model: STDiT3, stage: StageSpec, shapes: dict[str, tuple[int, ...]],
                     make_buffer: Callable[[tuple[int, ...]], Tensor]) -> dict[str, Tensor]:
    """Give each spatial attention of ``stage`` its stale buffers; returns them by name."""
    buffers = {name: make_buffer(shape) for name, shape in shapes.items()}
    for block in range(stage.first_block, stage.last_block + 1):
        model.spatial_blocks[block].attn.kv_hook = StaleKV(
            buffers[f"{STALE_PREFIX}k.{block}"], buffers[f"{STALE_PREFIX}v.{block}"])
    return buffers
