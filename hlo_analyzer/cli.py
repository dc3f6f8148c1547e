"""``analyze-hlo``: FLOPs and communication of a partitioned dump, as a table, JSON or CSV."""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import math
import operator
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from hardware.systems import load_choice
from hlo_trace.atomic import check_targets
from hlo_trace.cli import (
    MAX_QUANTITY,
    Count,
    OneLineCommand,
    PositiveFinite,
    emit,
    end_process,
    native_imports,
    run_click,
)
from hlo_trace.errors import UsageError
from hlo_trace.isolate import call_in_child, keep_until_exit

if TYPE_CHECKING:
    from hardware.systems import Hardware
    from hlo_analyzer.mapping.analysis import AnalysisOptions
    from hlo_analyzer.mapping.sections import MappingSection
    from hlo_analyzer.report import Report
    from hlo_analyzer.sidecar import Sidecar

log = logging.getLogger("hlo_analyzer")


def without_cycle_collection(function: Callable[..., int]) -> Callable[..., int]:
    """Run ``function`` with Python's cyclic garbage collector paused. An analysis builds
    millions of acyclic objects (op rows, shape tuples, liveness records) that reference
    counting frees; the collector's repeated passes over them find nothing and cost 10% of the
    run at 100k ops, more at 1M (benchmarks/analyze_speed.py)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dump", type=click.Path(dir_okay=False, path_type=str))
@click.option("--format", "output_format", type=click.Choice(["table", "json", "csv"]),
              default="table", show_default=True, help="Output format.")
@click.option("--by", type=click.Choice(["summary", "op", "category", "block", "kernel"]),
              default="summary", show_default=True,
              help="What the table/CSV shows. summary: per category, totals, collectives by kind, "
                   "unhandled ops (and blocks and mapping with --hw); op: one row per measured "
                   "op before the summary; category: the per-category rows (CSV); block: one row "
                   "per labelled GEMM of each block (an STDiT3 stage's or a generic "
                   "transformer's), then the time per block (needs --hw); "
                   "kernel: one row per mapped kernel (needs --hw). JSON always carries all of them.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the report to this file (atomically) instead of standard output.")
@click.option("--force", is_flag=True, help="Overwrite an existing --output file.")
@click.option("--bruck", is_flag=True,
              help="Count all-to-all with Bruck's algorithm (M*log2(n)/2 per device) "
                   "instead of the ring (M*(n-1)/n).")
@click.option("--link-bandwidth", type=PositiveFinite(maximum=MAX_QUANTITY), default=None,
              metavar="GB/s", help="Link bandwidth (1 GB = 1e9 bytes): without --hw, a plain ring "
                                   "latency estimate of each collective; with --hw, it replaces the "
                                   "system's chip-to-chip link bandwidth (stated in the report).")
@click.option("--hop-latency", type=PositiveFinite(allow_zero=True, maximum=MAX_QUANTITY), default=None, metavar="US",
              help="Per-step (per-hop with --hw) latency in microseconds; without --hw it needs "
                   "--link-bandwidth and defaults to 1; with --hw it replaces the system's.")
@click.option("--hw", "hardware", default=None, metavar="NAME|FILE",
              help="Map every op onto this hardware (a bundled name: tx8, tx8-16, h100-sxm, "
                   "8xh100, h200-sxm, a100-sxm, n150, p150, t3k; or a TOML file). A chip name on an N-device dump "
                   "means N such chips on the network of the bundled system built from that chip, "
                   "laid out for N: --hw tx8 on a 16-device dump is 16 TX8 chips on tx8-16's "
                   "network, --hw h100-sxm on 8 devices 8 H100s on 8xh100's, --hw n150 Wormholes on t3k's (the report states "
                   "the system). Collectives are timed on the chip-to-chip network; an STDiT3 "
                   "stage is also grouped by block pair, any transformer by block.")
@click.option("--steps", type=Count(), default=None,
              help="Runs of the program the latency total covers (with --hw), e.g. the sampling "
                   "steps of a diffusion inference.  [default: 30 on an STDiT3 stage, a whole "
                   "inference; 1 on any other program; the report names the total]")
@click.option("--pairs", type=Count(), default=None,
              help="Block pairs (spatial + temporal) to total over, e.g. 28 for the whole model; "
                   "default: the pairs found in the dump (with --hw on an STDiT3 stage).")
@click.option("--exec", "execution", type=click.Choice(["fused", "eager", "torch"]), default=None,
              help="Execution model (with --hw): fused = a compiled graph (XLA-style fusion of "
                   "element-wise chains, GEMM epilogues, LayerNorm+modulate); torch = PyTorch run "
                   "eagerly, one kernel per library call (a LayerNorm, a GELU, a linear layer with "
                   "its bias in the GEMM epilogue: docs/gpu.md); eager = one kernel per HLO op.  "
                   "[default: torch for a traced PyTorch model (its sidecar lists library calls) on a GPU, "
                   "fused otherwise]")
@click.option("--dram-efficiency", type=PositiveFinite(maximum=1), default=1.0,
              show_default=True, help="Fraction of the DRAM bandwidth sustained (with --hw).")
@click.option("--fidelity", type=click.Choice(["LoFi", "HiFi2", "HiFi3", "HiFi4"]), default=None,
              help="Math fidelity of every GEMM on a chip with a tiled model (--hw n150, p150): more "
                   "passes of the matrix engine per tile, more mantissa bits.  [default: the vendor's "
                   "out-of-box choice per dtype: bf16 HiFi2, bfp8 and bfp4 LoFi, fp32 HiFi4; the report "
                   "states it]")
@click.option("--exp-ops", type=Count(), default=1, show_default=True,
              help="Vector operations charged per element of an exponential (with --hw).")
@click.option("--cross-attention", type=click.Choice(["per-sample", "all"]), default="per-sample",
              show_default=True,
              help="How a cross-attention over flattened samples is charged (with --hw): per-sample = "
                   "each query reads only its own sample's caption tokens, as OpenSora's "
                   "block-diagonal kernel does; all = every traced (masked) key.")
@click.option("--caption-tokens", type=Count(), default=None,
              help="Caption tokens of one sample for --cross-attention per-sample.  [default: the "
                   "sidecar's model_max_length; without either, the traced keys are charged]")
@click.option("--timeline", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write a Chrome trace-event JSON of the mapped kernels (open it in Perfetto or "
                   "chrome://tracing; with --hw).")
@click.option("--timeline-pair", type=Count(0), default=None,
              help="Timeline of this block pair only (default: the whole step).")
@click.option("--kernels", type=click.Path(dir_okay=False, path_type=str), default=None, metavar="FILE",
              help="Write the mapped kernels of one device (each kernel's Op: shapes, FLOPs, bytes) "
                   "with their block pairs as a kernel list JSON, to cost them again on any GPU "
                   "description without the dump (hlo_analyzer/mapping/kernel_list.py; with --hw).")
@click.option("--attention-memory", type=click.Choice(["written", "fused"]), default="written",
              show_default=True,
              help="Memory of the attentions: written = as the program writes them (their (heads x "
                   "S_Q x S_KV) scores live); fused = as a fused flash-attention kernel holds them "
                   "(scores and softmax in on-chip tiles: hlo_analyzer/attention_memory.py).")
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
@without_cycle_collection
def analyze_command(dump: str, output_format: str, by: str, output: str | None, force: bool,
                    bruck: bool, link_bandwidth: float | None, hop_latency: float | None,
                    hardware: str | None, steps: int | None, pairs: int | None, execution: str | None,
                    dram_efficiency: float, fidelity: str | None, exp_ops: int, cross_attention: str,
                    caption_tokens: int | None, timeline: str | None,
                    timeline_pair: int | None, kernels: str | None, attention_memory: str,
                    sidecar: str | None, branch: str,
                    verbose: bool) -> int:
    """Analyze DUMP, a partitioned program as StableHLO/MHLO text or bytecode, or HLO text.

    Prints a summary: FLOPs and bytes per category, per-device and whole-mesh totals,
    collectives by kind and the ops that no visitor measured; --by op adds one row per measured
    op (GEMM, vector and collective ops, with shapes, FLOPs and per-device bytes sent). FLOPs: dot/dot_general/convolution count 2 FLOPs per multiply-add; element-wise
    ops one per output element. Collectives: ring volumes per device.

    Bad input of any kind (a file that does not parse, or even crashes jaxlib's parser; a bad
    option or hardware file) ends with one "Error:" line and exit code 2.

    Example: analyze-hlo hlo_trace/examples/example_mlp_megatron_2x2.stablehlo.mlir --format json
    """
    with native_imports():  # jaxlib's bindings, loaded before any fork
        from hlo_analyzer.mlir import load_native_libraries

        load_native_libraries()

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(message)s", stream=sys.stderr)
    _check_hw_options(hardware, by=by, link_bandwidth=link_bandwidth, hop_latency=hop_latency,
                      bruck=bruck, timeline=timeline, timeline_pair=timeline_pair, kernels=kernels,
                      fidelity=fidelity)
    from hlo_analyzer.sidecar import read_sidecar, sidecar_for

    # the hardware loaded once, before the dump is parsed (a bad file fails first)
    choice = load_choice(hardware) if hardware is not None else None
    sidecar_path = sidecar or sidecar_for(dump)
    # read once; likewise a bad sidecar (a device, a huge or malformed file) fails first
    read = read_sidecar(sidecar_path)
    from hlo_analyzer.control import parse_branch
    from hlo_analyzer.mapping.analysis import AnalysisOptions
    from hlo_analyzer.measurement import run_in_parallel

    analysis = AnalysisOptions(
        steps=steps, pairs=pairs, execution=execution, dram_efficiency=dram_efficiency,
        exp_ops=exp_ops, cross_attention=cross_attention, caption_tokens=caption_tokens,
        fidelity=fidelity,
        link_bandwidth_bytes_per_s=None if link_bandwidth is None else link_bandwidth * 1e9,
        hop_latency_s=None if hop_latency is None else hop_latency * 1e-6,
        bruck=bruck, branch=parse_branch(branch), attention_memory=attention_memory,
        parallel_memory=run_in_parallel(dump) and attention_memory == "written")
    request = _Request(dump=dump, output_format=output_format, by=by, hardware=choice,
                       sidecar=read, analysis=analysis, timeline_pair=timeline_pair,
                       timeline=timeline, kernels=kernels, output=output, force=force)
    check_targets({"--timeline": timeline, "--kernels": kernels, "-o": output}, force=force, inputs={  # before the work
        "dump": dump, "sidecar": sidecar_path,
        "hardware file": hardware if hardware is not None and os.path.isfile(hardware) else None})
    # Parse and measure in a forked child: jaxlib's parser kills its process on some malformed
    # inputs (SIGFPE, SIGABRT, SIGSEGV); the child's death becomes one Error: line here. The
    # child writes the output files itself (a 1M-op report is 230 MB: not sent through a pipe).
    text = call_in_child(_render, request, origin=dump, what="parsing and measuring it")
    if text is not None:
        emit(text, None)
    return 0


@dataclass(frozen=True)
class _Request:
    """What the child needs to produce the report text (plain values: it crosses a fork)."""

    dump: str
    output_format: str
    by: str
    hardware: Hardware | None  # the --hw choice, loaded
    sidecar: Sidecar | None  # the dump's sidecar (--sidecar or the one beside it), read
    analysis: AnalysisOptions
    timeline_pair: int | None = None
    timeline: str | None = None  # write the timeline there
    kernels: str | None = None  # write the kernel list there
    output: str | None = None  # write the report there (else it is returned)
    force: bool = False


def _render(request: _Request) -> str | None:
    """Load, measure, map and render (runs in the forked child): the report and the timeline
    are written to their files; the report's text is returned when it goes to stdout."""
    from hlo_analyzer.mapping.analysis import analyze_dump
    from hlo_analyzer.mlir import use_fresh_context

    # The parent's context (if any) has a thread pool that did not fork; this one has none, so
    # that the module it parses can be read by a process forked from this one (the memory
    # measured beside the rest: hlo_analyzer.measurement).
    use_fresh_context(threads=False)
    dump = request.dump
    analysis = analyze_dump(dump, request.hardware, request.analysis, sidecar=request.sidecar)
    report = analysis.report
    check_numbers(report)
    if request.timeline is not None:
        from hlo_analyzer.mapping.timeline import timeline_json

        emit(timeline_json(analysis.mapping, pair=request.timeline_pair),
             request.timeline, force=request.force)
    if request.kernels is not None:
        from hlo_analyzer.mapping import kernel_list as kernel_list
        from hlo_analyzer.measurement import as_usage_error

        with as_usage_error(dump, "has no kernel list"):
            listed = kernel_list.kernel_list(report)
        emit(kernel_list.dumps(listed), request.kernels, force=request.force)
    if request.output_format == "json":
        text: str | Iterable[str] = report.json_pieces()
    elif request.output_format == "csv":
        text = report.to_csv(request.by)
    else:
        from hlo_analyzer.table import render_report_table

        text = render_report_table(report, request.by)
    keep_until_exit(analysis)  # not freed: the child ends next
    if request.output is None:
        return text if isinstance(text, str) else "".join(text)
    emit(text, request.output, force=request.force)
    return None


