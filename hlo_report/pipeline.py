"""The page of one pipeline: ``analyze-pipeline PIPELINE.toml DUMPS... --format json``.

Summary (the PipeFusion latencies, memory and communication per device), each stage's time per
step and per patch, its memory against the chip's, and the per-stage table.
"""

from __future__ import annotations

from collections.abc import Iterator

from hlo_report.document import Document
from hlo_report.figures import bars, horizontal_line
from hlo_report.page import Fact, Figure, Item, Page, Section, Table, columns

WHAT = "analyze-pipeline ... --format json output"

#: Bytes per GB in the figures (decimal, as the study's tables).
GIGA = 1e9
#: The chip's memory is drawn as a line when the largest stage needs this share of it or more.
CAPACITY_SHOWN = 0.1


def pipeline_page(report: Document) -> Page:
    stages = list(report.children("stages"))
    sections = (Section("Summary", tuple(_summary(report, len(stages)))),
                Section("Stages", tuple(_figures(stages))),
                Section("Tables", (_stage_table(stages),)))
    return Page(f"Pipeline {report.text('pipeline')} on {report.text('hardware')}", "pipeline",
                (report.origin,), sections)


def _summary(report: Document, stages: int) -> Iterator[Item]:
    yield Fact("stages", "stages", stages)
    yield Fact("patches", "patches (M)", report.number("patches"))
    yield Fact("schedule", "schedule", report.text("schedule"))
    yield Fact("steps", "sampling steps", report.number("steps"))
    yield Fact("warmup_steps", "unpipelined warm-up steps", report.number("warmup_steps"))
    totals = report.child("totals")
    yield Fact("inference_s", "inference latency", totals.number("inference_s"), "s")
    yield Fact("step_s", "pipelined step", totals.number("step_s"), "s")
    yield Fact("warmup_step_s", "warm-up step", totals.number("warmup_step_s"), "s")
    yield Fact("memory_per_device_bytes", "memory per device (largest stage)",
               totals.number("memory_per_device_bytes"), "B")
    yield Fact("comm_bytes_per_device", "bytes sent per device per step",
               totals.number("comm_bytes_per_device"), "B")
    yield Fact("return_patch_s", "last stage -> stage 0, one patch", report.number("return.patch_s"), "s")


def _figures(stages: list[Document]) -> Iterator[Figure]:
    names = [f"stage {stage.number('stage')} ({stage.text('strategy')})" for stage in stages]
    yield bars("stage_step", "Time per step by stage (the full latent)", names,
               {"compute": [stage.number("compute_s") for stage in stages],
                "own collectives": [stage.number("comm_s") for stage in stages],
                "send to the next stage": [stage.number("transfer_full_s") for stage in stages]},
               y_title="seconds", stacked=True)
    yield bars("stage_patch", "Time per patch by stage", names,
               {"stage's work on one patch": [stage.number("patch_s") for stage in stages],
                "send one patch": [stage.number("transfer_patch_s") for stage in stages]},
               y_title="seconds")
    memories = [stage.child("memory") for stage in stages]
    capacity = memories[0].number("capacity_bytes", optional=True) if memories else None
    largest = max((m.number("total_bytes") for m in memories), default=0)
    if capacity is not None and largest < CAPACITY_SHOWN * capacity:
        capacity = None  # the line would flatten the bars; the table says whether each fits
    yield bars("stage_memory", "Memory per device by stage", names,
                  {"weights": [m.number("weight_bytes") / GIGA for m in memories],
                   "stale K/V": [(m.number("stale_kv_bytes", optional=True) or 0) / GIGA
                                 for m in memories],
                   "peak live activations": [m.number("peak_live_bytes") / GIGA for m in memories]},
                  y_title="GB per device", stacked=True,
                  shapes=() if capacity is None else (horizontal_line(capacity / GIGA, "chip memory"),))


def _stage_table(stages: list[Document]) -> Table:
    return Table("stages", "Per stage", columns(
        "stage", "strategy", "devices", "block pairs", "compute s", "collectives s",
        "bytes sent per device", "step s", "patch s", "send per patch B", "send per patch s",
        "memory per device B", "fits", text=("strategy", "fits")),
        tuple((stage.number("stage"), stage.text("strategy"), len(stage.values("devices")),
               stage.number("block_pairs"), stage.number("compute_s"), stage.number("comm_s"),
               stage.number("comm_bytes_per_device"), stage.number("full_s"),
               stage.number("patch_s"), stage.number("transfer_patch_bytes"),
               stage.number("transfer_patch_s"), stage.number("memory.total_bytes"),
               _fits(stage.child("memory"))) for stage in stages))


def _fits(memory: Document) -> str:
    exceeds = memory.flag("exceeds_capacity", optional=True)
    return "n/a" if exceeds is None else ("no" if exceeds else "yes")
