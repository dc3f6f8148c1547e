"""GPU descriptions whose kernel-model constants tests pin, so that they can derive numbers by hand
(the bundled hardware/data files move with their calibration data: scripts/calibrate_gpu.py)."""

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
#: h100-sxm and a100-sxm with the constants of 2026-11-25 (docstrings of the tests quote them).
PINNED_H100 = str(DATA / "h100-sxm-pinned.toml")
PINNED_A100 = str(DATA / "a100-sxm-pinned.toml")
