"""Training plan search and sizing (issue 32, items 2 and 4): the space's refusals, the estimate
against the training formulas and a hand-timed collective, the stage groups, the sizing answer
on a hand-made curve rule, and the CLI's errors. The traced confirmation (a full-size trace) is
run by the README's example, not here."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hardware import load_system
from hardware.collectives import collective_time_s
from models.opensora.config import get_config
from models.opensora.inputs import geometry
from models.opensora.theory import BlockDims
from models.opensora.training_theory import layout_training_activations, training_buffer_bytes
from planning.sizing import size_inference, size_training
from planning.train_search import (
    TrainPlan,
    enumerate_train_plans,
    estimate_train_plan,
    search_train,
    stage_groups,
)

SHAPE = "28_64_64"


def test_stage_groups_are_the_rows_columns_or_the_whole_stage():
    assert stage_groups(8, (2, 4), 8) == [list(range(8, 16))]
    assert stage_groups(4, (2, 4), 0) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert stage_groups(2, (2, 4), 0) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_the_space_refuses_plans_without_a_formula_or_an_even_split():
    space = enumerate_train_plans("tiny", SHAPE, 4, batch=4)
    reasons = " | ".join(reason for _, reason in space.infeasible)
    assert "megatron splits every weight" in reasons          # megatron has no ZeRO formula
    assert "megatron_sp --recompute full: no formula" in reasons  # GSPMD merges its recomputed collectives
    labels = {plan.label for plan in space.plans}
    assert "1x4:dp@1x4 zero3 recompute m=1 b=4" in labels
    assert all(plan.micro_batch % plan.data_parallel == 0 for plan in space.plans)
    odd = enumerate_train_plans("tiny", SHAPE, 4, batch=2, strategies=("dp",), stage_counts=(1,))
    assert not odd.plans and "does not split over the 4 data-parallel devices" in odd.infeasible[0][1]


def test_memory_classes_are_the_training_formulas_times_the_stage():
    """2 stages of 2 chips, 2 micro-batches: each stage holds depth/2 = 1 pair; 1F1B keeps
    min(P, m) = 2 micro-batches' activations on the first stage."""
    model = get_config("tiny")
    plan = TrainPlan("dp", (1, 2), 1, False, 2, 2, 4)
    estimate = estimate_train_plan(plan, load_system("8xh100"), "tiny", SHAPE)
    buffers = training_buffer_bytes("dp", model, (1, 2), 1, 2, pairs=1)
    assert (estimate.param_bytes, estimate.grad_bytes, estimate.optimizer_bytes) == (
        buffers["param"], buffers["grad"], buffers["optimizer_state"])
    geo = geometry(model, SHAPE)
    act = sum(t.bytes for t in layout_training_activations("dp", model, BlockDims.of(model, geo.T, geo.S, 2, 2),
                                                           (1, 2)))
    assert estimate.activation_bytes == 2 * act
    assert dict(estimate.pair_memory)["activation"] == act


def test_gradient_communication_is_the_layouts_param_terms_once_per_step():
    """dp on 1x2, ZeRO 0, one stage: every gradient term is an all-reduce over the 2 chips,
    timed once per step whatever the micro-batches (gradient accumulation)."""
    from models.opensora.training_theory import layout_training_collectives

    model = get_config("tiny")
    system = load_system("8xh100")
    geo = geometry(model, SHAPE)
    terms = layout_training_collectives("dp", model, BlockDims.of(model, geo.T, geo.S, 2, 2), (1, 2))
    expected = model.depth * sum(t.count * collective_time_s(t.kind, 2, t.message_bytes, system)
                                 for t in terms if t.traffic == "param_grad")
    plan = TrainPlan("dp", (1, 2), 0, False, 1, 1, 2)
    assert estimate_train_plan(plan, system, "tiny", SHAPE).gradient_comm_s == pytest.approx(expected)


def test_search_answers_the_fastest_plan_that_fits():
    space = enumerate_train_plans("tiny", SHAPE, 4, batch=4)
    result = search_train("tiny", SHAPE, "8xh100", space, devices=4, memory_limit_bytes=1e12)
    steps = [o.estimate.step_s for o in result.outcomes]
    assert steps == sorted(steps) and result.best == result.outcomes[0]
    tight = min(o.estimate.memory_bytes for o in result.outcomes)
    small = search_train("tiny", SHAPE, "8xh100", space, devices=4, memory_limit_bytes=tight)
    assert small.best.estimate.memory_bytes == tight