#: The measures of an op row that must be finite and non-negative.
ROW_MEASURES = ("flops", "comm_bytes", "comm_bytes_per_device", "comm_latency_s")


def check_numbers(report: Report) -> None:
    """Refuse to print a report holding a negative, NaN or infinite number: such a value comes
    from input sizes or hardware values beyond any real machine, never from a real measurement,
    and NaN/Infinity are not even valid JSON."""
    # Rows repeat a few values: check each measure's distinct ones (a pass in C each), and name
    # the first bad row if any.
    rows = report.rows
    if not all(_is_in_range(value) for name in ROW_MEASURES
               for value in set(map(operator.attrgetter(name), rows))):
        for row in rows:
            for name in ROW_MEASURES:
                _check_number(getattr(row, name), f"op {row.op} at {row.location or '?'}: {name}",
                              report.source)
    # The mapping's kernels likewise: their distinct values, then the tree for the name if bad.
    _check_tree(report.to_dict(with_ops=False, with_kernels=False), "", report.source)
    from hlo_analyzer.mapping.render import hardware_sections

    mapping = hardware_sections(report).mapping
    if mapping is not None and not _kernels_in_range(mapping):
        _check_tree(report.to_dict(with_ops=False), "", report.source)


def _kernels_in_range(mapping: MappingSection) -> bool:
    """Whether every number of the mapped kernels (each field of each ``MappedOp``, the
    elements of its tuples, and its block pair) is in range: the distinct combinations of the
    fields that repeat (kernels of one signature), the positions by their least."""
    from hlo_analyzer.mapping.results import MappedOp

    ops = mapping.program.ops
    if not ops:
        return True
    varying = ("position", "positions")
    repeating = [field.name for field in dataclasses.fields(MappedOp) if field.name not in varying]
    distinct = set(map(operator.attrgetter(*repeating), ops))  # one pass
    least = min(min(map(operator.attrgetter("position"), ops)),
                min(itertools.chain.from_iterable(map(operator.attrgetter("positions"), ops)), default=0))
    return (_is_in_range(least) and all(map(_is_in_range, set(mapping.pair_of) | set(mapping.block_of)))
            and all(_is_in_range(value) for values in distinct for value in values))


