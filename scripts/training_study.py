"""Training study: the notes' training table (note 000, "Comparison of Different Parallelism in
Training") reproduced from traces of one STDiT3 block pair's training step at the full config,
beside the notes' formulas and the traced layout's exact formulas, with the step's latency mapped
on the TX8 cluster (tx8-16) and on 16 H100s.

Each row of the notes is one case: ``trace-stage --mode train`` of stage 1 of ``--stage-ids
0-0,1-1,2-27`` (one block pair, no embeddings, no final layer) on 16 devices, then
``analyze-hlo --format json`` (and ``--hw`` per system). The analyses, kept in the work directory
(``results/.cache/training`` by default, with the dumps), are the cache: a rerun only rebuilds the
tables (seconds); an analysis made by other analyzer or cost-model sources is made again from
the cached dump. Traces run one at a time
under the user's trace lock (``flock``, ``hlo_trace.cache.trace_lock_path``) (a full-size trace takes tens of seconds and gigabytes).

    python3 scripts/training_study.py                 # -> results/training.md, .csv, .png
    python3 scripts/training_study.py --only TP,DP    # a subset of the rows
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_analyzer.mapping.json_report import JsonReport  # noqa: E402
from hlo_analyzer.mapping.sections import MappingTotals  # noqa: E402
from hlo_analyzer.report import ReportTotals  # noqa: E402
from hlo_analyzer.training import TrainingSplit  # noqa: E402
from hlo_trace.atomic import atomic_write  # noqa: E402
from hlo_trace.cache import trace_lock_path  # noqa: E402
from hlo_trace.cli import OneLineCommand  # noqa: E402
from hlo_trace.documents import load_json  # noqa: E402
from hlo_trace.errors import InputFileError  # noqa: E402
from models.opensora.config import get_config  # noqa: E402
from models.opensora.theory import activation_per_device, block_dims, block_gemm_flops  # noqa: E402
from models.opensora.training_theory import (  # noqa: E402
    NOTES_TRAINING_TABLE,
    block_parameters,
    layout_training_activations,
    layout_training_collectives,
    training_buffer_bytes,
)

SHAPE = "204_640_360"
DEVICES = 16
STAGE = ["--config", "full", "--shape", SHAPE, "--stage-ids", "0-0,1-1,2-27", "--stage", "1",
         "--mode", "train"]


@dataclass(frozen=True)
class Row:
    label: str  # the notes' row
    strategy: str
    mesh: tuple[int, int]
    batch: int
    zero: int = 0

    @property
    def key(self) -> str:
        return f"{self.strategy}_{self.mesh[0]}x{self.mesh[1]}_b{self.batch}_zero{self.zero}"

    def options(self) -> list[str]:
        return ["--strategy", self.strategy, "--mesh", f"{self.mesh[0]}x{self.mesh[1]}",
                "--batch", str(self.batch), "--zero", str(self.zero)]


#: The notes' rows. The guidance batch B = 2 splits over x only; data parallelism over 16
#: devices needs a batch of 16 (one sample per device).
ROWS = (
    Row("DS-SP", "ds_ulysses", (2, 8), 2),
    Row("Ring-SP", "ring_attention", (2, 8), 2),
    Row("DP", "dp", (1, 16), 16),
    Row("ZeRO1", "dp", (1, 16), 16, 1),
    Row("USP + ZeRO1", "usp", (2, 8), 2, 1),
    Row("USP + ZeRO2", "usp", (2, 8), 2, 2),
    Row("USP + ZeRO3", "usp", (2, 8), 2, 3),
    Row("TP", "megatron", (1, 16), 2),
    Row("Megatron-SP", "megatron_sp", (2, 8), 2),
)


#: Systems the step's latency is mapped on: the TX8 cluster, and 16 H100s (one per device of
#: the 16-device dump; the 8-GPU systems hold only 8).
SYSTEMS = ("tx8-16", "h100-sxm")


def dump_name(row: Row) -> str:
    zero = f"_zero{row.zero}" if row.zero else ""
    return (f"full_{SHAPE}_{row.strategy}_{row.mesh[0]}x{row.mesh[1]}_stage1_pairs1-1_train"
            f"{zero}.mlir")


def analyzer_version() -> str:
    """A hash of the analyzer's and the cost models' sources: a cached analysis made by other
    code is made again (the dumps stay cached)."""
    digest = hashlib.sha256()
    for path in sorted((*REPO_ROOT.glob("hlo_analyzer/**/*.py"),
                        *REPO_ROOT.glob("hardware/**/*.py"))):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class RowAnalysis:
    """What the tables take from one row's analyses (the cache of the row): the report's
    totals, the training step's split and, per system of ``SYSTEMS``, the mapping's totals;
    ``analyzer``: the sources that made them (:func:`analyzer_version`)."""

    analyzer: str
    totals: ReportTotals
    training: TrainingSplit
    latency: dict[str, MappingTotals]

    def to_dict(self) -> dict[str, Any]:
        return {"analyzer": self.analyzer, "totals": self.totals.to_dict(),
                "training": self.training.to_dict(),
                "latency": {system: totals.to_dict() for system, totals in self.latency.items()}}

    @classmethod
    def from_dict(cls, document: Any, origin: str) -> RowAnalysis:
        """The cache :meth:`to_dict` wrote (``origin`` names it in errors)."""
        try:
            return cls(str(document["analyzer"]),
                       ReportTotals.from_dict(document["totals"], origin),
                       TrainingSplit.from_dict(document["training"], origin),
                       {system: MappingTotals.from_dict(totals, f"{origin}: latency.{system}")
                        for system, totals in document["latency"].items()})
        except (KeyError, TypeError, AttributeError) as error:
            raise InputFileError(f"{origin}: not a training study's analysis ({error!r})") from None


def analyze_row(row: Row, work: Path, version: str) -> RowAnalysis | None:
    """The cached analysis of ``row``: traced when its dump is missing, analyzed (and mapped on
    ``SYSTEMS``) when its analysis is, or was made by another analyzer ``version`` (None if
    that fails)."""
    cached = work / f"{row.key}.analysis.json"
    if cached.is_file():
        document = load_json(cached, "a training study's analysis")
        # an analysis by other sources may be of another form: made again, not read
        if isinstance(document, dict) and document.get("analyzer") == version:
            kept = RowAnalysis.from_dict(document, str(cached))
            if set(kept.latency) == set(SYSTEMS):
                return kept
    dump = work / "dumps" / dump_name(row)
    if not dump.is_file():
        lock = trace_lock_path()
        lock.parent.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["flock", str(lock), sys.executable, "-m",
                                 "tracing.cli", *STAGE, *row.options(), "-o", str(dump.parent),
                                 "--force"], cwd=REPO_ROOT, capture_output=True, text=True)
        if result.returncode:
            click.echo(f"{row.label}: trace failed: {result.stderr.strip().splitlines()[-1:]}",
                       err=True)
            return None
    reports = {}
    for system in (None, *SYSTEMS):
        options = ["--hw", system] if system else []
        analysis = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), *options,
                                   "--format", "json"], cwd=REPO_ROOT, capture_output=True,
                                  text=True)
        if analysis.returncode:
            click.echo(f"{row.label}: analysis failed: {analysis.stderr.strip()}", err=True)
            return None
        reports[system] = JsonReport.from_json(
            analysis.stdout, f"analyze-hlo {dump} {' '.join(options)}".strip(),
            required=("mapping",) if system else ("training",))
    measured = reports.pop(None)
    assert measured.training is not None
    kept = RowAnalysis(version, measured.totals, measured.training,
                       {system: report.mapping.totals for system, report in reports.items()})
    atomic_write(cached, json.dumps(kept.to_dict(), indent=1, sort_keys=True) + "\n", force=True)
    return kept


def notes_values(row: Row) -> dict[str, float]:
    """The notes' formulas evaluated for one block pair: P, G, OS from the pair's parameter
    bytes (q = 2), Act from ``theory.activation_per_device`` (the notes' per-layer formula for
    each block plus the cross-attentions; A/N for the layouts the notes give A/N)."""
    config = get_config("full")
    n = DEVICES
    elements = 2 * sum(_size(shape) for shape in block_parameters(config).values())
    p = g = 2 * elements
    text = NOTES_TRAINING_TABLE[row.label]
    memory_pg, memory_os, memory_act = text[5], text[6], text[7]
    pg = {"P+G": (p, g), "P+(G/N)": (p, g / n), "(P+G)/N": (p / n, g / n)}[memory_pg]
    os_ = {"6P": 6 * p, "6P/N": 6 * p / n}[memory_os]
    dims = block_dims(config, SHAPE, batch=row.batch)
    if memory_act == "αA":  # TP: the notes' own TP formula
        act = activation_per_device("megatron", dims, n)
    else:
        act = activation_per_device("none", dims, 1) / n
    return {"param": pg[0], "grad": pg[1], "optimizer_state": os_, "activation": act}


def _size(shape: tuple[int, ...]) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size


def layout_comm_difference(row: Row, traced: dict[tuple[str, str, str], tuple[int, float]]
                           ) -> tuple[float, int]:
    """The largest relative difference, over every (phase, traffic, kind), between the traced
    bytes per device and ``layout_training_collectives`` (the study's official path), and the
    number of kinds; a count that differs is a difference of 1."""
    config = get_config("full")
    theory: dict[tuple[str, str, str], list] = {}
    for term in layout_training_collectives(row.strategy, config,
                                            block_dims(config, SHAPE, batch=row.batch),
                                            row.mesh, row.zero):
        entry = theory.setdefault((term.phase, term.traffic, term.kind), [0, 0.0])
        entry[0] += term.count
        entry[1] += term.bytes_per_device
    worst = 0.0
    for key in set(traced) | set(theory):
        (count, volume), (formula_count, formula) = traced.get(key, (0, 0.0)), theory.get(
            key, (0, 0.0))
        worst = max(worst, 1.0 if count != formula_count else
                    abs(volume - formula) / max(volume, formula, 1.0))
    return worst, len(set(traced) | set(theory))


def gib(value: float) -> str:
    return f"{value / 2**30:.3f}"


def gb(value: float) -> str:
    return f"{value / 1e9:.3f}"


def build(results: dict[str, tuple[Row, RowAnalysis | None]]) -> tuple[str, str, list[dict]]:
    config = get_config("full")
    lines = ["# Training: the notes' table from traces", "",
             f"One STDiT3 block pair (full config), shape {SHAPE}, {DEVICES} devices, bf16 with "
             "fp32 AdamW states (2 + 2 + 12 bytes per parameter); the training step as "
             "`trace-stage --mode train` traces it (docs/training.md). Memory per device in GiB, "
             "communication per device in GB (ring volumes), per block pair. *traced*: "
             "`analyze-hlo` on the dump; *layout*: `models/opensora/training_theory.py` (exact "
             "formulas of the traced layout); *notes*: the notes' formulas (note 000) evaluated "
             "for the pair. Regenerate: `python3 scripts/training_study.py`.", "",
             "| row | strategy | mesh | batch | P traced / layout / notes | G traced / layout / "
             "notes | OS traced / layout / notes | Act traced / layout / notes | param+grad comm "
             "(fwd, bwd, opt) | activation comm (fwd, bwd) | kinds (param+grad; activation) | "
             "comm traced vs layout, per kind | GEMM / (3 x forward) | step on tx8-16 / 16 x "
             "H100 (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    records = []
    for label, (row, analysis) in results.items():
        notes = notes_values(row)
        if analysis is None:
            lines.append(f"| {label} | {row.strategy} | {row.mesh[0]}x{row.mesh[1]} | "
                         f"{row.batch} | not traced | | | | | | | | | |")
            continue
        training = analysis.training
        memory = training.memory
        layout = training_buffer_bytes(row.strategy, config, row.mesh, row.zero)
        layout["activation"] = sum(term.bytes for term in layout_training_activations(
            row.strategy, config, block_dims(config, SHAPE, batch=row.batch), row.mesh))
        worst, kinds_compared = layout_comm_difference(row, training.comm)

        def volume(traffic, phase=None):
            return training.comm_bytes(phase=phase, traffic=traffic)

        def kinds(traffic):
            found = sorted({f"{kind} x{count} ({phase[:3]})"
                            for (phase, kind_traffic, kind), (count, _) in training.comm.items()
                            if kind_traffic == traffic})
            return ", ".join(found) or "none"

        latency = {system: analysis.latency[system].step_latency_s for system in SYSTEMS}
        forward = block_gemm_flops(block_dims(config, SHAPE, batch=row.batch))
        ratio = DEVICES * analysis.totals.gemm_flops / (3 * forward)
        text = NOTES_TRAINING_TABLE[label]
        lines.append(
            f"| {label} | {row.strategy}{' zero' + str(row.zero) if row.zero else ''} | "
            f"{row.mesh[0]}x{row.mesh[1]} | {row.batch} | "
            f"{gib(memory['param'])} / {gib(layout['param'])} / {gib(notes['param'])} | "
            f"{gib(memory['grad'])} / {gib(layout['grad'])} / {gib(notes['grad'])} | "
            f"{gib(memory['optimizer_state'])} / {gib(layout['optimizer_state'])} / "
            f"{gib(notes['optimizer_state'])} | "
            f"{gib(memory['activation'])} / {gib(layout['activation'])} / "
            f"{gib(notes['activation'])} | "
            f"{gb(volume('param_grad', 'forward'))}, {gb(volume('param_grad', 'backward'))}, "
            f"{gb(volume('param_grad', 'optimizer'))} (notes: {text[0]}, {text[1]}) | "
            f"{gb(volume('activation', 'forward'))}, {gb(volume('activation', 'backward'))} "
            f"(notes: {text[2]}, {text[3]}) | {kinds('param_grad')}; {kinds('activation')} | "
            f"max difference {100 * worst:.3f}% ({kinds_compared} kinds) | {ratio:.4f} | {1e3 * latency['tx8-16']:.1f} / {1e3 * latency['h100-sxm']:.1f} |")
        records.append({"row": label, "strategy": row.strategy, "mesh": f"{row.mesh[0]}x{row.mesh[1]}",
                        "batch": row.batch, "zero": row.zero,
                        **{f"{key}_traced": memory[key] for key in
                           ("param", "grad", "optimizer_state", "activation")},
                        **{f"{key}_layout": layout[key] for key in layout},
                        **{f"{key}_notes": notes[key] for key in notes},
                        "param_grad_comm_forward": volume("param_grad", "forward"),
                        "param_grad_comm_backward": volume("param_grad", "backward"),
                        "param_grad_comm_optimizer": volume("param_grad", "optimizer"),
                        "activation_comm_forward": volume("activation", "forward"),
                        "activation_comm_backward": volume("activation", "backward"),
                        "comm_layout_max_relative_difference": worst,
                        "gemm_over_3x_forward": ratio,
                        **{f"step_s_{system}": latency[system] for system in SYSTEMS}})
    lines += ["", "Reading the table:", "",
              "- The DP rows train 16 samples (one per device), the others the guidance batch of "
              "2 (batch on x): their Act is not comparable per sample. OpenSora's flattened "
              "cross-attention scores every query against every caption of the batch (masked), "
              "so with 16 captions each device keeps 55200 x 4800 scores per head and "
              "cross-attention: most of DP's 68 GiB. Each DP device projects only its own "
              "samples' captions and all-gathers the caption K and V (forward activation "
              "traffic), whose gradients the backward reduce-scatters.",
              "- Act traced vs notes: the notes count one standard transformer layer's tensors "
              "(bsh(34 + 5as/h)); the traced Act is every value the forward keeps for autograd's "
              "backward (the fp32 operands torch-xla's lowering of the bf16 element-wise "
              "products reads back, fp32 norm statistics and attention probabilities, the "
              "temporal mask, the flattened cross-attention's scores against every caption), so "
              "it is larger everywhere. The layout column names each of those tensors "
              "(`layout_training_activations`) and equals the traced Act to the byte.",
              "- Communication: `layout_training_collectives` gives every collective of the "
              "step term by term (forward, backward, optimizer; parameter/gradient and "
              "activation traffic); the column compares it with the trace kind by kind "
              "(count and bytes per device).",
              "- Megatron-SP here is tensor parallel over y = 8 with the batch on x: P, G and OS "
              "are split 8 ways, not the notes' 16.",
              "- ZeRO-1 sums the gradients with an all-reduce (PyTorch's ZeroRedundancyOptimizer)"
              " and all-gathers the updated parameters: 1.5x the notes' traffic; ZeRO-2/3 "
              "reduce-scatter. Under usp GSPMD sums most gradients in two all-reduces (over y, "
              "then x), so few of them are reduce-scatters (docs/training.md).",
              "- GEMM / (3 x forward) above 1: the layouts with the batch on x (2x8) repeat the "
              "caption K/V projection on both x rows (every caption on each, for the flattened "
              "cross-attention), as in inference: 0.07%."]
    stream = io.StringIO()
    if records:
        writer = csv.DictWriter(stream, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return "\n".join(lines) + "\n", stream.getvalue(), records


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 4.5))
    bottom = [0.0] * len(records)
    for key, label in (("param", "P"), ("grad", "G"), ("optimizer_state", "OS"),
                       ("activation", "Act")):
        values = [record[f"{key}_traced"] / 2**30 for record in records]
        axis.bar([r["row"] for r in records], values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    axis.set_ylabel("GiB per device (one block pair)")
    axis.set_title(f"Training step memory per device by class, {SHAPE}, {DEVICES} devices")
    axis.legend()
    plt.setp(axis.get_xticklabels(), rotation=30, ha="right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


@click.command(cls=OneLineCommand)
@click.option("-o", "--out", "out_dir", default="results", show_default=True,
              type=click.Path(file_okay=False), help="Where training.md / .csv / .png go.")
@click.option("--work", default=None, type=click.Path(file_okay=False),
              help="Cache of analyses.  [default: OUT/.cache/training]")
@click.option("--only", default=None, help="Comma-separated row labels (as in the notes).")
def main(out_dir: str, work: str | None, only: str | None) -> None:
    out = Path(out_dir)
    cache = Path(work) if work else out / ".cache" / "training"
    cache.mkdir(parents=True, exist_ok=True)
    wanted = set(only.split(",")) if only else None
    version = analyzer_version()
    results = {row.label: (row, analyze_row(row, cache, version)) for row in ROWS
               if wanted is None or row.label in wanted}
    markdown, table, records = build(results)
    atomic_write(out / "training.md", markdown, force=True)
    atomic_write(out / "training.csv", table, force=True)
    if records:
        plot(records, out / "training_memory.png")
    click.echo(f"wrote {out / 'training.md'}, {out / 'training.csv'}", err=True)


if __name__ == "__main__":
    main()
