"""The sizing runs of ``results/sizing/`` (``plan-search --target-latency ... --json``) as one
table: per shape and system, the target, the answer and the traced confirmations.

    python3 scripts/sizing_summary.py            # -> results/sizing/summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from hlo_trace.atomic import atomic_write  # noqa: E402


def row(name: str, document: dict) -> str:
    system = "8x8xh100" if name.endswith("8x8xh100") else "tx8-64"
    shape = name[: -len(system) - 1]
    traces = document.get("traces", [])
    tried = "; ".join(f"{t['devices']}: est {t['estimate_s']:.3g} s, traced "
                      + (f"{t['traced_s']:.4g} s" if t["traced_s"] is not None else f"failed ({t['error']})")
                      for t in traces)
    answer = document["answer"]
    if answer is None or document.get("confirmed") is not True:
        result = "none met within the traces"
    else:
        traced = next(t for t in traces if t["devices"] == answer["devices"])
        result = f"**{answer['devices']}** ({answer['best_label']}): traced {traced['traced_s']:.4g} s"
    missed = document.get("missed_below")
    below = ("-" if missed is None else f"{missed['devices']}: traced "
             + (f"{missed['traced_s']:.4g} s" if missed["traced_s"] is not None else f"failed ({missed['error']})"))
    return f"| {shape} | {system} | {ranking(document)} | {document['target_s']:.4g} | {result} | {below} | {tried} |"


def ranking(document: dict) -> str:
    """Which estimate ranked the counts: runs with the traced-kernel estimate trace the answer's
    smaller neighbour (``missed_below`` in their JSON); older runs ranked with the ideal estimate."""
    return "kernel" if "missed_below" in document else "ideal (old run)"


@click.command()
@click.option("--dir", "directory", default=str(REPO_ROOT / "results" / "sizing"), show_default=True)
def main(directory: str) -> None:
    """Write summary.md from the sizing runs' JSON files."""
    folder = Path(directory)
    lines = ["# Sizing: the smallest device count whose best plan meets the target (traced)", "",
             "Each row: `plan-search --shape SHAPE --target-latency T --max-devices 64 --hw SYSTEM` "
             "(full config, 30 steps); T is the traced best latency of the one-node search in "
             "`results/plan_search/` (8xh100, tx8-16). Traced confirmations in the order they ran "
             "(devices: estimate, traced); the answer is the first traced plan that meets the target. "
             "Ranked: the estimate that ranked the device counts (kernel: the traced-kernel estimate, "
             "`--estimate kernels`, which also traces the answer's next smaller count: column below; "
             "ideal: an older run with the ideal estimate, to be regenerated). "
             "Regenerate: the commands above with `--json` and `--plot` here, then "
             "`python3 scripts/sizing_summary.py`.", "",
             "| shape | system | ranked | target s | answer (traced) | smaller neighbour | confirmations |",
             "|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        lines.append(row(path.stem, json.loads(path.read_text())))
    atomic_write(folder / "summary.md", "\n".join(lines) + "\n", force=True)
    click.echo(f"wrote {folder / 'summary.md'}")


if __name__ == "__main__":
    main()