def _check_tree(value: Any, where: str, source: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _check_tree(item, f"{where}.{key}" if where else str(key), source)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_tree(item, where, source)
    else:
        _check_number(value, where, source)


def _check_number(value: Any, where: str, source: str) -> None:
    if not _is_in_range(value):
        raise UsageError(f"{source}: {where} = {value}: out of range (the input's sizes or the "
                         "hardware values are beyond any real machine)")


def _is_in_range(value: Any) -> bool:
    """False for a negative, NaN or infinite number; True for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return not (value < 0 or (isinstance(value, float) and not math.isfinite(value)))


def _check_hw_options(hardware: str | None, *, by: str, link_bandwidth: float | None,
                      hop_latency: float | None, bruck: bool, timeline: str | None,
                      timeline_pair: int | None, kernels: str | None = None, fidelity: str | None = None) -> None:
    """One-line usage errors for options that need (or contradict) --hw."""
    if hardware is None:
        for given, option in ((by in ("block", "kernel"), f"--by {by}"), (timeline is not None, "--timeline"),
                              (fidelity is not None, "--fidelity"),
                              (timeline_pair is not None, "--timeline-pair"), (kernels is not None, "--kernels")):
            if given:
                raise click.UsageError(f"{option} needs --hw (the mapping comes with it)")
        if hop_latency is not None and link_bandwidth is None:
            raise click.UsageError("--hop-latency needs --link-bandwidth or --hw")
    elif bruck:
        raise click.UsageError("--bruck applies to the plain ring estimate; with --hw collectives "
                               "are timed on the system's ring model")
    if timeline_pair is not None and timeline is None:
        raise click.UsageError("--timeline-pair needs --timeline FILE")


def main(argv: Sequence[str] | None = None) -> None:
    end_process(run_click(analyze_command, argv))


if __name__ == "__main__":
    main()
