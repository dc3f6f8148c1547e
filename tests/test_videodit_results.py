"""results/videodit/latency.csv (scripts/videodit.py) holds the rows the video DiTs' issue asks
for, with its fixed columns, and its page says which rows do not fit; torch-free (no tracing)."""

from __future__ import annotations

from pathlib import Path

from hardware.systems import resolve_system
from models.zoo.videodit.companions import COMPANIONS
from models.zoo.videodit.configs import HUNYUAN_VIDEO
from planning.module_models import SINGLE, DeviceMemory, Layout
from scripts.videodit import (
    COLUMNS,
    GB,
    Case,
    Prediction,
    csv_text,
    page,
    read_rows,
)

RESULTS = Path(__file__).resolve().parent.parent / "results" / "videodit"
REQUIRED_COLUMNS = ("model, frames, height, width, steps, hw, devices, strategy, degrees, loop_s, "
                    "decode_s, memory_gb").split(", ")


def _rows():
    return read_rows(RESULTS / "latency.csv")


def _devices(rows, model, shape, hw, strategies):
    return sorted(int(r["devices"]) for r in rows
                  if r["model"] == model and (r["frames"], r["height"], r["width"]) == shape
                  and r["hw"] == hw and r["strategy"] in strategies)


def test_the_columns_are_the_issues():
    assert list(COLUMNS) == REQUIRED_COLUMNS
    assert (RESULTS / "latency.csv").read_text().splitlines()[0] == ",".join(REQUIRED_COLUMNS)


def test_the_rows_the_issue_asks_for():
    rows = _rows()
    hunyuan = ("129", "720", "1280")
    for hw in ("8xh100", "8xa100"):
        assert _devices(rows, "hunyuan_video", hunyuan, hw, {SINGLE, "ulysses"}) == [1, 2, 4, 8]
    for shape in (("81", "480", "832"), ("81", "720", "1280")):
        for hw in ("8xh100", "8xh200"):
            assert {1, 8} <= set(_devices(rows, "wan21_14b", shape, hw, {SINGLE, "ulysses", "cfg_ulysses"}))
    # Ulysses over every device count that divides CogVideoX's 48 heads
    assert _devices(rows, "cogvideox_5b", ("49", "480", "720"), "8xa100", {SINGLE, "ulysses"}) == [1, 2, 3, 4, 6, 8]
    # 1, 2, 4 and 8 devices under each strategy, at each model's first shape and system: written
    # out here from the strategies' rules (usp: an even degree of at least 4; CFG parallel: the
    # two guidance branches, so not HunyuanVideo's embedded guidance)
    expected = {"ulysses": [2, 4, 8], "ring": [2, 4, 8], "usp": [4, 8], "tp": [2, 4, 8],
                "pipefusion": [2, 4, 8], "cfg": [2], "cfg_ulysses": [4, 8]}
    for model, shape, hw in (("hunyuan_video", hunyuan, "8xh100"), ("wan21_14b", ("81", "480", "832"), "8xh100"),
                             ("cogvideox_5b", ("49", "480", "720"), "8xa100")):
        assert _devices(rows, model, shape, hw, {SINGLE}) == [1]
        for strategy, devices in expected.items():
            if strategy.startswith("cfg") and model == "hunyuan_video":
                devices = []
            assert [d for d in _devices(rows, model, shape, hw, {strategy}) if d in (2, 4, 8)] == devices, strategy
    for row in rows:
        assert row["steps"] == "50"
        assert float(row["loop_s"]) > 0 and float(row["memory_gb"]) > 0
        # the VAE decode is traced where its architecture is written (all three), empty elsewhere
        decoded = COMPANIONS[row["model"]].decoder is not None
        assert (row["decode_s"] != "") == decoded
        if decoded:
            assert float(row["decode_s"]) > 0
    # one decode per (shape, system), whatever the transformer's strategy: the same on every row
    decodes = {}
    for row in rows:
        if row["decode_s"]:
            decodes.setdefault((row["model"], row["height"], row["hw"]), set()).add(row["decode_s"])
    assert decodes and all(len(values) == 1 for values in decodes.values())


