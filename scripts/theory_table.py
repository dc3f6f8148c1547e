"""Print the analytic cost table of OpenSora STDiT3 for the reference video shapes.

For each shape: the token geometry (T, S, N), the full-model GEMM TFLOPs of one forward pass
(embeddings + all block pairs + final layer, from `models.opensora.flops`), the GEMM TFLOPs of one
block pair, and the communication volume per device of one block pair under each parallel
strategy on `--devices` devices: first the layout each strategy traces (on the study's mesh),
then, labelled "notes:", the reference notes' formulas (from `models.opensora.theory`). Output is
a markdown table.

Run:  python3 scripts/theory_table.py [--devices 16] [--config full] [--shape 204_640_360 ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click

from hlo_trace.errors import UsageError
from models.opensora.config import get_config
from models.opensora.flops import gemm_flops
from models.opensora.inputs import REFERENCE_SHAPES, geometry
from models.opensora.parallel import STRATEGY_NAMES, default_mesh
from models.opensora.theory import (
    NOTE_STRATEGIES,
    BlockDims,
    DeviceCountError,
    layout_bytes_by_kind,
    layout_switch_per_device,
    note_communication_per_device,
)

#: The layouts of the table: every strategy but the one-device baseline.
LAYOUT_STRATEGIES = tuple(s for s in STRATEGY_NAMES if s != "none")

UNITS = {"GB": 1e9, "MB": 1e6, "GiB": 2**30, "MiB": 2**20}


def strategy_header(strategy: str, devices: int) -> str:
    x_devices, y_devices = default_mesh(strategy, devices)
    return f"{strategy} ({x_devices}x{y_devices})"


def layout_volume(strategy: str, dims: BlockDims, devices: int) -> float | None:
    """Bytes per device per block pair of the traced layout; None where it cannot run (dp with
    a batch the devices do not divide, opensora_sp with S the devices do not divide)."""
    if strategy == "dp" and dims.batch % devices:
        return None
    try:
        return sum(layout_bytes_by_kind(strategy, dims, default_mesh(strategy, devices)).values())
    except DeviceCountError:
        return None


def build_table(config_name: str, shapes: list[str], devices: int, batch: int,
                bytes_per_element: int, unit: str, scope: str) -> str:
    """The markdown table as one string (each row a shape)."""
    config = get_config(config_name)
    scale = UNITS[unit]
    pairs = config.depth if scope == "backbone" else 1
    headers = ["shape", "T", "S", "N", "model GEMM TFLOPs", "block GEMM TFLOPs"]
    headers += [f"{strategy_header(s, devices)} [{unit}]" for s in LAYOUT_STRATEGIES]
    headers += [f"notes: {s} [{unit}]" for s in NOTE_STRATEGIES]
    headers.append(f"S<->T all-to-all [{unit}]")
    rows = []
    for shape in shapes:
        geo = geometry(config, shape)
        counts = gemm_flops(config, shape, batch=batch)
        dims = BlockDims.of(config, geo.T, geo.S, batch, bytes_per_element)
        row = [shape, str(geo.T), str(geo.S), str(geo.N),
               f"{counts['forward']['total'] / 1e12:.2f}",
               f"{counts['per_block']['total'] / 1e12:.3f}"]
        for strategy in LAYOUT_STRATEGIES:
            volume = layout_volume(strategy, dims, devices)
            row.append("n/a" if volume is None else f"{volume * pairs / scale:.3f}")
        for strategy in NOTE_STRATEGIES:
            try:
                volume = note_communication_per_device(strategy, dims, devices)
                row.append(f"{volume * pairs / scale:.3f}")
            except DeviceCountError:
                row.append("n/a")  # e.g. dp cannot split B=2 over 16 devices
        row.append(f"{layout_switch_per_device(dims, devices) * pairs / scale:.3f}")
        rows.append(row)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--devices", "-n", default=16, show_default=True, type=int,
              help="Devices the block is split over. two_dimension and usp use a 2 x n/2 mesh "
                   "(two_dimension: batch on X, hidden on Y; usp: ring on X, Ulysses on Y).")
@click.option("--config", "config_name", default="full", show_default=True,
              help="Model config: full, tiny, or a TOML file with STDiT3Config fields.")
@click.option("--shape", "shapes", multiple=True, metavar="F_W_H",
              help="Video shape FRAMES_WIDTH_HEIGHT; repeat for several. "
                   f"Default: the four reference shapes {', '.join(REFERENCE_SHAPES)}.")
@click.option("--batch", "-b", default=2, show_default=True, type=int,
              help="Batch B (2 = classifier-free guidance).")
@click.option("--bytes-per-element", default=2, show_default=True, type=int,
              help="Bytes per activation element (2 for bf16).")
@click.option("--unit", type=click.Choice(sorted(UNITS)), default="GB", show_default=True,
              help="Unit of the communication columns (GB = 1e9 bytes).")
@click.option("--scope", type=click.Choice(["block", "backbone"]), default="block",
              show_default=True,
              help="Communication of one block pair, or of all `depth` pairs of the backbone.")
def main(devices: int, config_name: str, shapes: tuple[str, ...], batch: int,
         bytes_per_element: int, unit: str, scope: str) -> None:
    """Analytic GEMM TFLOPs and per-strategy communication of OpenSora STDiT3.

    Columns: T, S, N (tokens); the GEMM TFLOPs of one whole forward pass and of one block pair
    (spatial + temporal block); then the bytes each device sends per block pair (or per backbone
    with --scope backbone) under megatron, two_dimension, ds_ulysses, ring_attention, usp and dp
    (n/a where the strategy cannot use that many devices), and the extra all-to-all that moves a
    sequence split between the spatial and temporal layouts (for sequence-parallel strategies).
    Formulas and their derivations: models/opensora/theory.py and docs/model.md.
    """
    try:
        click.echo(build_table(config_name, list(shapes) or list(REFERENCE_SHAPES), devices,
                               batch, bytes_per_element, unit, scope))
    except UsageError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
