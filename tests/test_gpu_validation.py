"""Validation, guarded (issue 31): the predicted loops and generations of OpenSora v1.2 on one GPU
against what was measured and published, within the stated tolerances.

Fast, no trace: the kernels of one step (the embeddings and one block pair) and of one call of
each VAE decoder at every shape are committed kernel lists (``results/gpu_validation/kernels``,
written by ``python3 scripts/gpu_predictions.py --write-kernels results/gpu_validation/kernels``
from the one-pair traces), costed here with the GPU descriptions' constants as they are now
(``hlo_analyzer.mapping.kernel_list.cost``: the mapping ``analyze-hlo --hw`` uses), so a change of a
constant changes every prediction below. These figures are validation only: no constant of a
GPU description is fitted to them (docs/gpu.md).

* the 30-step loop on ``h100-sxm`` against the loop measured on one H100 SXM, and the generation
  (loop + VAE decode) against the measured loop + decode: within 10%;
* the loop on ``h200-sxm`` against 30 forwards measured on one H200 (1774 ms at 204_640_360):
  within 10%;
* the generation on ``h100-sxm`` against every video point of OpenSora v1.2's published H100
  table (``results/gpu_validation/published_opensora_v12_h100.csv``): within 10%;
* the generation's peak device memory (the CUDA context plus the caching allocator's peak reserve,
  ``models.cuda_runtime`` replaying the eager allocation sequence committed in
  ``results/gpu_validation/allocations_generation_2_steps.json.gz``) against the same table's peak
  memory, the README's "G" read as GiB: within 15%;
* that replay against the run it models, one whole generation at each shape on one H100
  (``benchmarks/gpu_generation.py``: the weights the demo holds, two steps, the decode, the save;
  ``results/gpu_validation/generation_NVIDIA_H100_80GB_HBM3.json``), the peak reserve and the
  peak tensors: within 10%;
* the tensor count (``models.opensora.memory.generation_peak``) against the same run's peak
  tensors: within 15%.

A point the model misses with today's constants is marked ``xfail(strict=True)`` with its ratio:
it is reported, not tuned away, and the mark fails as soon as the point passes.
"""

from __future__ import annotations

from functools import cache

import pytest

from models.opensora.memory import GIB, generation_peak
from scripts.gpu_predictions import (
    ALLOCATION_SHAPES,
    ALLOCATION_STEPS,
    CUDA_CONTEXT_BYTES,
    DEFAULT_KERNELS,
    MEASURED_H100_SXM_DECODE_S,
    MEASURED_H100_SXM_LOOP_S,
    MEASURED_H200_FORWARD_S,
    PUBLISHED_CARD,
    STEPS,
    DeviceMemory,
    Generation,
    PublishedPoint,
    load_device_memory,
    load_kernels,
    measured_generations,
    predict,
    published_points,
    spatial_call_peak,
)

TIME_TOLERANCE = 0.10
MEMORY_TOLERANCE = 0.15

