"""Stages of the pipeline: which modules each holds, how it runs, and its boundary shapes.

Stage k holds block pairs ``stage_ids[k]``; stage 0 also holds the 5 embeddings and the last
stage the final layer (the original toolchain's split).  Stage 0 takes the model inputs
``z, y, t, fps``; a later stage takes ``x, y, t, t_mlp`` from the stage before it.  Every stage
but the last hands on ``x, y, t, t_mlp``; the last returns the model output ``out``.

x crosses a stage boundary in the token order (frame- or space-major) that the strategy chose
for the stage that wrote it (:func:`tracing.strategies.base.stage_token_order`); both orders
have the same shapes, so the boundary shapes and their cache do not depend on it.

Boundary shapes are computed by running the whole model on the ``meta`` device (no memory, no
arithmetic) and kept in a JSON cache keyed by (model config, video shape, stage split, batch,
dtype), so a stage can be traced alone without running, or even building, the stages before it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_trace.atomic import atomic_write
from hlo_trace.documents import load_json
from hlo_trace.errors import InputFileError, UsageError
from models.opensora.inputs import geometry, make_inputs
from plans.config import PipelineConfig
from tracing.strategies.base import stage_token_order

if TYPE_CHECKING:
    import torch
    from torch import nn

    from models.opensora.stdit3 import STDiT3

log = logging.getLogger(__name__)

EMBEDDING_MODULES = ("x_embedder", "t_embedder", "fps_embedder", "y_embedder", "t_block")
FINAL_MODULES = ("final_layer",)
STAGE_INPUTS_FIRST = ("z", "y", "t", "fps")
STAGE_INPUTS_LATER = ("x", "y", "t", "t_mlp")
#: What OpenSora's official text-to-video path adds between stages (StageState.t0, t0_mlp, x_mask).
STAGE_INPUTS_OFFICIAL = ("t0", "t0_mlp", "x_mask")
SHAPE_CACHE_VERSION = 1


class StageIndexError(UsageError):
    """A stage index outside the configured split."""


@dataclass(frozen=True)
class StageSpec:
    """One stage: its index, its block pairs (inclusive) and whether it holds the ends."""

    index: int
    first_block: int
    last_block: int
    has_embeddings: bool
    has_final_layer: bool
    official_path: bool = True  # PipelineConfig.inference_path == "official"

    @property
    def num_block_pairs(self) -> int:
        return self.last_block - self.first_block + 1

    def module_prefixes(self) -> list[str]:
        """Names (as in ``STDiT3.named_modules``) of the modules this stage holds."""
        prefixes = list(EMBEDDING_MODULES) if self.has_embeddings else []
        for block in range(self.first_block, self.last_block + 1):
            prefixes += [f"spatial_blocks.{block}", f"temporal_blocks.{block}"]
        if self.has_final_layer:
            prefixes += list(FINAL_MODULES)
        return prefixes

    def input_names(self) -> tuple[str, ...]:
        return STAGE_INPUTS_FIRST if self.has_embeddings else self._state_names()

    def output_names(self) -> tuple[str, ...]:
        return ("out",) if self.has_final_layer else self._state_names()

    def _state_names(self) -> tuple[str, ...]:
        return STAGE_INPUTS_LATER + (STAGE_INPUTS_OFFICIAL if self.official_path else ())


def stage_spec(config: PipelineConfig, index: int) -> StageSpec:
    """The stage ``index`` of ``config``; a one-line error when it does not exist."""
    if not 0 <= index < config.num_stages:
        raise StageIndexError(
            f"stage {index} does not exist: the split {config.stage_ids_label} has stages "
            f"0..{config.num_stages - 1}")
    first, last = config.stage_ids[index]
    return StageSpec(index=index, first_block=first, last_block=last, has_embeddings=index == 0,
                     has_final_layer=index == config.num_stages - 1,
                     official_path=config.inference_path == "official")


def stage_parameters(model: STDiT3, stage: StageSpec) -> dict[str, nn.Parameter]:
    """Parameters of the stage's modules, by their full name in the model."""
    prefixes = tuple(prefix + "." for prefix in stage.module_prefixes())
    return {name: param for name, param in model.named_parameters() if name.startswith(prefixes)}


