"""Predicted against published: every row of the vendor's n150 and p150 GEMM tables; and how far
TX8's figures moved when its GEMMs went from the tile mappers' bound to the tiled model.

    python3 scripts/tiled_predictions.py              # print the table and the agreement per group
    python3 scripts/tiled_predictions.py --write      # also write results/tiled/ (CSV, Markdown, plot)

The TX8 table (``results/tiled/tx8_before_after.md``): one ideal STDiT3 block pair (the shape
dictionary's ops, no trace) on one chip of tx8-16's best plan at every reference shape
(ds_ulysses on a 2x8 mesh), mapped with GEMMs at the tile mappers' bound (tx8.toml without its
``[tiled_model]``) and as the tiled model predicts them.

n150's rows are the ones scripts/calibrate_tiled.py fitted on; p150's were never fitted (its
constants are n150's, carried over). The agreement lines give, per card, dtype and trace, the
median and 90th percentile of |predicted / published - 1| and the share of rows within 20% and 25%.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hardware import load_chip  # noqa: E402
from hardware.tiled_calibration import (  # noqa: E402
    PublishedGemm,
    agreement,
    load_published_gemms,
    predicted_seconds,
)
from hlo_trace.atomic import atomic_write  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402

OUT = REPO_ROOT / "results" / "tiled"
HEADER = "card,grid,M,K,N,trace,dtype,fidelity,published_us,predicted_us,ratio"


def prediction_rows() -> list[tuple[PublishedGemm, float]]:
    chips = {card: load_chip(card) for card in ("n150", "p150")}
    return [(row, predicted_seconds(chips[row.card], row)) for row in load_published_gemms()]


def csv_text(pairs: list[tuple[PublishedGemm, float]]) -> str:
    lines = [HEADER] + [f"{r.card},{r.grid},{r.m},{r.k},{r.n},{r.trace},{r.dtype},{r.fidelity},"
                        f"{r.seconds * 1e6:.2f},{p * 1e6:.2f},{p / r.seconds:.3f}" for r, p in pairs]
    return "\n".join(lines) + "\n"


def groups(pairs: list[tuple[PublishedGemm, float]]) -> list[tuple[str, list[float]]]:
    keys: dict[str, list[float]] = {}
    for r, p in pairs:
        role = "fitted" if r.card == "n150" else "never fitted"
        keys.setdefault(f"{r.card} {r.grid} ({role}) {r.dtype} {r.fidelity} {'trace' if r.trace else 'no trace'}",
                        []).append(p / r.seconds)
    return list(keys.items())


def summary_text(pairs: list[tuple[PublishedGemm, float]]) -> str:
    lines = ["| rows | n | median abs(pred/pub - 1) | p90 | within 20% | within 25% |", "| --- | --- | --- | --- | --- | --- |"]
    for name, ratios in groups(pairs):
        a = agreement(ratios)
        lines.append(f"| {name} | {a.rows} | {a.median:.1%} | {a.p90:.1%} | {a.within_20:.0%} | {a.within_25:.0%} |")
    return "\n".join(lines) + "\n"


TX8_PLAN = ("ds_ulysses", (2, 8))


def tx8_before_after_text() -> str:
    import dataclasses

    from hardware import map_block
    from models.opensora.block_ops import block_shapes_for, build_stdit_block_ops
    from models.opensora.config import get_config
    from models.opensora.inputs import REFERENCE_SHAPES, geometry

    predicted = load_chip("tx8")
    bound = dataclasses.replace(predicted, tiled_model=None)
    model = get_config("full")
    strategy, mesh = TX8_PLAN
    lines = ["| shape | GEMM ms, bound | GEMM ms, predicted | GEMM after / before | pair ms, bound | "
             "pair ms, predicted | pair after / before |", "|---|---|---|---|---|---|---|"]
    for shape in REFERENCE_SHAPES:
        g = geometry(model, shape)
        ops = build_stdit_block_ops(block_shapes_for(model, frames=g.T, spatial_tokens=g.S, strategy=strategy,
                                                     mesh=mesh, batch=2, blocks=1))
        before, after = map_block(ops, bound), map_block(ops, predicted)
        gemm_before, gemm_after = before.latency_s_by_type["GEMM"], after.latency_s_by_type["GEMM"]
        lines.append(f"| {shape} | {gemm_before * 1e3:.3f} | {gemm_after * 1e3:.3f} | {gemm_after / gemm_before:.2f} | "
                     f"{before.latency_s * 1e3:.3f} | {after.latency_s * 1e3:.3f} | {after.latency_s / before.latency_s:.2f} |")
    return "\n".join(lines) + "\n"


def plot(pairs: list[tuple[PublishedGemm, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for card, marker, color in (("n150", "o", "C0"), ("p150", "s", "C1")):
        for trace in (True, False):
            sel = [(r.seconds * 1e6, p / r.seconds) for r, p in pairs if r.card == card and r.trace == trace]
            ax.scatter([s for s, _ in sel], [q for _, q in sel], marker=marker, edgecolors=color,
                       facecolors=color if trace else "none",
                       label=f"{card}{' (fitted)' if card == 'n150' else ' (never fitted)'}, {'trace' if trace else 'no trace'}")
    ax.set_xscale("log")
    ax.axhline(1.0, color="k", lw=0.8)
    for bound in (0.8, 1.2):
        ax.axhline(bound, color="k", lw=0.5, ls=":")
    ax.set_xlabel("published time per GEMM (us)")
    ax.set_ylabel("predicted / published")
    ax.set_title("Tiled model against tt-metal's GEMM tables (all dtypes)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--write", is_flag=True, help="write results/tiled/predictions.csv, summary.md and residuals.png")
def main(write: bool) -> None:
    pairs = prediction_rows()
    click.echo(HEADER.replace(",", "  "))
    for line in csv_text(pairs).splitlines()[1:]:
        click.echo(line.replace(",", "  "))
    click.echo("")
    click.echo(summary_text(pairs), nl=False)
    if write:
        OUT.mkdir(parents=True, exist_ok=True)
        atomic_write(OUT / "predictions.csv", csv_text(pairs), force=True)
        atomic_write(OUT / "summary.md", summary_text(pairs), force=True)
        plot(pairs, OUT / "residuals.png")
        click.echo(f"wrote {OUT}/predictions.csv, summary.md, residuals.png")
    click.echo("")
    click.echo("TX8, one ideal block pair on one chip of tx8-16's ds_ulysses 2x8 plan (bound -> predicted):")
    tx8 = tx8_before_after_text()
    click.echo(tx8, nl=False)
    if write:
        atomic_write(OUT / "tx8_before_after.md", tx8, force=True)
        click.echo(f"wrote {OUT}/tx8_before_after.md")


if __name__ == "__main__":
    run_click(main)
