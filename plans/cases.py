"""Pipeline plans: P stages of C chips each, a strategy inside every stage, PipeFusion with M
patches (docs/pipeline.md); the study's pipeline configurations and the plan search's plans
(a flat plan is one stage holding every block pair).

A configuration is written ``PxC:STRATEGY`` (``2x8:ds_ulysses``: 2 stages of 8 chips, Ulysses
inside each). This module only plans: the block pairs of every stage, the submesh each stage
runs on, and the pipeline TOML that ``trace-stage --pipeline`` and ``analyze-pipeline`` read.
The runner (``planning.runner``) traces them for the sweep (``scripts/sweep.py``) and the plan
search (``planning.plan_search``); the tables (``scripts/study_tables.py``) read the results.
No torch.

Layout: a stage's submesh is the strategy's own mesh on C chips (``models.opensora.parallel``:
2 x C/2 for the strategies that put the guidance batch on x, 1 x 1 for ``none``) unless the case
names one (``mesh``, the plan search's factorisations); the stages sit side by side along y, so
stage k holds columns ``k*ny .. (k+1)*ny - 1`` of a ``nx x P*ny`` mesh, and consecutive stages
are neighbours. The pairs are split as evenly as possible unless the case names a ``split``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hlo_trace.errors import UsageError
from models.opensora.parallel import strategy_info

#: The first steps of an inference run unpipelined on the full latent: no stale K/V exists yet
#: (PipeFusion's warm-up, docs/pipeline.md).
WARMUP_STEPS = 1
#: The PipeFusion schedule of the study's pipelines: steps overlap as xDiT runs them
#: (``hardware.pipeline``; ``per-step`` is the other, every step filling and draining).
SCHEDULE = "overlapped"


@dataclass(frozen=True)
class PipelineShape:
    """``stages`` stages of ``chips`` chips each, ``strategy`` inside every stage."""

    stages: int
    chips: int
    strategy: str

    @property
    def label(self) -> str:
        return f"{self.stages}x{self.chips}:{self.strategy}"


@dataclass(frozen=True)
class PipelineCase:
    """One pipeline row of the study: a model shape, a pipeline shape and a patch count M."""

    config: str
    shape: str
    pipeline: PipelineShape
    patches: int
    depth: int
    #: Each stage's submesh (nx, ny); None: the strategy's study mesh on C chips.
    mesh: tuple[int, int] | None = None
    #: Block pairs of each stage, ``((first, last), ...)``; None: the even split.
    split: tuple[tuple[int, int], ...] | None = None
    #: usp only: the ring degree over mesh axis y (None: the tracer's default).
    ring: int | None = None

    @property
    def name(self) -> str:
        p = self.pipeline
        name = (f"{Path(self.config).stem}_{self.shape}_pp{p.stages}x{p.chips}_{p.strategy}"
                f"_M{self.patches}")
        if self.mesh is not None:
            name += f"_mesh{self.mesh[0]}x{self.mesh[1]}"
        if self.split is not None and self.split != split_pairs(self.depth, p.stages):
            name += "_pairs" + ".".join(f"{a}-{b}" for a, b in self.split)
        if self.ring is not None:
            name += f"_ring{self.ring}"
        return name

    @property
    def stage_ids(self) -> tuple[tuple[int, int], ...]:
        return self.split if self.split is not None else split_pairs(self.depth,
                                                                      self.pipeline.stages)

    @property
    def stage_mesh(self) -> tuple[int, int]:
        """(nx, ny) of every stage's submesh."""
        if self.mesh is not None:
            return self.mesh
        return strategy_info(self.pipeline.strategy).mesh(self.pipeline.chips)

    def submeshes(self) -> tuple[tuple[int, int, int, int], ...]:
        """``(nx, ny, loc_x, loc_y)`` of every stage: the stage mesh, the stages side by side
        along y."""
        nx, ny = self.stage_mesh
        return tuple((nx, ny, 0, stage * ny) for stage in range(self.pipeline.stages))

    def toml(self) -> str:
        """The pipeline file: the tracer's keys plus ``patches``, ``warmup_steps`` and
        ``schedule``."""
        nx, ny, _, _ = self.submeshes()[0]
        # a model file named in a pipeline file is read relative to that file: make it absolute
        config = str(Path(self.config).resolve()) if self.config.endswith(".toml") else self.config
        lines = [
            f"# Pipeline plan {self.pipeline.label}, M = {self.patches} (plans.cases)",
            f"config = {json.dumps(config)}",
            f'shape = "{self.shape}"',
            f'strategy = "{self.pipeline.strategy}"',
            f"mesh_shape = [{nx}, {ny * self.pipeline.stages}]",
            "stage_ids = [" + ", ".join(f"[{a}, {b}]" for a, b in self.stage_ids) + "]",
            "submeshes = [" + ", ".join(
                "[" + ", ".join(str(v) for v in sub) + "]" for sub in self.submeshes()) + "]",
            f"patches = {self.patches}",
            f"warmup_steps = {WARMUP_STEPS}",
            f'schedule = "{SCHEDULE}"',
        ]
        if self.ring is not None:
            nx, ny = self.stage_mesh
            lines.append(f"ring_degree = {self.ring}")
            lines.append(f"ulysses_degree = {ny // self.ring}")
        return "\n".join(lines) + "\n"


