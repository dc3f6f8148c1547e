"""``analyze-pipeline``: the stages of a pipeline on their submeshes, with PipeFusion patches.

Each stage's dump is analyzed as ``analyze-hlo --hw`` does (one block mapped on the chip, times
the stage's block pairs; the stage's own collectives on the chip-to-chip network; memory per
device). Its sidecar gives the stage's chips (``mesh.global_device_ids``), its boundary
activations (``outputs``: global shapes and dtypes) and, for a stage traced on one patch, the
patch count (``pipefusion.patches``). A stage traced on the full latent is taken to run a patch in
1/M of its time; a stage traced on one patch runs the full latent in M times its time (the
spatial attention of a patch reads the full K/V, so the M patches add up to the full work).

Per patch, stage k sends 1/M of ``x`` and the whole of its other outputs (``t``, ``t_mlp``, ``y``:
small, counted with every patch) to stage k+1's chips (``hardware.pipeline.transfer_time_s``),
and the last stage sends 1/M of the latent (stage 0's input ``z``) back to stage 0's chips; the
latencies follow the PipeFusion schedule of ``hardware.pipeline`` (module doc there), by default
``overlapped`` (steps overlap, as xDiT runs them), or ``per-step`` (every step fills and drains).
Memory per device of a stage adds, with M > 1, the stale K/V buffers its spatial attentions keep:
per block pair ``2 * B_spt * S_KV_spt * N_A * H_A * Q`` bytes (K and V over the full sequence,
with the per-device dictionary of the dump's segmentation).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware.pipeline import DEFAULT_SCHEDULE, SCHEDULES, pipefusion_step, transfer_time_s
from hardware.spec import as_system
from hardware.systems import Hardware, load_choice
from hlo_analyzer.memory import MemoryUsage
from hlo_analyzer.sidecar import Sidecar, stage_sidecar
from hlo_trace.cli import MAX_COUNT
from hlo_trace.documents import dataclass_from_dict, load_json, load_toml, loads_json
from hlo_trace.errors import InputFileError, UsageError, shown

log = logging.getLogger(__name__)

#: The stage output split into patches (the hidden states); the others travel whole.
PATCHED_OUTPUT = "x"
#: Stage 0's input that the last stage sends back after a patch's scheduler step (the latent).
LATENT_INPUT = "z"


@dataclass(frozen=True)
class PipelinePlan:
    """What ``analyze-pipeline`` reads from a pipeline TOML (the tracer reads the rest)."""

    path: str
    stage_count: int
    strategies: tuple[str, ...] | None
    patches: int
    warmup_steps: int
    schedule: str = "overlapped"
    #: ``[first, last]`` block pair of each stage, and its ``[nx, ny, loc_x, loc_y]`` submesh
    #: when the file gives them (checked against the dumps' sidecars).
    stage_ids: tuple[tuple[int, int], ...] = ()
    submeshes: tuple[tuple[int, int, int, int], ...] | None = None


@dataclass(frozen=True)
class StageAnalysis:
    """One stage on its submesh; times per step, for the full latent and for one patch.
    ``comm_bytes_per_device`` is what one device of the stage sends in its own collectives over
    a whole step (the M patches of a stage traced on one patch)."""

    stage: int
    dump: str
    strategy: str
    devices: tuple[int, ...]
    block_pairs: int
    traced_patches: int
    compute_s: float
    comm_s: float
    comm_bytes_per_device: float
    full_s: float
    patch_s: float
    transfer_full_bytes: int
    transfer_patch_bytes: float
    transfer_full_s: float
    transfer_patch_s: float
    memory: MemoryUsage

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"memory": self.memory.to_dict()}

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> StageAnalysis:
        """The stage :meth:`to_dict` wrote, read back (``origin`` names it in errors)."""
        return dataclass_from_dict(cls, document, origin, "a pipeline stage", devices=tuple,
                                   memory=lambda memory: MemoryUsage.from_dict(memory, origin))


@dataclass(frozen=True)
class PipelineTotals:
    """The totals of a pipeline's analysis: the ``totals`` of ``analyze-pipeline --format json``,
    read back with :meth:`from_json` where the result crosses a process."""

    step_s: float
    warmup_step_s: float
    inference_s: float
    memory_per_device_bytes: int
    comm_bytes_per_device: float

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> PipelineTotals:
        """The ``totals`` of a pipeline's report, read back (``origin`` names it in errors)."""
        return dataclass_from_dict(cls, document, origin, "a pipeline's totals")

    @classmethod
    def from_json(cls, text: str, origin: str) -> PipelineTotals:
        """The totals of an ``analyze-pipeline`` JSON report (``origin`` names it in errors)."""
        return PipelineReport.from_json(text, origin).totals