def test_sizing_answers_the_smallest_count_that_meets_the_target():
    curve = size_inference("tiny", SHAPE, "8xh100", 1e9, 4, device_counts=(1, 2, 4)).curve
    assert [p.devices for p in curve] == [1, 2, 4] and all(p.seconds for p in curve)
    target = curve[1].seconds * 1.0000001  # met from 2 devices on (and maybe by 1)
    result = size_inference("tiny", SHAPE, "8xh100", target, 4, device_counts=(1, 2, 4))
    first = next(p.devices for p in curve if p.seconds <= target)
    assert result.answer.devices == first and result.answer_plan is not None
    none = size_inference("tiny", SHAPE, "8xh100", min(p.seconds for p in curve) / 2, 4, device_counts=(1, 2, 4))
    assert none.answer is None
    train = size_training("tiny", SHAPE, "4x8xh100", 1e9, 16, batch=16, device_counts=(4, 16))
    assert train.answer.devices == 4


@pytest.mark.parametrize("args, fragment", [
    (["--mode", "train", "--target-latency", "1"], "--target-latency"),
    (["--target-step-time", "1"], "--target-step-time"),
    (["--target-latency", "1", "--max-devices", "99", "--hw", "8xh100"], "--max-devices 99"),
])
def test_sizing_errors_are_one_line(args, fragment):
    from planning.plan_search_cli import plan_search_command

    result = CliRunner().invoke(plan_search_command, ["--config", "tiny", "--no-confirm", *args])
    assert result.exit_code == 2 and fragment in result.output and "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------
# Full recompute of the sequence-parallel layouts (models/opensora/training_theory.py)
# ---------------------------------------------------------------------------------------------

def _tiny3(tmp_path):
    from test_tracing_strategies import TINY3_TOML

    path = tmp_path / "tiny3.toml"
    path.write_text(TINY3_TOML)
    return path


def test_recompute_keeps_block_inputs_every_caption_and_the_local_modulation(tmp_path):
    """ds_ulysses on 2x2, the 3-pair tiny model (h = 64, B = 2, N = T*S = 8*16, 8 caption
    tokens), clean path, by hand: each block's input B*N*h/4 = 4096 bf16 elements (2 blocks:
    16384 B), every caption of the batch 2*8*64 = 1024 elements (2048 B), t_mlp of the x row's
    sample (B/x = 1) x 6h = 384 elements (768 B): 19200 B. ring_attention on 2x4 keeps its y
    slice of the captions (256 elements) and inputs of 2048: 8192 + 512 + 768 = 9472 B; the
    official path adds t0_mlp (768 B) and the local frames' mask (B/x * T/y bools)."""
    from models.opensora.theory import block_dims

    model = get_config(str(_tiny3(tmp_path)))
    dims = block_dims(model, SHAPE, batch=2)

    def act(strategy, mesh, path):
        return sum(t.bytes for t in layout_training_activations(strategy, model, dims, mesh,
                                                                recompute=True, path=path))

    assert act("ds_ulysses", (2, 2), "clean") == 16384 + 2048 + 768
    assert act("ds_ulysses", (2, 2), "official") == 16384 + 2048 + 768 + 768 + 4
    assert act("ring_attention", (2, 4), "clean") == 8192 + 512 + 768
    assert act("usp", (2, 4), "official") == 8192 + 2048 + 768 + 768 + 2


@pytest.mark.slow  # four tiny training traces
@pytest.mark.trace
@pytest.mark.parametrize("strategy, mesh, zero", [("ds_ulysses", "2x2", 0), ("ring_attention", "2x4", 0),
                                                  ("usp", "2x4", 2)])
