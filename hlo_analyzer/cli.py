"""``analyze-hlo``: FLOPs and communication of a partitioned dump, as a table, JSON or CSV."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence

import click

from hlo_analyzer.comm import RingLink
from hlo_trace.cli import emit, run_click

log = logging.getLogger("hlo_analyzer")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dump", type=click.Path(dir_okay=False, path_type=str))
@click.option("--format", "output_format", type=click.Choice(["table", "json", "csv"]),
              default="table", show_default=True, help="Output format.")
@click.option("--by", type=click.Choice(["summary", "op", "category", "block"]),
              default="summary", show_default=True,
              help="What the table/CSV shows. summary: per category, totals, collectives by kind, "
                   "unhandled ops (and blocks and mapping with --hw); op: one row per measured "
                   "op before the summary; category: the per-category rows (CSV); block: one row "
                   "per labelled GEMM of each STDiT3 block (needs --hw). JSON always carries all "
                   "of them.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the report to this file (atomically) instead of standard output.")
@click.option("--force", is_flag=True, help="Overwrite an existing --output file.")
@click.option("--bruck", is_flag=True,
              help="Count all-to-all with Bruck's algorithm (M*log2(n)/2 per device) "
                   "instead of the ring (M*(n-1)/n).")
@click.option("--link-bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="GB/s", help="Link bandwidth for a plain ring latency estimate of each "
                                   "collective (1 GB = 1e9 bytes).")
@click.option("--hop-latency", type=click.FloatRange(min=0), default=1.0, show_default=True,
              metavar="US", help="Per-step latency in microseconds, with --link-bandwidth.")
@click.option("--hw", "hardware", default=None, metavar="NAME|FILE",
              help="Segment the dump into STDiT3 blocks and map one block onto this hardware "
                   "(a bundled name: tx8, tx8-16, h100-sxm, h200-sxm, a100-sxm; or a TOML file). "
                   "Collectives are timed on its chip-to-chip network.")
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True,
              help="Sampling steps for the inference latency (with --hw).")
@click.option("--blocks", type=click.IntRange(min=1), default=None,
              help="Blocks (spatial+temporal pairs) to total over, e.g. 28 for the whole model; "
                   "default: the pairs found in the dump (with --hw).")
@click.option("--sidecar", type=click.Path(dir_okay=False, exists=True, path_type=str),
              default=None, metavar="FILE",
              help="The tracer's JSON sidecar, whose 'inputs' tell stage inputs from weights in "
                   "the memory section; default: DUMP with the suffix .json, if it exists "
                   "(without one, every argument counts as a weight).")
@click.option("--branch", default="max", show_default=True, metavar="max|first|N",
              help="Branch of each if/case that is counted: the costliest (max, as XLA's cost "
                   "analysis), the first region, or region N of every conditional (for `if` 0 is "
                   "the true branch; jax's lax.cond lowers to `case` with the false branch first).")
@click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")
def analyze_command(dump: str, output_format: str, by: str, output: str | None, force: bool,
                    bruck: bool, link_bandwidth: float | None, hop_latency: float,
                    hardware: str | None, steps: int, blocks: int | None, sidecar: str | None,
                    branch: str,
                    verbose: bool) -> int:
    """Analyze DUMP, a partitioned program as StableHLO/MHLO text or bytecode, or HLO text.

    Prints a summary: FLOPs and bytes per category, per-device and whole-mesh totals,
    collectives by kind and the ops that no visitor measured; --by op adds one row per measured
    op (GEMM, vector and collective ops, with shapes, FLOPs and per-device bytes sent). FLOPs: dot/dot_general/convolution count 2 FLOPs per multiply-add; element-wise
    ops one per output element. Collectives: ring volumes per device.

    Example: analyze-hlo dumps/example_mlp_megatron_2x2.stablehlo.mlir --format json
    """
    from hlo_analyzer.control import parse_branch
    from hlo_analyzer.mlir import load_module
    from hlo_analyzer.report import analyze

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(message)s", stream=sys.stderr)
    link: Callable | None = None
    if link_bandwidth is not None:
        link = RingLink(bandwidth_bytes_per_s=link_bandwidth * 1e9,
                        hop_latency_s=hop_latency * 1e-6, bruck=bruck)
    if by == "block" and hardware is None:
        raise click.UsageError("--by block needs --hw (the block segmentation comes with it)")
    log.info("loading %s", dump)
    module = load_module(dump)
    log.info("counting FLOPs and collectives")
    report = analyze(module, collective_time=link, bruck=bruck, name=dump,
                     branch=parse_branch(branch))
    if hardware is not None:
        from hlo_analyzer.hw_mapping import add_hardware_sections

        log.info("segmenting blocks and mapping them on %s", hardware)
        add_hardware_sections(report, module, hardware, steps=steps, blocks=blocks)
    from hlo_analyzer.memory import add_memory_section

    add_memory_section(report, module, dump, sidecar=sidecar, hardware=hardware)
    if output_format == "json":
        text = report.to_json()
    elif output_format == "csv":
        text = report.to_csv(by)
    else:
        text = report.to_table(by)
    emit(text, output, force=force)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run_click(analyze_command, argv))


if __name__ == "__main__":
    main()
