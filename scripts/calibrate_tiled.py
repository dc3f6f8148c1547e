"""Fit the [tiled_model] constants no datasheet gives on the vendor's n150 GEMM table only.

    python3 scripts/calibrate_tiled.py            # print the fitted block
    python3 scripts/calibrate_tiled.py --write    # rewrite it in hardware/data/n150.toml and p150.toml
    python3 scripts/calibrate_tiled.py --check    # exit 1 when a file differs from what the data give

The data: ``hardware/data/public/tt_gemm_oob.csv`` (tt-metal's "Matrix Multiply FLOPS" report,
out-of-box table; source and commit in its header). Only its n150 rows are fitted (every dtype,
with and without trace); p150 receives n150's values unchanged and is never fitted (its rows are
checked by scripts/tiled_predictions.py). The fitted block of each file lies between the lines
:data:`BEGIN` and :data:`END`; the rest of the file is its own. ``tests/test_tiled_model.py`` runs
``--check``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hardware import load_chip  # noqa: E402
from hardware.spec import DATA_DIR  # noqa: E402
from hardware.tiled_calibration import (  # noqa: E402
    FITTED,
    SCALARS,
    UNPACK_CARRIED,
    UNPACK_DTYPES,
    fit_tiled,
    load_published_gemms,
)
from hlo_trace.atomic import atomic_write  # noqa: E402
from hlo_trace.cli import run_click  # noqa: E402

BEGIN = "# -- fitted by scripts/calibrate_tiled.py (do not edit by hand) --\n"
END = "# -- end fitted --\n"
FITTING_CARD = "n150"
CARDS = ("n150", "p150")
#: How each fitted scalar is written: TOML key, unit scale, unit suffix.
KEYS = {
    "tile_overhead_cycles": ("tile_overhead_cycles", 1.0, ""),
    "partial_reload_cycles": ("partial_reload_cycles", 1.0, ""),
    "sender_read_efficiency": ("sender_read_efficiency", 1.0, ""),
    "dispatch_trace_s": ("dispatch_trace", 1e6, " us"),
    "dispatch_s": ("dispatch", 1e6, " us"),
}


def _number(value: float) -> str:
    return repr(float(f"{value:.3g}"))


def render_block(values: list[float]) -> str:
    measured = dict(zip(UNPACK_DTYPES, values, strict=False))
    measured.update({d: measured[source] for d, source in UNPACK_CARRIED.items()})
    rates = ", ".join(f"{d} = {_number(v)}" for d, v in measured.items())
    lines = [f"unpack_bytes_per_noc_byte = {{ {rates} }}\n"]
    for name, value in zip(SCALARS, values[len(UNPACK_DTYPES):], strict=True):
        key, scale, unit = KEYS[name]
        lines.append(f'{key} = "{value * scale:.3g}{unit}"\n' if unit else f"{key} = {_number(value)}\n")
    return BEGIN + "".join(lines) + END


def _replaced(text: str, block: str, path: Path) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise click.ClickException(f"{path}: no fitted block (lines {BEGIN.strip()!r} ... {END.strip()!r})")
    return text[:start] + block + text[end + len(END):]


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--write", is_flag=True, help="rewrite the fitted block of n150.toml and p150.toml")
@click.option("--check", is_flag=True, help="exit 1 when a file differs from what the data give")
def main(write: bool, check: bool) -> None:
    rows = [r for r in load_published_gemms() if r.card == FITTING_CARD]
    click.echo(f"fitting {len(FITTED)} constants on {len(rows)} {FITTING_CARD} rows ...", err=True)
    block = render_block(fit_tiled(load_chip(FITTING_CARD), rows))
    stale = []
    for card in CARDS:
        path = DATA_DIR / f"{card}.toml"
        text = path.read_text(encoding="utf-8")
        new = _replaced(text, block, path)
        if new != text:
            stale.append(path)
            if write:
                atomic_write(path, new, force=True)
    if not check:
        click.echo(block, nl=False)
    if write:
        click.echo(f"wrote {len(stale)} file(s): {', '.join(p.name for p in stale) or 'none changed'}")
    elif check:
        if stale:
            click.echo(f"stale: {', '.join(p.name for p in stale)} differ from scripts/calibrate_tiled.py's output "
                       "(run it with --write)", err=True)
            sys.exit(1)
        click.echo(f"ok: {', '.join(CARDS)} equal the fit on the {FITTING_CARD} table")


if __name__ == "__main__":
    run_click(main)
