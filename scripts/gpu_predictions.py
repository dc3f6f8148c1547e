"""Predicted vs published: OpenSora v1.2 on one GPU, the 30-step STDiT3 loop at four video shapes.

For each shape it traces (or reuses) one device's stage 0 of the split ``0-0,1-27`` (the
embeddings and one block pair; the split-independence invariant makes one pair x 28 the whole
model: results/split.md), analyzes it with ``--pairs 28`` on each GPU description in the execution
mode the tool picks for a traced PyTorch model on a GPU (``torch``: one kernel per library call),
adds the VAE decode (each decoder's traced call, ``trace-vae-decode``, times the calls one sample
takes), and prints the generation's predicted time beside the one measured on an H100 SXM by this
project (results/gpu_validation: loop + decode) and the figure OpenSora's README publishes for a
whole generation on one "80G H100" (text encoder + 30 steps + VAE decode; docs/sources.md), and
the kernels of one step at the first shape by class, with each class's first-principles bound.

    python3 scripts/gpu_predictions.py [--out DIR] [--hw h100-sxm,h100-pcie,...] [--shapes ...]

Full-size traces take 5-20 s and up to 5 GiB each; the dumps are kept in DIR (default
results/.cache/gpu) and reused. Output: markdown on stdout (docs/gpu.md quotes it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import click

#: OpenSora v1.2 README (hpcaitech/Open-Sora at v1.2.0, "Gradio Demo" section): generation time
#: on one 80 GB H100, 30 sampling steps; 51 frames are "2s", 102 "4s", 204 "8s", 408 "16s".
PUBLISHED_H100_S = {"204_640_360": 62.0, "408_640_360": 121.0, "51_1280_720": 68.0, "102_1280_720": 130.0}
#: Measured by this project on one H100 SXM5 80GB (results/gpu_validation/NVIDIA_H100_80GB_HBM3.md,
#: "loop (s)": 30 whole STDiT3 forwards of the official path, FlashAttention-2, bf16, B = 2).
MEASURED_H100_SXM_LOOP_S = {"204_640_360": 57.73, "408_640_360": 116.41, "51_1280_720": 61.31, "102_1280_720": 121.10}
#: The same card's VAE decode of one generation, temporal + spatial decoder
#: (results/gpu_validation/vae_decode_NVIDIA_H100_80GB_HBM3.md: benchmarks/gpu_vae_decode.py).
MEASURED_H100_SXM_DECODE_S = {"204_640_360": 3.419, "408_640_360": 6.874, "51_1280_720": 4.032, "102_1280_720": 8.068}
PAIRS = 28
SPLIT = "0-0,1-27"


def _dump(out: Path, shape: str) -> Path:
    dump = out / f"full_{shape}_none_1x1_stage0_pairs0-0.mlir"
    if not dump.exists():
        click.echo(f"tracing {shape} (one device, stage 0 of {SPLIT})", err=True)
        subprocess.run([sys.executable, "-m", "tracing.cli", "--config", "full", "--shape", shape,
                        "--strategy", "none", "--mesh", "1x1", "--stage", "0", "--stage-ids", SPLIT,
                        "-o", str(out)], check=True, cwd=REPO_ROOT)
    return dump


def _mapping(dump: Path, hardware: str, pairs: int | None = PAIRS) -> dict:
    command = [sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", hardware, "--format", "json"]
    if pairs is not None:
        command += ["--pairs", str(pairs)]
    result = subprocess.run(command, check=True, cwd=REPO_ROOT, capture_output=True, text=True)
    return json.loads(result.stdout)["mapping"]


def _decode_seconds(out: Path, shape: str, hardware: str) -> float:
    """The predicted VAE decode of one sample: each decoder's traced call (``trace-vae-decode``,
    reused from ``out``) times the calls one sample takes (its sidecar's ``calls_per_sample``)."""
    total = 0.0
    for part in ("temporal", "spatial"):
        dump = out / f"vae_full_{shape}_{part}.mlir"
        if not dump.exists():
            click.echo(f"tracing the {part} VAE decoder for {shape}", err=True)
            subprocess.run([sys.executable, "-m", "tracing.vae_decode", "--part", part, "--shape", shape,
                            "-o", str(out)], check=True, cwd=REPO_ROOT)
        calls = json.loads(dump.with_suffix(".json").read_text())["calls_per_sample"]
        total += calls * _mapping(dump, hardware, pairs=None)["totals"]["inference_latency_s"]
    return total


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=REPO_ROOT / "results" / ".cache" / "gpu", show_default=True,
              help="Where the one-pair dumps are kept and reused.")
@click.option("--hw", "hardware", default="h100-sxm,h100-pcie,a100-sxm,a100-sxm-40gb", show_default=True,
              help="Comma-separated GPU descriptions.")
@click.option("--shapes", default=",".join(PUBLISHED_H100_S), show_default=True,
              help="Comma-separated video shapes.")
def main(out: Path, hardware: str, shapes: str) -> None:
    """Print the predicted-vs-published table and the kernel classes at the first shape."""
    out.mkdir(parents=True, exist_ok=True)
    gpus = [h for h in hardware.split(",") if h]
    shape_list = [s for s in shapes.split(",") if s]
    mappings = {(s, h): _mapping(_dump(out, s), h) for s in shape_list for h in gpus}
    decodes = {(s, h): _decode_seconds(out, s, h) for s in shape_list for h in gpus}
    click.echo("| shape | published, one 80G H100 (whole generation) | measured here, H100 SXM: loop + "
               "VAE decode = generation | " + " | ".join(f"{h}: loop + decode = generation (/ measured, / published)"
                                                         for h in gpus) + " |")
    click.echo("|---|---|---|" + "---|" * len(gpus))
    for shape in shape_list:
        published = PUBLISHED_H100_S.get(shape)
        measured = MEASURED_H100_SXM_LOOP_S.get(shape)
        decode = MEASURED_H100_SXM_DECODE_S.get(shape)
        whole = measured + decode if measured and decode else None
        cells = []
        for h in gpus:
            loop = mappings[shape, h]["totals"]["inference_latency_s"]
            seconds = loop + decodes[shape, h]
            ratios = [f"{seconds / reference:.2f}x" for reference in (whole, published) if reference]
            cells.append(f"{loop:.1f} + {decodes[shape, h]:.2f} = {seconds:.1f} s"
                         + (f" ({', '.join(ratios)})" if ratios else ""))
        here = f"{measured:.1f} + {decode:.2f} = {whole:.1f} s" if whole else "-"
        click.echo(f"| {shape} | {f'{published} s' if published else '-'} | {here} | " + " | ".join(cells) + " |")
    first = mappings[shape_list[0], gpus[0]]
    click.echo(f"\nKernels of one step of the traced program (embeddings + one pair) at {shape_list[0]} "
               f"on {gpus[0]}, execution {first['execution']}:\n")
    click.echo("| class | kernels | time | first-principles bound | time / bound |")
    click.echo("|---|---|---|---|---|")
    for entry in first["classes"]:
        click.echo(f"| {entry['class']} | {entry['kernels']} | {entry['seconds'] * 1e3:.3f} ms | "
                   f"{entry['bound_seconds'] * 1e3:.3f} ms | {entry['ratio']:.2f} |")


if __name__ == "__main__":
    main()