def test_a_row_that_does_not_fit_says_so():
    """A prediction above the chip's capacity: the CSV keeps the figure, the page says no."""
    case = Case(HUNYUAN_VIDEO, 129, 720, 1280, Layout(SINGLE), "8xa100-40gb")
    capacity = resolve_system("8xa100-40gb", 1).system.chip.dram_capacity_bytes
    over = Prediction(case, step_s=2.0, memory=DeviceMemory(capacity, 5 * GB), capacity_bytes=capacity)
    under = Prediction(case, step_s=2.0, memory=DeviceMemory(capacity - 10 * GB, 5 * GB), capacity_bytes=capacity)
    text = csv_text([over, under])
    lines = text.splitlines()
    assert lines[1].split(",")[-1] == f"{(capacity + 5 * GB) / GB:.1f}"
    assert lines[1].split(",")[-3] == "100.0"  # 50 steps of 2 s
    rows = [dict(zip(COLUMNS, line.split(","))) for line in lines[1:]]
    table = [line for line in page(rows).splitlines() if line.startswith("| hunyuan_video")]
    assert table[0].endswith(f"**no** (capacity {capacity / GB:.0f} GB) |")
    assert table[1].endswith("| yes |")


def test_the_page_is_rendered_from_the_csv():
    assert (RESULTS / "latency.md").read_text() == page(_rows())


#: PipeFusion's rows: (model, video, system, batch, video tokens S, width h, blocks L, parameters
#: of the released model: docs/videodit.md's table); S by hand from the VAE's (4, 8, 8) and the
#: (1, 2, 2) patches: 33 x 45 x 80, 21 x 30 x 52, 13 x 30 x 45.
PIPEFUSION_ROWS = (("hunyuan_video", ("129", "720", "1280"), "8xh100", 1, 118_800, 3072, 60, 12.82e9),
                   ("wan21_14b", ("81", "480", "832"), "8xh100", 2, 32_760, 5120, 40, 14.29e9),
                   ("cogvideox_5b", ("49", "480", "720"), "8xa100", 2, 17_550, 3072, 42, 5.57e9))


def test_pipefusion_rows_hold_the_stages_k_v_buffers_and_the_warm_ups_activations():
    """PipeFusion on 2, 4 and 8 devices for each model; each row's memory per device holds its
    stage's weights (ceil(L / P) of the L blocks' share of the parameters, bf16), its K/V
    buffers (K and V of ceil(L / P) attentions for all S video tokens of the batch, h wide,
    bf16) and the warm-up step's transient: the stage's blocks on the whole latent, as one
    device runs them (the one-device row's memory less the whole model's weights), more than a
    patch's; the embeddings and head on every stage within 1 GB, the rounding (0.1 GB) within 0.15."""
    rows = _rows()
    for model, shape, hw, batch, tokens, width, blocks, parameters in PIPEFUSION_ROWS:
        assert _devices(rows, model, shape, hw, {"pipefusion"}) == [2, 4, 8]
        single = next(r for r in rows if (r["model"], r["hw"], r["strategy"]) == (model, hw, SINGLE)
                      and (r["frames"], r["height"], r["width"]) == shape)
        warmup = float(single["memory_gb"]) - 2 * parameters / GB
        for row in rows:
            if row["model"] == model and row["strategy"] == "pipefusion":
                stages = int(row["devices"])
                assert row["degrees"] == f"pipefusion={stages} patches={stages}"
                held = -(-blocks // stages)
                stage = (2 * held * batch * tokens * width * 2 + 2 * parameters * held / blocks) / GB
                assert -0.15 < float(row["memory_gb"]) - (stage + warmup) < 1.0  # the CSV's 0.1 GB


def test_a_pipefusion_patch_is_padded_as_the_height_is_cut():
    """HunyuanVideo at 720p: a latent of 90 rows, 45 token rows of 2; eight patches hold
    ceil(45 / 8) = 6 token rows (12 latent rows), the last padded; the buffers hold all
    33 x 45 x 80 = 118,800 video tokens of each stage's batch of one."""
    from models.zoo.videodit.plans import pipefusion_inputs

    inputs = pipefusion_inputs(["latents=1x16x33x90x160:bfloat16", "t=1:bfloat16"], stages=8,
                               patches=8, attentions=3, heads=24, head_dim=128, video_tokens=118_800)
    assert inputs == ["latents=8x16x33x12x160:bfloat16", "t=8:bfloat16",
                      "stale_k=3x8x118800x24x128:bfloat16", "stale_v=3x8x118800x24x128:bfloat16"]
