"""``plan-search --model`` (planning.module_models, planning.module_search): the calibration values and polynomial, the
layouts and their feasibility derived by hand from the released configurations, the role map's
and the options' errors, and (slow) the interpolated kernels of a small model against its
direct trace."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_trace.errors import UsageError
from models.zoo.videodit.configs import WAN21_1_3B
from planning.module_models import Layout, UserModel, ZooModel, enumerate_layouts, zoo_model
from planning.module_search import (
    Estimate,
    Outcome,
    PartFigures,
    Tracer,
    calibration_values,
    interpolate,
    interpolate_value,
    search_model,
    whole_model,
)
from planning.plan_search_cli import plan_search_command
from plans.module_plan import load_plan


def test_calibration_values_keep_the_residue_modulo_the_devices():
    # HunyuanVideo at 129 frames: 33 latent frames; on 8 devices 33 = 1 mod 8
    assert calibration_values(33, 8) == (9, 17, 25)
    # Wan 2.1 at 81 frames: 21 latent frames = 5 mod 8; 21 itself is skipped
    assert calibration_values(21, 8) == (5, 13, 29)
    # one device: the smallest values from 2, the target skipped
    assert calibration_values(3, 1) == (2, 4, 5)
    # a residue of 0 starts at the modulus
    assert calibration_values(16, 4) == (4, 8, 12)


def test_interpolation_is_exact_on_a_joint_sequence_and_flags_the_rest():
    # scores of an attention over 3 t + 5 tokens: (3 t + 5)^2, no product of powers of t
    points = (2, 3, 4)
    values = [(3 * t + 5) ** 2 for t in points]
    assert interpolate_value(points, values, 33) == ((3 * 33 + 5) ** 2, True)
    # values 1, 2, 5 at t = 2, 3, 5 are no integer polynomial: at t = 4 the Lagrange terms are
    # -1/3 + 2 + 5/3 = 10/3, rounded to 3 and flagged
    assert interpolate_value((2, 3, 5), (1, 2, 5), 4) == (3, False)
    document, inexact, count = interpolate([{"k": [t, "gemm", 1.5, (t + 1) * 64]} for t in points], points, 10)
    assert document == {"k": [10, "gemm", 1.5, 11 * 64]} and (inexact, count) == (0, 2)
    with pytest.raises(ValueError, match="differ"):
        interpolate([[1, 2], [1, 2, 3], [1, 2]], points, 5)


def test_a_vector_kernels_width_that_is_no_polynomial_stays_positive_and_is_flagged():
    """A vector kernel over a joint sequence of 3,600 t + 256 rows writing 6,144 x 3,600 t
    elements (the video's): its width ceil(out / rows) is 5,934, 6,002 and 6,037 at t = 2, 3, 4
    (by hand), no polynomial: extrapolated to t = 33 it would be empty. The rows interpolate
    exactly (119,056); the width comes from rows x width over the rows, near the true
    ceil(729,907,200 / 119,056) = 6,131, and is counted inexact."""
    def kernel(t: int) -> dict:
        rows = 3600 * t + 256
        return {"op_type": "Vector", "output_shape": [rows, -(-6144 * 3600 * t // rows)]}

    assert [kernel(t)["output_shape"][1] for t in (2, 3, 4)] == [5934, 6002, 6037]
    document, inexact, _ = interpolate([kernel(t) for t in (2, 3, 4)], (2, 3, 4), 33)
    rows, width = document["output_shape"]
    assert rows == 119_056 and width == pytest.approx(6131, rel=0.01) and inexact == 1
    # a polynomial width (rows dividing the output) is interpolated as any integer, exact
    document, inexact, _ = interpolate([{"op_type": "Vector", "output_shape": [64 * t, 3072]} for t in (2, 3, 4)],
                                       (2, 3, 4), 33)
    assert document["output_shape"] == [64 * 33, 3072] and inexact == 0


def test_hunyuan_layouts_on_8_and_16_devices():
    # 24 heads, 33 x 45 x 80 = 118,800 video tokens and 256 text tokens; embedded guidance
    model = zoo_model("hunyuan_video", "129x720x1280")
    assert model.variable == 33 and model.tokens_per_frame == 45 * 80
    layouts, refused = enumerate_layouts(model, 8)
    # PipeFusion: 8 stages of the 60 blocks, 8 patches of the 45 token rows; 2 stages of
    # Ulysses 4: a patch of 33 x 23 x 80 = 60,720 tokens and the 256 text tokens split by 4
    assert [layout.label for layout in layouts] == ["ulysses=8", "ring=8", "usp ring=2 x ulysses=4", "tp=8",
                                                    "pipefusion=8", "pipefusion=2 x ulysses=4"]
    assert [layout.mesh for layout in layouts[-2:]] == [(8, 1), (2, 4)]
    reasons = dict(refused)
    assert "embedded guidance" in reasons["cfg"] and "embedded guidance" in reasons["cfg_ulysses"]
    layouts, refused = enumerate_layouts(model, 16)
    reasons = dict(refused)
    # 24 heads: no Ulysses or tp degree of 16; usp 2 x 8 splits 24 heads by 8: runs
    assert reasons["ulysses=16"] == "24 heads: not divisible by 16"
    assert reasons["tp=16"] == "24 heads: not divisible by 16"
    # 118,800 = 2^4 x 7,425 tokens: ring 16 divides them, 256 text tokens too; 60,720 = 8 x 7,590
    assert [layout.label for layout in layouts] == ["ring=16", "usp ring=2 x ulysses=8", "pipefusion=16",
                                                    "pipefusion=2 x ulysses=8"]
    # 128 x 128: a latent of 16 x 16, 8 token rows: no 16 patches
    small = zoo_model("hunyuan_video", "129x128x128")
    assert dict(enumerate_layouts(small, 16)[1])["pipefusion=16"] == "16 patches: the latent has 8 token rows"


def test_cfg_layouts_and_padding_of_cogvideox():
    model = zoo_model("cogvideox", "49x480x720")
    layouts, refused = enumerate_layouts(model, 8)
    assert "cfg=2 x ulysses=4" in [layout.label for layout in layouts]
    # 48 heads, FFN 4 x 3,072; 13 x 30 x 45 = 17,550 video tokens are padded, never refused
    layouts, refused = enumerate_layouts(model, 6, all_devices=False)
    labels = [layout.label for layout in layouts]
    assert labels[0] == "one device" and "ulysses=5" not in labels and "ring=5" in labels
    assert dict(refused)["ulysses=5"] == "48 heads: not divisible by 5"
    wan = zoo_model("wan21_14b", "81x480x832")  # 21 x 30 x 52 = 32,760 tokens, 40 heads
    layouts, refused = enumerate_layouts(wan, 16)
    reasons = dict(refused)
    assert reasons["ulysses=16"] == "40 heads: not divisible by 16"
    assert reasons["ring=16"] == "32760 video tokens: not divisible by 16"
    # two stages of Ulysses 8: the warm-up's 32,760 tokens divide by 8, a patch's 21 x 15 x 52 =
    # 16,380 do not; Wan 2.1 1.3B has 30 blocks: no 32 stages (its 30 token rows neither)
    assert reasons["pipefusion=2 x ulysses=8"] == "a patch's 16380 video tokens: not divisible by 8"
    small = zoo_model("wan21_1.3b", "81x480x832")
    reasons = dict(enumerate_layouts(small, 32)[1])
    assert reasons["pipefusion=32"] == "32 stages: the model has 30 blocks"
    assert reasons["pipefusion=2 x ulysses=16"].startswith("its warm-up on a stage's 16 devices: 12 heads")


def test_a_user_model_runs_what_its_role_map_allows():
    model = UserModel("models.zoo.llama:llama", {}, ("ids=2xT:int64",), 64, {"column": ("q_proj",), "row": ("o_proj",)})
    layouts, refused = enumerate_layouts(model, 4)
    assert [layout.label for layout in layouts] == ["tp=4"]
    reasons = dict(refused)
    assert "--qkv, --attn-out" in reasons["ulysses"] and reasons["dp=4"] == "input ids: batch 2 not divisible by 4"
    plan = model.plan(layouts[0])
    assert "re:(.*\\.)?q_proj\\.weight" in plan and '["none", "y"]' in plan
    with pytest.raises(UsageError, match="cannot run it"):
        enumerate_layouts(model, 4, ["ring"])


def _run(*args: str, tmp_path) -> tuple[int, str]:
    result = CliRunner().invoke(plan_search_command, [*args, "--work-dir", str(tmp_path / "work")])
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "models.zoo:no-such", "--input", "x=2xT:float32", "--shape", "8"), "expected an import path"),
    (("--model", "hunyuan_video", "--shape", "129x720x1280", "--strategies", "cfg"), "embedded guidance"),
    (("--model", "hunyuan_video", "--shape", "129x720x1280", "--column", "q"), "--column: hunyuan_video"),
    (("--model", "hunyuan_video", "--shape", "128x720x1280"), "1 + a multiple of 4"),
    (("--model", "sora", "--shape", "129x720x1280"), "--model sora"),
    (("--model", "models.zoo.llama:llama", "--shape", "64"), "needs its inputs"),
    (("--model", "models.zoo.llama:llama", "--input", "ids=2x16:int64", "--shape", "64"), "no input has the dimension T"),
    (("--model", "models.zoo.llama:llama", "--input", "ids=2xT:int64", "--shape", "64", "--strategies", "usp"),
     "cannot run it"),
    (("--model", "hunyuan_video", "--shape", "129x720x1280", "--mode", "train"), "--mode: STDiT3's search only"),
    (("--model", "hunyuan_video", "--shape", "129x720x1280", "--jobs", "2"), "--jobs: STDiT3's search only"),
])
def test_bad_input_is_one_error_line(args, message, tmp_path):
    code, output = _run(*args, tmp_path=tmp_path)
    assert code == 2, output
    assert output.startswith("Error: ") and message in output and output.count("\n") == 1, output


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "roles", "message"), [
    ("models.zoo.llama:llama", ("--column", "q_proj,gate", "--row", "o_proj"),
     "Error: --column gate: no layer of models.zoo.llama:llama is named gate"),
    ("models.zoo.no_such_module:llama", (), "no_such_module"),
])
def test_a_role_name_that_matches_no_layer_or_a_factory_that_does_not_build(factory, roles, message, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("HLO_TRACE_CACHE", str(tmp_path / "cache"))
    code, output = _run("--model", factory, "--input", "ids=2xT:int64", "--shape", "16",
                        "--hw", "8xh100", "--devices", "2", *roles, tmp_path=tmp_path)
    errors = [line for line in output.splitlines() if line.startswith("Error")]
    assert code == 2 and len(errors) == 1 and message in errors[0], output
    assert output.splitlines()[-1] == errors[0]  # the progress before it, nothing after


def test_pipefusion_memory_is_the_stage_and_the_larger_transient_of_a_tick_and_the_warm_up():
    """8 blocks on 4 stages: a stage holds 2 blocks (the layers part: the base's block and
    one more), their weights and K/V buffers, and the larger transient (inputs and peak of live
    activations) of a tick and of the warm-up step (the stage's blocks on the whole latent)."""
    tick = {"base": PartFigures(1.0, 0.0, weight_bytes=100, other_bytes=7, peak_live_bytes=40, stale_kv_bytes=30),
            "layers": PartFigures(2.0, 0.0, weight_bytes=150, other_bytes=7, peak_live_bytes=45, stale_kv_bytes=60)}
    stage = 150 + 60  # 100 + 1 x (150 - 100) weights, 30 + 1 x (60 - 30) buffers

    def memory(warm_transient: float) -> float:
        warmup = Estimate(loop_s=10.0, comm_s=0.0, memory_bytes=1000 + warm_transient, transient_bytes=warm_transient)
        return whole_model(tick, {"layers": 8}, 2, layout=Layout("pipefusion", 4), warmup=warmup).memory_bytes

    assert memory(500) == stage + 500  # the warm-up's whole latent outweighs a patch
    assert memory(20) == stage + 7 + 45  # a tick's inputs and the larger part's peak


def test_an_untraced_layout_over_the_memory_limit_says_so():
    from planning.module_search_cli import _row

    estimate = Estimate(loop_s=1046.0, comm_s=22.3, memory_bytes=28.59e9)
    assert _row(Outcome(Layout("ulysses", 8), estimate), 17.18e9).endswith("(not traced: over the 17.18 GB limit)")
    assert _row(Outcome(Layout("ulysses", 8), estimate), 80e9).endswith("(not traced)")


@pytest.mark.slow
def test_interpolated_kernels_equal_the_direct_trace(tmp_path, monkeypatch):
    """The tiny Wan 2.1 under Ulysses and tp on 4 devices: its kernels interpolated from T = 4, 12,
    16 latent frames at T = 8 equal, integer for integer, the kernels of its trace at T = 8, and
    the estimate equals the traced loop."""
    monkeypatch.setenv("HLO_TRACE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "result.json"
    code, output = _run("--model", "models.zoo.videodit.wan21:wan21", "--input", "latents=2x4xTx8x8:float32",
                        "--input", "t=2:float32", "--input", "text=2x8x32:float32", "--shape", "8",
                        "--hw", "8xh100", "--devices", "4", "--column", "q_proj,k_proj,v_proj,fc1",
                        "--row", "o_proj,fc2", "--qkv", "q_proj,k_proj,v_proj", "--attn-out", "o_proj",
                        "--json", str(out), "-o", str(tmp_path / "best.toml"), tmp_path=tmp_path)
    assert code == 0, output
    best = load_plan(str(tmp_path / "best.toml"), shorthand=None, mesh=None)  # a trace-module plan
    assert best.mesh_shape == (1, 4) and (best.parameters or best.activations)
    document = json.loads(out.read_text())
    assert [layout["layout"] for layout in document["layouts"]] == ["tp=4", "ulysses=4"] or \
        sorted(layout["layout"] for layout in document["layouts"]) == ["tp=4", "ulysses=4"]
    for layout in document["layouts"]:
        assert layout["estimate"]["inexact_values"] == 0 and layout["estimate"]["values"] > 1000
        assert layout["ratio"] == pytest.approx(1.0, abs=1e-9)
    kernels = sorted((tmp_path / "work").rglob("ulysses4_base_T*.8xh100.kernels.json"))
    by_t = {int(path.name.split("_T")[1].split(".")[0]): json.loads(path.read_text())["kernels"] for path in kernels}
    assert sorted(by_t) == [4, 8, 12, 16]
    document, inexact, _ = interpolate([by_t[t] for t in (4, 12, 16)], (4, 12, 16), 8)
    assert inexact == 0 and document == by_t[8]


RESULTS = Path(__file__).resolve().parent.parent / "results" / "videodit"


@pytest.mark.parametrize("model", ["hunyuan_video", "wan21_14b", "cogvideox_5b", "wan21_1.3b"])
def test_each_video_dit_search_answers_a_traced_layout_within_the_tolerance(model):
    """results/videodit/search_<model>.json (scripts/videodit.py --search): the best layout was
    traced, the estimate of every traced layout within 5%, the search under 15 minutes; and its
    traced loop (its estimate where not traced: PipeFusion 8) equals the latency.csv row of the
    same layout, which scripts/videodit.py predicted through analyze-hlo's command line
    (another path through the analyzer)."""
    document = json.loads((RESULTS / f"search_{model}.json").read_text())
    assert document["hardware"] == "8xh100" and document["devices"] == 8
    best = document["best"]
    assert best is not None and best["traced"] is not None
    traced = [layout for layout in document["layouts"] if layout["traced"]]
    assert len(traced) >= 3 and all(abs(layout["ratio"] - 1) <= 0.05 for layout in traced)
    assert best["traced"]["loop_s"] == min(layout["traced"]["loop_s"] for layout in traced)
    assert document["seconds"] < 15 * 60
    with (RESULTS / "latency.csv").open() as handle:
        rows = {(r["model"], r["hw"], r["degrees"], f"{r['frames']}x{r['height']}x{r['width']}"): r
                for r in csv.DictReader(handle)}
    checked = 0
    for layout in document["layouts"]:
        figures = layout["traced"] or layout["estimate"]
        degrees = Layout(layout["strategy"], layout["degree"], tuple(layout["mesh"])).degrees
        row = rows.get((model, "8xh100", degrees, document["shape"]))
        if row is not None and figures is not None:
            assert figures["loop_s"] == pytest.approx(float(row["loop_s"]), abs=0.051)
            assert figures["memory_bytes"] / 1e9 == pytest.approx(float(row["memory_gb"]), abs=0.051)
            checked += 1
    # every layout but pipefusion_ulysses has its row on 8xh100 (HunyuanVideo: no CFG parallel);
    # CogVideoX's rows are on A100s, Wan 2.1 1.3B has none
    assert checked == {"hunyuan_video": 5, "wan21_14b": 6}.get(model, 0)


@pytest.mark.parametrize("model", ["hunyuan_video", "wan21_14b", "cogvideox_5b", "wan21_1.3b"])
def test_each_video_dit_search_on_other_systems(model):
    """results/videodit/search_<model>_systems.json (scripts/videodit.py --search-systems): the
    model's search on 8xa100, tx8-16 (8 chips) and 4x8xh100 (one node, two nodes), each one
    answered or failed with its reason; every traced layout within 5% of its estimate; on one
    node of 4x8xh100 (the H100 and NVLink of 8xh100) the answer of the 8xh100 search; the
    page's table holds each search's row."""
    from scripts.videodit import SYSTEMS, systems_row

    document = json.loads((RESULTS / f"search_{model}_systems.json").read_text())
    assert [(entry["hw"], entry["devices"]) for entry in document["systems"]] == list(SYSTEMS)
    page = (RESULTS / f"search_{model}_systems.md").read_text()
    for entry in document["systems"]:
        assert systems_row(entry) in page.splitlines()
        search = entry["search"]
        if search is None:
            assert entry["error"] and f"**The search failed**: {entry['error']}" in page
            continue
        assert search["hardware"] == entry["hw"] and search["devices"] == (entry["devices"] or 8)
        assert all(abs(layout["ratio"] - 1) <= 0.05 for layout in search["layouts"] if layout["traced"])
        best = search["best"]
        assert best is None or best["traced"]["memory_bytes"] <= search["memory_limit_bytes"]
    one_node = document["systems"][[hw for hw, _ in SYSTEMS].index("4x8xh100")]["search"]
    alone = json.loads((RESULTS / f"search_{model}.json").read_text())["best"]
    assert one_node["best"]["layout"] == alone["layout"]
    assert one_node["best"]["traced"]["loop_s"] == pytest.approx(alone["traced"]["loop_s"], rel=1e-9)


#: Wan 2.1 at the factory's tiny width (64, 4 heads) with 4 blocks, 8 text tokens of 32: a zoo
#: model the search runs as the released ones (a video of 9 x 64 x 64: a latent of 3 x 8 x 8,
#: 3 x 4 x 4 = 48 video tokens in 4 token rows), 3 sampling steps.
TINY_WAN = dataclasses.replace(
    WAN21_1_3B, name="wan21_tiny", steps=3, text_tokens=8, text_dim=32, latent_channels=4,
    kwargs=dict(dim=64, ffn=160, heads=4, layers=4, in_channels=4, text_dim=32, frequencies=32, patch=(1, 2, 2)))


@pytest.mark.slow
def test_a_pipefusion_plan_estimated_equals_its_trace(tmp_path, monkeypatch):
    """PipeFusion on 4 x 1 (4 stages, 4 patches of one token row) and 2 x 2 (2 stages of Ulysses
    2) of the tiny Wan: each estimated from its calibration ticks (and its warm-up layout's,
    one device and Ulysses 2) equals its full-size trace; the traced loop is one warm-up step
    (the warm-up layout's whole model) plus 2 steps of 4 patches through 4 stages: 2 x 4 + 3
    ticks (the pipeline fills once; the next step's patches follow on) of the heaviest stage
    (one of the 4 blocks: the base part, by hand); each device holds its stage's K/V buffers
    (K and V of its blocks' self-attentions, 2 samples x 48 tokens x 64 wide, bf16). Its memory
    is the stage's weights and buffers and the larger transient (a call's inputs and peak of
    live activations) of a tick and of the warm-up step: the stage's blocks on the whole latent,
    as the warm-up layout runs them (its traced parts), which outweighs a patch's."""
    monkeypatch.setenv("HLO_TRACE_CACHE", str(tmp_path / "cache"))
    model = ZooModel(TINY_WAN, 9, 64, 64)
    layouts, refused = enumerate_layouts(model, 4, ["pipefusion", "pipefusion_ulysses"])
    assert [layout.label for layout in layouts] == ["pipefusion=4", "pipefusion=2 x ulysses=2"] and not refused
    tracer = Tracer(tmp_path / "work", "8xh100", lock=False)
    result = search_model(model, "9x64x64", "8xh100", layouts, refused, tracer, devices=4, budget=2)
    assert len(result.traced) == 2
    for outcome in result.traced:
        assert outcome.estimate.inexact == 0 and outcome.ratio == pytest.approx(1.0, abs=1e-9)
        assert outcome.estimate.memory_bytes == pytest.approx(outcome.traced.memory_bytes, rel=1e-9)
    docs = {path.name.split(".")[0]: json.loads(path.read_text())
            for path in (tmp_path / "work").rglob("*_T3.8xh100.kernels.json")}
    single = docs["none_base_T3"]["step_s"] + 3 * (docs["none_layers_T3"]["step_s"] - docs["none_base_T3"]["step_s"])
    tick = docs["pipefusion4_base_T3"]["step_s"]
    traced = {o.layout.label: o.traced for o in result.traced}
    assert traced["pipefusion=4"].loop_s == pytest.approx(single + (2 * 4 + 3) * tick, rel=1e-12)
    stale = 2 * 2 * 48 * 64 * 2  # one block's K and V per device
    assert docs["pipefusion4_base_T3"]["memory"][3] == stale
    assert docs["pipefusion_ulysses2_layers_T3"]["memory"][3] == 2 * stale // 2  # 2 blocks, heads split by 2

    def transient(tag: str) -> int:  # memory: weights, inputs and scalars, peak of live activations, K/V buffers
        return docs[f"{tag}_base_T3"]["memory"][1] + max(docs[f"{tag}_{part}_T3"]["memory"][2]
                                                          for part in ("base", "layers"))

    for label, tag, warmup, stage_part in (("pipefusion=4", "pipefusion4", "none", "base"),
                                           ("pipefusion=2 x ulysses=2", "pipefusion_ulysses2", "ulysses2", "layers")):
        held = docs[f"{tag}_{stage_part}_T3"]["memory"]  # a stage of 1 block: the base; of 2: the layers part
        assert transient(warmup) > transient(tag)
        assert traced[label].memory_bytes == held[0] + held[3] + transient(warmup)
