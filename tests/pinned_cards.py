"""GPU descriptions whose kernel-model constants tests pin, so that they can derive numbers by hand
(the bundled hardware/data files move with their calibration data: scripts/calibrate_gpu.py)."""

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
#: h100-sxm and a100-sxm with the constants of 2026-11-25 (docstrings of the tests quote them).
PINNED_H100 = str(DATA / "h100-sxm-pinned.toml")
PINNED_A100 = str(DATA / "a100-sxm-pinned.toml")


def tx8_bound_toml() -> str:
    """tx8.toml without its [tiled_model] tables: its GEMMs go to the tile mappers' search (the
    bound), whose numbers tests derive by hand (the tiled model's are derived in
    tests/test_tiled_model.py)."""
    text = (DATA.parent.parent / "hardware" / "data" / "tx8.toml").read_text(encoding="utf-8")
    return text[:text.index("\n[tiled_model]")] + "\n"