#: What the errors say an ``analyze-pipeline --format json`` report is.
REPORT = "an analyze-pipeline JSON report"
#: The schedule of a report written before schedules were named: every step filled and drained.
UNNAMED_SCHEDULE = "per-step"


@dataclass(frozen=True)
class PipelineReport:
    """An ``analyze-pipeline --format json`` report read back where it crosses a process: the
    schedule, the stages and the totals."""

    schedule: str
    stages: tuple[StageAnalysis, ...]
    totals: PipelineTotals

    @classmethod
    def from_json(cls, text: str, origin: str) -> PipelineReport:
        return cls.from_dict(loads_json(text, origin, REPORT), origin)

    @classmethod
    def read(cls, path: str | Path) -> PipelineReport:
        """The report in the file at ``path`` (errors name the file)."""
        return cls.from_dict(load_json(path, REPORT), shown(path))

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> PipelineReport:
        try:
            return cls(schedule=str(document.get("schedule", UNNAMED_SCHEDULE)),
                       stages=tuple(StageAnalysis.from_dict(stage, f"{origin}: stage {index}")
                                    for index, stage in enumerate(document["stages"])),
                       totals=PipelineTotals.from_dict(document["totals"], origin))
        except (KeyError, TypeError, AttributeError) as error:
            raise InputFileError(f"{origin}: not {REPORT} ({error!r})") from None

    @property
    def largest_stage_memory(self) -> MemoryUsage:
        """The memory of the stage whose device holds the most."""
        return max((stage.memory for stage in self.stages), key=lambda memory: memory.total_bytes)


@dataclass(frozen=True)
class PipelineAnalysis:
    plan: PipelinePlan
    hardware: str
    stages: tuple[StageAnalysis, ...]
    step: Any  # hardware.pipeline.PipelineStep
    return_full_bytes: int = 0
    return_patch_bytes: float = 0.0

    @property
    def memory_per_device_bytes(self) -> int:
        """The largest total of any stage: each device belongs to one stage."""
        return max(stage.memory.total_bytes for stage in self.stages)

    @property
    def comm_bytes_per_device(self) -> float:
        """Collectives per step of the busiest device, plus what it sends to the next stage."""
        return max(stage.comm_bytes_per_device + stage.transfer_full_bytes / len(stage.devices)
                   for stage in self.stages)

    def to_dict(self) -> dict[str, Any]:
        step = self.step
        return {
            "pipeline": self.plan.path, "hardware": self.hardware,
            "patches": self.plan.patches, "warmup_steps": step.warmup_steps, "steps": step.steps,
            "schedule": step.schedule,
            "stages": [stage.to_dict() for stage in self.stages],
            "return": {"full_bytes": self.return_full_bytes, "patch_bytes": self.return_patch_bytes,
                       "full_s": step.return_full_s, "patch_s": step.return_patch_s},
            "totals": dataclasses.asdict(self.totals),
        }

    @property
    def totals(self) -> PipelineTotals:
        step = self.step
        return PipelineTotals(step_s=step.step_s, warmup_step_s=step.warmup_step_s,
                              inference_s=step.inference_s,
                              memory_per_device_bytes=self.memory_per_device_bytes,
                              comm_bytes_per_device=self.comm_bytes_per_device)