def run_stage(model: STDiT3, stage: StageSpec, inputs: dict[str, torch.Tensor],
              config: PipelineConfig) -> dict[str, torch.Tensor]:
    """Run one stage on its inputs (any device: meta, CPU or XLA) and return its outputs.

    The blocks run in the token order the strategy chose for this stage (the eager reference of
    ``--check`` runs through here too, so it reads the same x as the traced stage); x from the
    stage before arrives in that stage's order and is reordered only if the two differ.
    """
    from models.opensora.stdit3 import StageState

    order = stage_token_order(config, stage.index)
    if stage.has_embeddings:
        state = model.embed(inputs["z"], inputs["y"], inputs["t"], inputs["fps"], order,
                            official=stage.official_path)
    else:
        geo = geometry(config.model, config.shape)
        state = StageState(x=inputs["x"], y=inputs["y"], t=inputs["t"], t_mlp=inputs["t_mlp"],
                           T=geo.T, S=geo.S, H_lat=geo.H_lat, W_lat=geo.W_lat, T_lat=geo.T_lat,
                           token_order=stage_token_order(config, stage.index - 1),
                           **{name: inputs[name] for name in STAGE_INPUTS_OFFICIAL if name in inputs})
        state = state.reordered(order)
    state = model.run_blocks(state, stage.first_block, stage.last_block)
    if stage.has_final_layer:
        return {"out": model.finalize(state)}
    return state.tensors()


# --------------------------------------------------------------------------------------------
# Boundary shapes and their cache
# --------------------------------------------------------------------------------------------


def shape_cache_key(config: PipelineConfig) -> dict:
    """What the boundary shapes depend on (not the strategy or the mesh: shapes are global; the
    inference path: the official one hands t0, t0_mlp and x_mask between stages)."""
    return {"version": SHAPE_CACHE_VERSION, "model": config.model.to_dict(), "shape": config.shape,
            "stage_ids": [list(ids) for ids in config.stage_ids], "batch": config.batch,
            "dtype": config.dtype, "inference_path": config.inference_path}


def compute_boundary_shapes(config: PipelineConfig) -> list[dict]:
    """Run every stage on the ``meta`` device and record its input and output shapes/dtypes."""
    import torch

    from models.opensora.stdit3 import STDiT3

    dtype = getattr(torch, config.dtype)
    with torch.device("meta"):
        model = STDiT3(config.model).to(dtype)
    tensors = make_inputs(config.model, config.shape, batch=config.batch, dtype=torch.float32,
                          device="meta")
    records = []
    with torch.no_grad():
        for index in range(config.num_stages):
            stage = stage_spec(config, index)
            inputs = {name: tensors[name] for name in stage.input_names()}
            outputs = run_stage(model, stage, inputs, config)
            records.append({"stage": index, "blocks": [stage.first_block, stage.last_block],
                            "inputs": _describe(inputs), "outputs": _describe(outputs)})
            tensors = outputs
    return records


def _describe(tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    return {name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for name, t in tensors.items()}


def _cache_entries(cache_path: Path) -> list[dict]:
    """The cache's well-formed entries (objects with a key and a list of stage records); an
    unreadable file, or entries of any other form, are dropped with a warning and recomputed."""
    try:
        data = load_json(cache_path, "a JSON shape cache")
    except InputFileError as error:
        log.warning("%s", error)
        data = None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        log.warning("shape cache %s is unreadable; recomputing", cache_path)
        return []
    good = [entry for entry in entries if isinstance(entry, dict) and "key" in entry
            and isinstance(entry.get("stages"), list)
            and all(isinstance(stage, dict) for stage in entry["stages"])]
    if len(good) < len(entries):
        log.warning("shape cache %s: %d malformed entries dropped", cache_path,
                    len(entries) - len(good))
    return good


def boundary_shapes(config: PipelineConfig, cache_path: Path | None) -> list[dict]:
    """Boundary shapes of every stage, from the cache when it has them (else computed and added)."""
    key = shape_cache_key(config)
    entries: list[dict] = []
    if cache_path is not None and cache_path.is_file():
        entries = _cache_entries(cache_path)
        for entry in entries:
            if entry["key"] == key:
                log.info("stage shapes from cache %s", cache_path)
                return entry["stages"]
    stages = compute_boundary_shapes(config)
    if cache_path is not None:
        entries.append({"key": key, "stages": stages})
        payload = {"about": "input/output shapes of pipeline stages (tracing.stages)",
                   "entries": entries}
        atomic_write(cache_path, json.dumps(payload, indent=1, sort_keys=True) + "\n", force=True)
        log.info("stage shapes computed and cached in %s", cache_path)
    return stages
