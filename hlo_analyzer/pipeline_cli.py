"""``analyze-pipeline``: latency, communication and memory of a pipeline of traced stages."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence

import click

from hlo_trace.atomic import check_targets
from hlo_trace.cli import Count, OneLineCommand, emit, end_process, native_imports, run_click


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=str))
@click.argument("dumps", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--hw", "hardware", default="tx8-16", show_default=True, metavar="NAME|FILE",
              help="System the stages run on (its chips hold the submeshes' device ids).")
@click.option("--steps", type=Count(), default=30, show_default=True,
              help="Sampling steps of one inference.")
@click.option("--schedule", type=click.Choice(["overlapped", "per-step"]), default=None,
              help="PipeFusion schedule: overlapped (steps overlap, fill and drain once per "
                   "inference, as xDiT runs it) or per-step (every step starts with an empty "
                   "pipeline: a system that synchronises each step).  [default: the pipeline "
                   "file's `schedule`, else overlapped]")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the report to this file (atomically) instead of standard output.")
@click.option("--force", is_flag=True, help="Overwrite an existing --output file.")
@click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")
def pipeline_command(pipeline: str, dumps: tuple[str, ...], hardware: str, steps: int,
                     schedule: str | None, output_format: str, output: str | None, force: bool, verbose: bool) -> int:
    """Analyze a pipeline: PIPELINE is its TOML (stage_ids, strategy per stage, patches =
    PipeFusion patch count M, warmup_steps, schedule), DUMPS the stage dumps in stage order, each with its
    tracer sidecar beside it (trace them with `trace-stage --pipeline PIPELINE --all-stages`).

    Per stage: compute (one block mapped on the chip, times the stage's block pairs), its own
    collectives, the activation it sends to the next stage's chips and the time that takes,
    and memory per device (weights, stale K/V, peak live activations). Then the PipeFusion
    latencies under the schedule (see docs/pipeline.md): a pipelined step in steady state, the
    unpipelined warm-up step, and the inference, the last stage sending each latent patch back
    to stage 0.

    Example: analyze-pipeline dumps/pipeline/tiny_2x2_stages.toml \\
    dumps/pipeline/tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir dumps/pipeline/tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir
    """
    with native_imports():
        from hlo_analyzer.mapping.pipeline import analyze_pipeline, load_plan
        from hlo_analyzer.mlir import load_native_libraries
        from hlo_analyzer.table import render_pipeline_table

        load_native_libraries()

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(message)s", stream=sys.stderr)
    inputs = {"pipeline file": pipeline, "hardware file": hardware if os.path.isfile(hardware) else None}
    for index, dump in enumerate(dumps):
        inputs |= {f"stage {index} dump": dump,
                   f"stage {index} sidecar": os.path.splitext(dump)[0] + ".json"}
    check_targets({"-o": output}, force=force, inputs=inputs)  # before the work
    analysis = analyze_pipeline(load_plan(pipeline), list(dumps), hardware, steps=steps,
                                schedule=schedule)
    text = (json.dumps(analysis.to_dict(), indent=1, sort_keys=True) + "\n"
            if output_format == "json" else render_pipeline_table(analysis))
    emit(text, output, force=force)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    end_process(run_click(pipeline_command, argv))


if __name__ == "__main__":
    main()