def test_recompute_formulas_are_the_trace(tmp_path, strategy, mesh, zero):
    """Act and every collective (phase, traffic, kind: count and bytes) of the traced one-pair
    step with --recompute full equal the formulas (the backward reruns the forward's
    activation collectives)."""
    import subprocess
    import sys
    from collections import defaultdict
    from pathlib import Path

    from hlo_analyzer import load_module
    from hlo_analyzer.training import measure_training, read_training_layout
    from models.opensora.theory import block_dims
    from models.opensora.training_theory import layout_training_collectives

    config = _tiny3(tmp_path)
    root = Path(__file__).resolve().parents[1]
    traced = subprocess.run([sys.executable, "-m", "tracing.cli", "--config", str(config), "--shape", SHAPE,
                             "--stage-ids", "0-0,1-1,2-2", "--stage", "1", "--mode", "train", "--path", "clean",
                             "--strategy", strategy, "--mesh", mesh, "--zero", str(zero), "--recompute", "full",
                             "-o", str(tmp_path)], cwd=root, capture_output=True, text=True)
    assert traced.returncode == 0, traced.stderr[-2000:]
    dump = Path(traced.stderr.strip().splitlines()[-1].split()[1])
    split = measure_training(load_module(dump), read_training_layout(dump.with_suffix(".json")))
    model = get_config(str(config))
    dims = block_dims(model, SHAPE, batch=2)
    grid = tuple(int(v) for v in mesh.split("x"))
    assert split.memory["activation"] == sum(t.bytes for t in layout_training_activations(
        strategy, model, dims, grid, recompute=True, path="clean"))
    theory: dict = defaultdict(lambda: [0, 0.0])
    for term in layout_training_collectives(strategy, model, dims, grid, zero, True, path="clean"):
        theory[(term.phase, term.traffic, term.kind)][0] += term.count
        theory[(term.phase, term.traffic, term.kind)][1] += term.bytes_per_device
    assert {k: (c, round(v)) for k, (c, v) in theory.items()} == {
        k: (c, round(v)) for k, (c, v) in split.comm.items()}


def test_sizing_traces_until_a_traced_plan_meets_the_target():
    """A hand-made curve (estimates 8, 4, 2, 1 s on 1, 2, 4, 8 devices) and a tracer that
    traces every plan 3x its estimate: target 3 s. The estimate says 2 devices (4 s > 3, so 4
    devices at 2 s); traced 6 s, the scale becomes 3, so 8 devices (1 s x 3 = 3 s) next: traced
    3 s meets it. A budget of one trace answers nothing."""
    from planning.sizing import SizingPoint, SizingResult, confirm_inference

    curve = tuple(SizingPoint(n, 1, f"plan{n}", 8.0 / n, 1e9) for n in (1, 2, 4, 8))
    result = SizingResult("infer", "tiny", SHAPE, "x", 3.0, 2e9, curve, curve[2], "p4",
                          plans=tuple((n, f"p{n}") for n in (1, 2, 4, 8)))
    traced = []

    def tracer(plan):
        traced.append(plan)
        n = int(plan[1:])
        return (3 * 8.0 / n, 1e9)

    confirmed = confirm_inference(result, tracer, budget=3)
    assert traced == ["p4", "p8"] and confirmed.confirmed and confirmed.answer.devices == 8
    assert [t.traced_s for t in confirmed.traces] == [6.0, 3.0]
    assert confirm_inference(result, tracer, budget=1).answer is None


def test_sizing_scales_by_the_smallest_traced_ratio_so_far():
    """Estimates 24, 12, 8, 6, 3 s on 1, 2, 3, 4, 8 devices, target 10 s; the 3-device plan
    traces 11 s (1.375x its estimate), then 4 devices (6 x 1.375 = 8.25 s) 24 s (4x). The
    smallest ratio, 1.375, rules next: 8 devices (3 x 1.375 = 4.1 s <= 10) is traced and meets
    it; the last ratio alone (3 x 4 = 12 s > 10) would have ruled every count out."""
    from planning.sizing import SizingPoint, SizingResult, confirm_inference

    seconds = {1: 24.0, 2: 12.0, 3: 8.0, 4: 6.0, 8: 3.0}
    curve = tuple(SizingPoint(n, 1, f"plan{n}", s, 1e9) for n, s in seconds.items())
    result = SizingResult("infer", "tiny", SHAPE, "x", 10.0, 2e9, curve, curve[2], "p3",
                          plans=tuple((n, f"p{n}") for n in seconds))
    traced_s = {"p3": 11.0, "p4": 24.0, "p8": 5.0}
    order = []

    def tracer(plan):
        order.append(plan)
        return (traced_s[plan], 1e9)

    confirmed = confirm_inference(result, tracer, budget=5)
    assert order == ["p3", "p4", "p8"] and confirmed.answer.devices == 8