def load_plan(path: str | Path) -> PipelinePlan:
    """Read ``stage_ids``, ``strategy`` (one name or one per stage), ``patches`` (default 1),
    ``warmup_steps`` (default 1) and ``schedule`` (default ``overlapped``) from a pipeline TOML."""

    source = Path(path)
    if not source.exists():
        raise InputFileError(f"{shown(source)}: pipeline file not found")
    data = load_toml(source, "a pipeline file (TOML)")
    stage_ids = data.get("stage_ids")
    if (not isinstance(stage_ids, list) or not stage_ids
            or not all(_int_list(pair, 2) and 0 <= pair[0] <= pair[1] for pair in stage_ids)):
        raise InputFileError(f"{source}: stage_ids: expected a list of [first, last] pairs "
                             "(0 <= first <= last)")
    submeshes = _plan_submeshes(source, data.get("submeshes"), len(stage_ids))
    strategy = data.get("strategy")
    strategies = (tuple(strategy) if isinstance(strategy, list)
                  else (str(strategy),) * len(stage_ids) if strategy is not None else None)
    if strategies is not None and len(strategies) != len(stage_ids):
        raise InputFileError(f"{source}: strategy: {len(strategies)} names for "
                             f"{len(stage_ids)} stages; expected one name or one per stage")
    patches, warmup = data.get("patches", 1), data.get("warmup_steps", 1)
    for key, value, least in (("patches", patches, 1), ("warmup_steps", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
            raise InputFileError(f"{source}: {key} = {value!r}: expected an integer from {least} "
                                 f"to {MAX_COUNT}")
    schedule = data.get("schedule", DEFAULT_SCHEDULE)
    if schedule not in SCHEDULES:
        raise InputFileError(f"{source}: schedule = {schedule!r}: expected one of "
                             f"{', '.join(SCHEDULES)}")
    return PipelinePlan(str(source), len(stage_ids), strategies, patches, warmup, schedule,
                        tuple(tuple(pair) for pair in stage_ids), submeshes)


def _int_list(value: Any, length: int) -> bool:
    return (isinstance(value, list) and len(value) == length
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _plan_submeshes(source: Path, submeshes: Any,
                    stages: int) -> tuple[tuple[int, int, int, int], ...] | None:
    """The file's submeshes (None if it gives none): one ``[nx, ny, loc_x, loc_y]`` per stage,
    no two overlapping (two stages of a pipeline run on different chips)."""
    if submeshes is None:
        return None
    if (not isinstance(submeshes, list) or len(submeshes) != stages
            or not all(_int_list(sub, 4) and min(sub[:2]) >= 1 and min(sub[2:]) >= 0
                       for sub in submeshes)):
        raise InputFileError(f"{source}: submeshes: expected one [nx, ny, loc_x, loc_y] per stage "
                             f"({stages}), sizes >= 1 and corners >= 0")
    for (i, a), (j, b) in itertools.combinations(enumerate(submeshes), 2):
        if (a[2] < b[2] + b[0] and b[2] < a[2] + a[0]
                and a[3] < b[3] + b[1] and b[3] < a[3] + a[1]):
            raise InputFileError(f"{source}: submeshes of stages {i} {a} and {j} {b} overlap; "
                                 "expected each stage on its own devices")
    return tuple(tuple(sub) for sub in submeshes)


def _check_sidecars(plan: PipelinePlan, dumps: list[str], sidecars: list[Sidecar]) -> None:
    """Each dump is the stage the plan says: its blocks, and the stage ids and submeshes it was
    traced with (the sidecar's ``pipeline``), are the plan's."""
    stage_ids = [list(pair) for pair in plan.stage_ids]
    for index, (dump, sidecar) in enumerate(zip(dumps, sidecars, strict=True)):
        blocks = sidecar.blocks
        if stage_ids and blocks is not None and list(blocks) != stage_ids[index]:
            raise UsageError(f"{dump}: holds block pairs {list(blocks)}, but {plan.path} gives stage "
                             f"{index} the block pairs {stage_ids[index]}")
        traced = sidecar.section("pipeline")
        if not isinstance(traced, dict):
            continue
        if stage_ids and traced.get("stage_ids") not in (None, stage_ids):
            raise UsageError(f"{dump}: traced with stage_ids {traced.get('stage_ids')}, but "
                             f"{plan.path} has stage_ids {stage_ids}")
        wanted = None if plan.submeshes is None else [list(sub) for sub in plan.submeshes]
        if wanted is not None and traced.get("submeshes") not in (None, wanted):
            raise UsageError(f"{dump}: traced on submeshes {traced.get('submeshes')}, but "
                             f"{plan.path} has submeshes {wanted}")


def analyze_pipeline(plan: PipelinePlan, dumps: list[str], hardware: str, *,
                     steps: int = 30, schedule: str | None = None) -> PipelineAnalysis:
    """``schedule`` (``overlapped`` or ``per-step``) overrides the plan's."""

    if len(dumps) != plan.stage_count:
        raise UsageError(f"{plan.path} has {plan.stage_count} stages but {len(dumps)} dumps were "
                         "given: expected one dump per stage, in stage order")
    choice = load_choice(hardware)
    system = as_system(choice.spec)
    sidecars = [stage_sidecar(dump, "analyze-pipeline") for dump in dumps]
    _check_sidecars(plan, dumps, sidecars)
    stages = []
    for index, (dump, sidecar) in enumerate(zip(dumps, sidecars, strict=True)):
        following = sidecars[index + 1] if index + 1 < len(sidecars) else None
        stages.append(_analyze_stage(index, dump, sidecar, following, plan, system, choice))
    return_full, return_patch = _latent_bytes(sidecars[0], plan.patches)
    first, last = stages[0].devices, stages[-1].devices
    step = pipefusion_step(
        [s.patch_s for s in stages], [s.transfer_patch_s for s in stages[:-1]],
        [s.full_s for s in stages], [s.transfer_full_s for s in stages[:-1]],
        patches=plan.patches, steps=steps, warmup_steps=plan.warmup_steps,
        return_patch_s=transfer_time_s(return_patch, last, first, system),
        return_full_s=transfer_time_s(return_full, last, first, system),
        schedule=schedule or plan.schedule)
    return PipelineAnalysis(plan, system.name, tuple(stages), step, return_full, return_patch)


def _analyze_stage(index: int, dump: str, sidecar: Sidecar, following: Sidecar | None,
                   plan: PipelinePlan, system: Any, hardware: Hardware) -> StageAnalysis:
    from hlo_analyzer.mapping.analysis import AnalysisOptions, analyze_dump

    strategy = sidecar.strategy
    if plan.strategies is not None and plan.strategies[index] != strategy:
        raise UsageError(f"{dump}: traced with strategy {strategy}, but {plan.path} gives stage "
                         f"{index} the strategy {plan.strategies[index]}")
    if sidecar.stage not in (None, index):
        raise UsageError(f"{dump}: is stage {sidecar.stage}, given as stage {index}")
    first, last = sidecar.blocks or (0, 0)
    pairs = int(last) - int(first) + 1
    analysis = analyze_dump(dump, hardware, AnalysisOptions(steps=1, pairs=pairs), sidecar=sidecar)
    report = analysis.report
    blocks = analysis.blocks
    assert blocks is not None
    totals = analysis.mapping.totals
    compute_s, comm_s = totals.inference_compute_s, totals.inference_comm_s
    traced = sidecar.patches
    if traced not in (1, plan.patches):
        raise UsageError(f"{dump}: traced on one of {traced} patches, but {plan.path} has "
                         f"patches = {plan.patches}")
    own_s = compute_s + comm_s
    full_s, patch_s = ((own_s * plan.patches, own_s) if traced > 1
                       else (own_s, own_s / plan.patches))
    devices = sidecar.devices
    full_bytes, patch_bytes = _boundary_bytes(sidecar, plan.patches)
    if following is None:
        full_bytes, patch_bytes, full_t, patch_t = 0, 0.0, 0.0, 0.0
    else:
        receivers = list(following.devices)
        _check_chips(dump, devices + tuple(receivers), system)
        full_t = transfer_time_s(full_bytes, devices, receivers, system)
        patch_t = transfer_time_s(patch_bytes, devices, receivers, system)
    memory = analysis.memory.usage
    if plan.patches > 1:
        memory = dataclasses.replace(memory, stale_kv_bytes=_stale_kv_bytes(
            blocks.shapes.as_dict(), pairs))
    return StageAnalysis(
        stage=index, dump=dump, strategy=strategy, devices=devices, block_pairs=pairs,
        traced_patches=traced, compute_s=compute_s, comm_s=comm_s,
        comm_bytes_per_device=report.comm_bytes_per_device * (plan.patches if traced > 1 else 1),
        full_s=full_s, patch_s=patch_s,
        transfer_full_bytes=full_bytes, transfer_patch_bytes=patch_bytes,
        transfer_full_s=full_t, transfer_patch_s=patch_t, memory=memory)


def _boundary_bytes(sidecar: Sidecar, patches: int) -> tuple[int, float]:
    """(full, per patch) bytes of a stage's outputs; the per-patch figure of a stage traced on
    one patch is already a patch, and its full figure is M patches of x."""
    traced = sidecar.patches
    full, per_patch = 0, 0.0
    for tensor in sidecar.outputs:
        nbytes = tensor.nbytes
        if tensor.name == PATCHED_OUTPUT:
            full += nbytes * traced
            per_patch += nbytes * traced / patches
        else:
            full += nbytes
            per_patch += nbytes
    return full, per_patch


def _latent_bytes(first_sidecar: Sidecar, patches: int) -> tuple[int, float]:
    """(full, per patch) bytes of the latent the last stage sends back to stage 0: stage 0's
    input ``z`` (a patch of it when stage 0 was traced on one patch); 0 when not recorded."""
    entry = first_sidecar.input(LATENT_INPUT)
    if entry is None:
        return 0, 0.0
    full = entry.nbytes * first_sidecar.patches
    return full, full / patches


def _stale_kv_bytes(config: dict[str, int], pairs: int) -> int:
    """K and V of every spatial attention over the full sequence, per device."""
    return pairs * 2 * config["B_spt"] * config["S_KV_spt"] * config["N_A"] * config["H_A"] * (
        config["Q"])


def _check_chips(dump: str, devices: tuple[int, ...], system: Any) -> None:
    if max(devices) >= system.chip_count:
        raise UsageError(f"{dump}: the pipeline uses chip {max(devices)} but {system.name} has "
                         f"{system.chip_count} chips")