#: Points outside their tolerance with the constants of commit 138f5e7 (predicted / published).
#: Measured on one H100 SXM (results/gpu_validation/NVIDIA_H100_80GB_HBM3_2s.md and
#: generation_30_steps_*.json), the 2 s generations are 16.0 s and 27.4 s of GPU work (loop + decode):
#: the model predicts them at 0.92 and 0.95 (test below), and they are 0.89 and 0.94 of the published
#: figures, which also hold what no GPU kernel does (saving the mp4, the demo's ffmpeg watermark, the host).
TIME_MISSES = {
    "51_640_360": "0.82 of the published 18 s (14.8 s predicted): 0.92 of the 16.0 s measured on an H100, "
                  "which is 0.89 of the published figure (the rest is host work no kernel model holds)",
    "51_854_480": "0.89 of the published 29 s (25.9 s predicted): 0.95 of the 27.4 s measured on an H100, "
                  "which is 0.94 of the published figure",
}
#: The one published peak the device-memory prediction misses (predicted / published).
MEMORY_MISSES = {
    "408_854_480": "1.18 of the published 36 G (42.4 GiB): the H100 run it replays held 37.2 GiB of tensors "
                   "and reserved 41.9 GiB there (1.18 of the published figure as well), so the published "
                   "generation allocated less than the project's model of the official path (docs/gpu.md)",
}
#: The replay's tolerance against the run it models: the run's memory that ``meta`` cannot show (cuDNN's
#: and cuBLAS's workspaces) is not in the recorded sequence.
REPLAY_TOLERANCE = 0.10
#: Points where the count misses the tensors measured on the H100 (count / measured).
MEASURED_MEMORY_MISSES = {
    "408_1280_720": "0.83 of the 57.9 GiB measured: the run's peak is in the temporal RoPE's float32 "
                    "temporaries (models/opensora/stdit3.py), which the count does not hold (docs/gpu.md)",
}


@cache
def _generation(shape: str, hardware: str) -> Generation:
    loop, vae = load_kernels(DEFAULT_KERNELS, shape)
    return predict(loop, vae, shape, hardware)


def _points(misses: dict[str, str]) -> list:
    return [pytest.param(point, id=point.shape,
                         marks=[pytest.mark.xfail(strict=True, reason=misses[point.shape])]
                         if point.shape in misses else [])
            for point in published_points()]


def test_the_published_table_has_twelve_video_points():
    points = published_points()
    assert len(points) == 12 and len({p.shape for p in points}) == 12
    assert {(p.shape, p.seconds, p.memory_g) for p in points} >= {
        ("204_640_360", 62, 28), ("408_640_360", 121, 33), ("51_1280_720", 68, 41), ("102_1280_720", 130, 39),
        ("102_854_480", 55, 30), ("408_1280_720", 547, 67)}


@pytest.mark.parametrize("point", _points(TIME_MISSES))
def test_generation_time_against_the_published_table(point: PublishedPoint):
    ratio = _generation(point.shape, PUBLISHED_CARD).seconds / point.seconds
    assert abs(ratio - 1) <= TIME_TOLERANCE, f"{point.shape}: {ratio:.3f} of the published {point.seconds} s"


@cache
def _device_memory() -> dict[str, DeviceMemory]:
    return load_device_memory()


@pytest.mark.parametrize("point", _points(MEMORY_MISSES))
def test_peak_device_memory_against_the_published_table(point: PublishedPoint):
    ratio = _device_memory()[point.shape].device / GIB / point.memory_g
    assert abs(ratio - 1) <= MEMORY_TOLERANCE, f"{point.shape}: {ratio:.3f} of the published {point.memory_g} G"


def _measured_generations() -> dict[str, dict]:
    return {g["shape"]: g for g in measured_generations()}


def test_the_replayed_session_is_the_measured_one():
    """The committed sequence is the measured run's: its shapes in its order, at its step count."""
    generations = measured_generations()
    assert tuple(g["shape"] for g in generations) == ALLOCATION_SHAPES
    assert {g["steps"] for g in generations} == {ALLOCATION_STEPS}


@pytest.mark.parametrize("shape", ALLOCATION_SHAPES)
def test_replayed_reserve_and_tensors_against_the_h100_run(shape: str):
    measured, replayed = _measured_generations()[shape], _device_memory()[shape]
    reserve = replayed.reserved / max(p["peak_reserved"] for p in measured["phases"])
    tensors = replayed.tensors / max(p["peak_allocated"] for p in measured["phases"])
    assert abs(reserve - 1) <= REPLAY_TOLERANCE, f"reserve: {reserve:.3f} of the measured one"
    assert abs(tensors - 1) <= REPLAY_TOLERANCE, f"tensors: {tensors:.3f} of the measured ones"
    # the context is the measured one (CUDA_CONTEXT_BYTES names its source)
    assert measured["context_bytes"] == CUDA_CONTEXT_BYTES