def split_pairs(depth: int, stages: int) -> tuple[tuple[int, int], ...]:
    """``depth`` block pairs in ``stages`` contiguous ranges as even as possible, the longer
    ranges first: 28 in 16 -> twelve of 2 pairs, then four of 1."""
    if not 1 <= stages <= depth:
        raise UsageError(f"{stages} pipeline stages for {depth} block pairs: expected 1 to {depth}")
    base, extra = divmod(depth, stages)
    ranges, first = [], 0
    for stage in range(stages):
        size = base + (1 if stage < extra else 0)
        ranges.append((first, first + size - 1))
        first += size
    return tuple(ranges)


def parse_pipelines(text: str, devices: int) -> tuple[PipelineShape, ...]:
    """``"2x8:ds_ulysses,16x1:none"`` -> pipeline shapes; every one must use ``devices`` chips
    and its strategy must lay out on C chips. The empty string means none."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        layout, _, strategy = item.partition(":")
        stages, _, chips = layout.partition("x")
        if not (stages.isdigit() and chips.isdigit() and strategy) or min(int(stages), int(chips)) < 1:
            raise UsageError(f"--pipelines: {item!r}: expected STAGESxCHIPS:STRATEGY, e.g. "
                             "2x8:ds_ulysses")
        shape = PipelineShape(int(stages), int(chips), strategy)
        if shape.stages * shape.chips != devices:
            raise UsageError(f"--pipelines: {item} uses {shape.stages * shape.chips} chips; "
                             f"expected {devices} (--devices)")
        nx, ny = strategy_info(strategy).mesh(shape.chips)
        if nx * ny != shape.chips:
            raise UsageError(f"--pipelines: {item}: {strategy} runs on {nx * ny} chip(s), not "
                             f"{shape.chips}; expected a strategy that spreads over the stage")
        shapes.append(shape)
    return tuple(dict.fromkeys(shapes))


def default_pipelines(devices: int, depth: int) -> str:
    """The study's pipelines on ``devices`` chips: 2 and 4 stages with Ulysses sequence
    parallelism inside (the best flat strategy of the study), and one stage per chip with
    nothing split inside (pure PipeFusion); those that do not divide the chips, or have more
    stages than the model has block pairs, are left out."""
    items = [f"{p}x{devices // p}:ds_ulysses" for p in (2, 4)
             if devices % p == 0 and (devices // p) % 2 == 0 and p <= depth]
    if 1 < devices <= depth:
        items.append(f"{devices}x1:none")
    return ",".join(dict.fromkeys(items))
