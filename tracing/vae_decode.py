"""``trace-vae-decode``: trace one call of OpenSora v1.2's VAE decode (the temporal decoder on one
chunk, or the spatial decoder on one micro-batch of frames) on one device and dump it like a stage.

A generation's time is its sampling loop plus this decode (OpenSora's published generation times
hold both: docs/gpu.md). The decode is ``chunks`` temporal calls and ``frames / micro_batch``
spatial calls (``models.opensora.vae_config.decode_plan``); the sidecar records those counts, and
``scripts/gpu_predictions.py`` multiplies each traced call's predicted time by them.

    trace-vae-decode --part temporal --shape 204_640_360 -o dumps/vae
    trace-vae-decode --part spatial --shape 204_640_360 -o dumps/vae
    analyze-hlo dumps/vae/vae_full_204_640_360_spatial.mlir --hw h100-sxm

Weights and inputs are placeholders (no data: only the program is kept), in bf16 as OpenSora runs
its VAE. The sidecar's ``library_calls`` mark the GroupNorms, linear layers and copies that
PyTorch runs as one kernel each (``--exec torch``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from hlo_trace.cli import OneLineCommand, native_imports
from hlo_trace.errors import UsageError
from models.opensora.library_calls import call_regions
from models.opensora.vae_config import check_traceable, decode_plan, get_vae_config

PARTS = ("temporal", "spatial")


def dump_name(config_name: str, shape: str, part: str) -> str:
    """The file name (no suffix) of one traced decode call."""
    return f"vae_{config_name}_{shape}_{part}"


def trace_vae_call(part: str, config_name: str, shape: str, out_dir: Path, *, dtype: str = "bfloat16",
                   dialect: str = "stablehlo", force: bool = False) -> tuple[list[Path], Any]:
    """Trace one ``part`` call of the decode of ``shape`` and write its dump and sidecar; returns
    the written paths and the capture session (end the process with ``capture.end_process``:
    XLA may still compile in the background). Starts torch-xla's runtime: one trace a process."""
    from tracing.cli import check_output, require_trace_extra, write_dump

    if part not in PARTS:
        raise UsageError(f"--part {part!r}: expected one of {', '.join(PARTS)}")
    try:
        config = get_vae_config(config_name)
        plan = decode_plan(shape, config)
        check_traceable(config, plan, part)
    except ValueError as error:
        raise UsageError(f"--shape {error}" if str(error).startswith(shape) else
                         f"--shape {shape}: {error}") from None
    name = dump_name(config_name, shape, part)
    mlir_path, json_path = out_dir / f"{name}.mlir", out_dir / f"{name}.json"
    check_output(out_dir, [mlir_path, json_path], force)
    require_trace_extra()

    with native_imports():  # torch and jaxlib: Ctrl-C while they load ends the process at once
        import torch

        from hlo_analyzer.mlir import hlo_text_to_mlir_text, load_native_libraries
        from models.opensora.vae import SpatialDecoder, TemporalDecoder
        from tracing import capture

        load_native_libraries()

    started = time.perf_counter()
    seconds: dict[str, float] = {}
    torch_dtype = getattr(torch, dtype)
    height, width = plan.latent_height, plan.latent_width
    if part == "temporal":
        module_type = TemporalDecoder
        input_shape = (1, config.latent_channels, config.micro_z_frames, height, width)
    else:
        module_type = SpatialDecoder
        input_shape = (config.micro_batch, config.latent_channels, height, width)
    session = capture.prepare_process(1)
    try:
        with native_imports():  # torch_xla's runtime
            capture.enable_spmd()
        from torch_xla.core.xla_builder import create_placeholder_tensor

        with torch.device("meta"):
            module = module_type(config).to(torch_dtype)
        for owner in module.modules():  # every weight a placeholder: the program, no data
            for registry in (owner._parameters, owner._buffers):
                for key, tensor in registry.items():
                    if tensor is not None:
                        registry[key] = create_placeholder_tensor(tuple(tensor.shape), torch_dtype)
        latent = create_placeholder_tensor(input_shape, torch_dtype)
        seconds["build"] = time.perf_counter() - started
        traced = time.perf_counter()
        with torch.no_grad():
            output = module(latent)
        seconds["trace"] = time.perf_counter() - traced
        compiled = time.perf_counter()
        hlo_text = capture.capture_partitioned_hlo(session, [output])
        seconds["compile"] = time.perf_counter() - compiled
    finally:
        capture.release(session)
    converted = time.perf_counter()
    mlir_text = hlo_text_to_mlir_text(hlo_text, dialect, origin=name)
    seconds["convert"] = time.perf_counter() - converted
    calls = plan.chunks if part == "temporal" else plan.spatial_call_equivalents
    sidecar = {
        "name": name,
        "program": f"one call of OpenSora v1.2's {part} VAE decoder, one device, unfused",
        "model": "opensora_vae_v1_2",
        "part": part,
        "vae_config": config_name,
        "shape": shape,
        "dialect": dialect,
        "dtype": dtype,
        "devices": 1,
        "inputs": {"latent": {"shape": list(input_shape), "dtype": dtype}},
        "outputs": {"video": {"shape": list(output.shape), "dtype": dtype}},
        "calls_per_sample": calls,
        "decode_plan": {"chunks": plan.chunks, "frames": plan.frames,
                        "spatial_calls": plan.spatial_calls, "micro_batch": plan.micro_batch,
                        "last_call_frames": plan.last_call_frames},
        "versions": capture.tool_versions(),
        "seconds": {step: round(value, 3) for step, value in seconds.items()},
        "seconds_total": round(time.perf_counter() - started, 3),
        "peak_rss_bytes": capture.peak_rss_bytes(),
        "library_calls": [region.to_dict() for region in call_regions()],
    }
    return write_dump(mlir_path, mlir_text, sidecar, force), session


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--part", type=click.Choice(PARTS), required=True,
              help="temporal: the temporal decoder on one chunk of 5 latent frames (17 frames out); "
                   "spatial: the SDXL VAE decoder on one micro-batch of 4 frames")
@click.option("--shape", required=True, help="video shape FRAMES_WIDTH_HEIGHT, e.g. 204_640_360")
@click.option("--config", "config_name", type=click.Choice(["full", "tiny"]), default="full",
              show_default=True, help="the released VAE's sizes, or a tiny one of the same structure")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16",
              show_default=True)
@click.option("--dialect", type=click.Choice(["stablehlo", "mhlo"]), default="stablehlo",
              show_default=True)
@click.option("-o", "--out-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("dumps/vae"), show_default=True)
@click.option("--force", is_flag=True, help="overwrite an existing dump")
def main(part: str, shape: str, config_name: str, dtype: str, dialect: str, out_dir: Path,
         force: bool) -> int:
    """Trace one call of OpenSora v1.2's VAE decode on one device and write it as MLIR with a
    JSON sidecar (OUT/vae_<config>_<shape>_<part>.mlir and .json): the temporal decoder on one
    chunk of 5 latent frames, or the spatial decoder on one micro-batch of 4 frames. The sidecar
    says how many such calls decode one sample of the shape."""
    from tracing import capture

    written, session = trace_vae_call(part, config_name, shape, out_dir, dtype=dtype,
                                      dialect=dialect, force=force)
    click.echo("wrote " + " ".join(str(path) for path in written), err=True)
    capture.end_process(session)
    return 0


if __name__ == "__main__":
    main()
