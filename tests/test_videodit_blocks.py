"""Full size by blocks (models.zoo.videodit.configs, scripts/videodit.py): a whole model equals
its parts (one block of each kind, and one more of each kind) scaled by its layer counts. Checked
at a reduced shape that traces whole in seconds: the tiny width, a few layers of each kind, 64
video tokens, under Ulysses on 4 devices, so the collectives are scaled too. Traced GEMM and
total FLOPs, collective bytes and counts by kind, weights, the predicted step on 8xh100 and the
peak of live activations with flash attention: whole / scaled within 0.5%.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

from models.zoo.videodit.configs import part_kwargs, parts, peak, scaled  # noqa: E402
from planning.module_models import Layout  # noqa: E402
from scripts.videodit import report, step_seconds, trace, trace_command, traced  # noqa: E402

WHOLE = "whole"
TOLERANCE = 0.005
LAYOUT = Layout("ulysses", 4)
HW = "8xh100"

#: model -> (factory, layer counts of the reduced model, inputs of the tiny configuration)
REDUCED = {
    "wan21": ("models.zoo.videodit.wan21:wan21", {"layers": 3},
              ["latents=2x4x4x8x8:float32", "t=2:float32", "text=2x8x32:float32"]),
    "hunyuan_video": ("models.zoo.videodit.hunyuan_video:hunyuan_video",
                      {"double_layers": 2, "single_layers": 3},
                      ["latents=1x4x4x8x8:float32", "t=1:float32", "text=1x8x32:float32",
                       "pooled=1x16:float32", "guidance=1:float32"]),
    "cogvideox": ("models.zoo.videodit.cogvideox:cogvideox", {"layers": 3},
                  ["latents=2x4x4x8x8:float32", "t=2:float32", "text=2x8x32:float32"]),
}


def _measure(tmp_path, model: str, name: str, kwargs: dict):
    factory, _, inputs = REDUCED[model]
    command = trace_command(factory, kwargs, inputs, LAYOUT, model, name, tmp_path, "float32")
    dump = trace(command, tmp_path / f"{name}.mlir", full_size=False)
    document = report(dump, HW)
    return step_seconds(document), traced(document)


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.parametrize("model", REDUCED)
def test_the_whole_model_is_its_parts_scaled(tmp_path, model):
    _, counts, _ = REDUCED[model]
    blocks = tuple(counts)
    seconds, measured = {}, {}
    for part in parts(blocks):
        seconds[part], measured[part] = _measure(tmp_path, model, part, part_kwargs(counts, blocks, part))
    whole_seconds, whole = _measure(tmp_path, model, WHOLE, counts)

    def figure(get):
        return scaled({part: float(get(t)) for part, t in measured.items()}, counts)

    assert whole.gemm_flops == pytest.approx(figure(lambda t: t.gemm_flops), rel=TOLERANCE)
    assert whole.total_flops == pytest.approx(figure(lambda t: t.total_flops), rel=TOLERANCE)
    assert whole.weight_bytes == pytest.approx(figure(lambda t: t.weight_bytes), rel=TOLERANCE)
    assert set(whole.comm_bytes) == {"all_to_all"} | ({"all_reduce"} if model == "wan21" else set())
    for kind, sent in whole.comm_bytes.items():
        assert sent == pytest.approx(figure(lambda t: t.comm_bytes.get(kind, 0)), rel=TOLERANCE)
        assert whole.comm_counts[kind] == pytest.approx(figure(lambda t: t.comm_counts.get(kind, 0)),
                                                        rel=TOLERANCE)
    assert whole_seconds == pytest.approx(scaled(seconds, counts), rel=TOLERANCE)
    assert whole.peak_live_bytes == pytest.approx(peak({p: t.peak_live_bytes for p, t in measured.items()}),
                                                  rel=TOLERANCE)