@pytest.mark.parametrize("shape", sorted(MEASURED_H100_SXM_LOOP_S))
def test_loop_and_generation_against_the_measured_h100(shape: str):
    generation = _generation(shape, "h100-sxm")
    loop = generation.loop_s / MEASURED_H100_SXM_LOOP_S[shape]
    whole = generation.seconds / (MEASURED_H100_SXM_LOOP_S[shape] + MEASURED_H100_SXM_DECODE_S[shape])
    assert abs(loop - 1) <= TIME_TOLERANCE, f"loop: {loop:.3f} of the measured one"
    assert abs(whole - 1) <= TIME_TOLERANCE, f"generation: {whole:.3f} of the measured one"


@pytest.mark.parametrize("shape", sorted(MEASURED_H200_FORWARD_S))
def test_loop_against_the_measured_h200(shape: str):
    ratio = _generation(shape, "h200-sxm").loop_s / (STEPS * MEASURED_H200_FORWARD_S[shape])
    assert abs(ratio - 1) <= TIME_TOLERANCE, f"{ratio:.3f} of {STEPS} measured forwards"


def _measured_peaks() -> dict[str, int]:
    return {shape: max(p["peak_allocated"] for p in g["phases"]) for shape, g in _measured_generations().items()}


def test_the_measured_generations_cover_the_published_shapes():
    assert set(_measured_peaks()) == {p.shape for p in published_points()}


@pytest.mark.parametrize("shape", [
    pytest.param(p.shape, id=p.shape, marks=[pytest.mark.xfail(strict=True, reason=MEASURED_MEMORY_MISSES[p.shape])]
                 if p.shape in MEASURED_MEMORY_MISSES else []) for p in published_points()])
def test_peak_memory_against_the_tensors_measured_on_an_h100(shape: str):
    _, vae = load_kernels(DEFAULT_KERNELS, shape)
    ratio = generation_peak(shape, spatial_call_peak(vae)).total_bytes / _measured_peaks()[shape]
    assert abs(ratio - 1) <= MEMORY_TOLERANCE, f"{shape}: {ratio:.3f} of the measured peak"


def test_write_allocations_refuses_an_existing_file_before_recording(tmp_path, capsys):
    from hlo_trace.cli import run_click
    from scripts.gpu_predictions import main

    target = tmp_path / "allocations.json.gz"
    target.write_text("kept")
    assert run_click(main, ["--from-kernels", str(DEFAULT_KERNELS), "--write-allocations", str(target)]) == 2
    assert capsys.readouterr().err.startswith(f"Error: {target}: already exists")
    assert target.read_text() == "kept"


def test_the_memory_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from hlo_trace.cli import run_click
    from scripts.gpu_predictions import main

    target = tmp_path / "memory.png"
    assert run_click(main, ["--from-kernels", str(DEFAULT_KERNELS), "--shapes", "51_640_360,408_854_480",
                            "--plot", str(target)]) == 0
    assert target.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("name, options", [("predictions.md", []),
                                           ("predictions_h200.md", ["--hw", "h200-sxm", "--shapes", "204_640_360"])])
def test_the_committed_predictions_are_what_the_script_prints_now(name, options, capsys):
    """docs/gpu.md quotes these files (scripts/docs_figures.py): a change of a constant or of the
    mapping that moves a prediction must write them again (the command is in each file's header)."""
    from hlo_trace.cli import run_click
    from scripts.gpu_predictions import main

    assert run_click(main, ["--from-kernels", str(DEFAULT_KERNELS), *options]) == 0
    committed = (DEFAULT_KERNELS.parent / name).read_text()
    assert " ".join(["--from-kernels results/gpu_validation/kernels", *options]) in committed.splitlines()[2]
    assert committed.endswith(capsys.readouterr().out)
