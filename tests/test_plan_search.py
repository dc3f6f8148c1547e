"""Plan search (issue 25): the space, the estimate on hand-derived numbers, the search's rules
with a hand-made tracer, the CLI's errors, and a real search on the tiny model against the
exhaustive trace of the same space."""

from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from pinned_cards import tx8_bound_toml

from hardware import load_system, map_block
from hardware.collectives import collective_time_s
from models.opensora.block_ops import block_shapes_for, build_stdit_block_ops
from models.opensora.config import get_config
from models.opensora.flops import parameter_count
from planning.plan_search import (
    Plan,
    PlanOutcome,
    Space,
    enumerate_plans,
    estimate_plan,
    pair_splits,
    pareto_front,
    search,
    spearman,
    stage_meshes,
)
from planning.plan_search_cli import plan_search_command
from plans.cases import PipelineCase, PipelineShape

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY = get_config("tiny")
# tiny at 28_64_64: T = 28*5//17 = 8 frames, latent 8 x 8 -> S = 4*4 = 16, N = 128 tokens.
T, S, N = 8, 16, 128


def _flat(strategy: str, mesh: tuple[int, int], config: str = "tiny") -> Plan:
    chips = mesh[0] * mesh[1]
    return Plan(PipelineCase(config, "28_64_64", PipelineShape(1, chips, strategy), 1,
                             get_config(config).depth, mesh=mesh))


# -- the space ------------------------------------------------------------------------------------


def test_pair_splits_start_even_then_lighten_the_first_stage():
    assert pair_splits(28, 2, 3) == [((0, 13), (14, 27)), ((0, 12), (13, 27)),
                                     ((0, 11), (12, 27))]
    # 7+7+7+7, then 6+7+7+8: the pair taken from stage 0 goes to the last stage
    assert pair_splits(28, 4, 2) == [((0, 6), (7, 13), (14, 20), (21, 27)),
                                     ((0, 5), (6, 12), (13, 19), (20, 27))]
    assert pair_splits(2, 2, 2) == [((0, 0), (1, 1))]  # a stage never goes empty
    assert pair_splits(28, 1, 2) == [((0, 27),)]


def test_stage_meshes_follow_the_strategy_table():
    assert stage_meshes("megatron", 8) == [(1, 8)]  # x and y together: one program
    assert stage_meshes("dp", 8) == [(1, 8)]
    assert stage_meshes("ds_ulysses", 8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert stage_meshes("none", 8) == [] and stage_meshes("none", 1) == [(1, 1)]


def test_the_space_keeps_what_the_tracer_accepts_and_says_why_not_the_rest():
    space = enumerate_plans("tiny", "28_64_64", 8, strategies=("megatron", "ds_ulysses", "none"),
                            stage_counts=(1, 2), splits=2, patch_counts=(1, 2, 4))
    labels = {plan.label for plan in space.plans}
    # tiny has 4 heads: megatron cannot split them over 8 devices, but over a stage of 4 it can
    assert "1x8:megatron@1x8 M=1" not in labels
    assert {"2x4:megatron@1x4 pairs 0-0,1-1 M=1", "2x4:megatron@1x4 pairs 0-0,1-1 M=4"} <= labels
    refused = dict(space.infeasible)
    assert "heads = 4 is not divisible by the 8 devices" in refused["1x8:megatron@1x8 M=1"]
    # ds_ulysses puts the batch of 2 on x: 4x2 and 8x1 are refused, 1x8 needs 8 | heads: refused
    assert "1x8:ds_ulysses@2x4 M=1" in labels and "1x8:ds_ulysses@4x2 M=1" in refused
    assert "1x1:none@1x1 M=1" in labels  # the one-chip baseline
    # the 28_64_64 latent is 4 patch rows high: M = 1, 2, 4 all cut
    assert {p.case.patches for p in space.plans if p.case.pipeline.stages == 2} == {1, 2, 4}
    assert len(space.plans) + len(space.infeasible) == len(labels) + len(refused)


# -- the estimate, on hand-derived numbers --------------------------------------------------------


def test_memory_estimate_of_one_device_is_weights_plus_two_score_copies_plus_six_activations():
    system = load_system("tx8-16")
    estimate = estimate_plan(_flat("none", (1, 1)), system)
    weights = parameter_count(TINY) * 2  # bf16
    # largest score matrix: spatial B*T x heads x S x S = 16*4*16*16 = 16384 (the flattened
    # cross-attention, 4 x (B*N = 256) x (B*TOKEN = 16), is as large); two copies in bf16
    scores = 2 * 16384 * 2
    activations = 6 * (2 * N) * 64 * 2  # six (B*N, h) bf16 tensors
    assert estimate.memory_bytes == weights + scores + activations == 947904


def test_megatron_memory_splits_the_block_weights_over_all_devices():
    system = load_system("tx8-16")
    one = estimate_plan(_flat("none", (1, 1)), system)
    four = estimate_plan(_flat("megatron", (1, 4)), system)
    block = 2 * 66784 * 2  # one pair of tiny blocks, bf16 (models.opensora.flops)
    weights_saved = TINY.depth * block * (1 - 1 / 4)
    # per device: 4 heads over 4 -> one head; 2*N/4 rows... the live part shrinks too: scores
    # spatial 16*1*16*16 = 4096, cross 1*1*256*16 = 4096 -> 2*4096*2; activations use N*B/4 rows
    live_one, live_four = 2 * 16384 * 2 + 6 * 256 * 64 * 2, 2 * 4096 * 2 + 6 * 64 * 64 * 2
    assert one.memory_bytes - four.memory_bytes == pytest.approx(
        weights_saved + live_one - live_four)


def test_latency_estimate_is_blocks_times_steps_plus_the_layouts_collectives():
    system = load_system("tx8-16")
    none = estimate_plan(_flat("none", (1, 1)), system, steps=30)
    single = block_shapes_for(TINY, frames=T, spatial_tokens=S, blocks=1)
    pair_s = map_block(build_stdit_block_ops(single), system.chip).latency_s
    assert none.comm_s == 0
    assert none.latency_s == pytest.approx(30 * TINY.depth * pair_s)
    megatron = estimate_plan(_flat("megatron", (1, 4)), system, steps=30)
    # 6 all-reduces per pair of the whole (B, N, h) bf16 activation: 2*2*128*64 = 32768 bytes
    one = collective_time_s("all_reduce", 4, 32768, system, devices=[0, 1, 2, 3])
    assert megatron.comm_s == pytest.approx(TINY.depth * 6 * one)
    assert estimate_plan(_flat("megatron", (1, 4)), system, steps=3).latency_s == pytest.approx(
        megatron.latency_s / 10)


def test_a_pipefusion_plan_whose_patch_the_strategy_cannot_split_is_refused_with_the_tracers_reason():
    # full at 153_848_480: 30 x 53 patches, S = 1590; a PipeFusion patch of M = 2 is 15 rows,
    # S = 795 tokens, which opensora_sp cannot split over Y = 2 (the tracer traces the patch and
    # refuses it); the whole latent's S = 1590 would split. M = 1 is accepted.
    space = enumerate_plans("full", "153_848_480", 16, strategies=("opensora_sp",), stage_counts=(8,),
                            patch_counts=(1, 2), splits=1)
    assert space.plans and all(plan.case.patches == 1 for plan in space.plans)
    refused = [reason for label, reason in space.infeasible if label.endswith("M=2")]
    assert refused and all("S = 795 is not divisible by the 2 devices" in reason for reason in refused)
    # and the whole latent's layout is checked too: M = 4 patches of S = 424 tokens split over
    # Y = 4, but the tracer refuses the plan because S = 1590 does not (its whole-latent check)
    space = enumerate_plans("full", "153_848_480", 8, strategies=("opensora_sp",), stage_counts=(2,),
                            patch_counts=(4,), splits=1)
    refused = [(label, reason) for label, reason in space.infeasible if "@1x4" in label]
    assert refused and all("S = 1590 is not divisible by the 4 devices" in reason for _, reason in refused)


def test_spearman_on_hand_ranked_sequences():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (1, 2, 3) against (1.5, 1.5, 3): covariance 1.5, variances 2 and 1.5
    assert spearman([1, 2, 3], [5, 5, 9]) == pytest.approx(1.5 / math.sqrt(2 * 1.5))
    with pytest.raises(ValueError):
        spearman([1], [1])


# -- the search, with a hand-made tracer ----------------------------------------------------------


def _outcome(latency: float, memory: float) -> PlanOutcome:
    from planning.plan_search import Estimate

    return PlanOutcome(_flat("none", (1, 1)), Estimate(1.0, 1.0, 1.0, 0.0, "x"), latency, memory)


def test_pareto_front_drops_the_dominated_plans():
    a, b, c, d = _outcome(1.0, 9.0), _outcome(2.0, 5.0), _outcome(3.0, 6.0), _outcome(4.0, 1.0)
    assert pareto_front([c, a, d, b]) == (d, b, a)  # c is slower and larger than b


def _space() -> Space:
    return enumerate_plans("tiny", "28_64_64", 8, strategies=("ds_ulysses", "megatron_sp"),
                           stage_counts=(1, 2), splits=1, patch_counts=(1, 2))


def test_search_traces_in_estimate_order_within_budget_and_answers_only_traced_plans():
    space = _space()
    calls: list[str] = []

    def tracer(plans):
        # The first plan traces almost instantly but needs 1 TB (it never fits, and its
        # traced/estimated ratio of ~0 keeps the bound from stopping the search); the others
        # get slower the later they are traced.
        values = []
        for plan in plans:
            calls.append(plan.label)
            values.append((1e-15, 1e12) if len(calls) == 1 else (float(len(calls)), 1e6))
        return values

    result = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=3, jobs=2)
    estimates = [o.plan.label for o in result.outcomes]  # in estimate order
    assert calls == estimates[:3]  # two rounds: 2 plans, then the 1 left of the budget
    assert len(result.traced) == 3 and "budget of 3" in result.stopped
    assert result.best.plan.label == calls[1]  # 2 s: the fastest traced plan that fits
    assert not result.outcomes[3].traced  # never the answer, though estimated
    assert {o.plan.label for o in result.pareto} == {calls[0], calls[1]}


def test_validation_traces_plans_drawn_from_the_untraced_rest_and_counts_those_within_5_percent():
    space = _space()
    calls: list[str] = []
    system = load_system("tx8-16")

    def tracer(plans):
        # each plan traces at its estimate times 1.04 (within 5%) for the first, 1.2 after
        calls.extend(p.label for p in plans)
        return [(estimate_plan(p, system).latency_s * (1.04 if len(calls) == 1 else 1.2), 1.0) for p in plans]

    result = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=1, validate=3)
    assert len(calls) == 4 and len(set(calls)) == 4  # the top plan, then 3 others, none twice
    assert calls[0] == result.outcomes[0].plan.label
    assert {p.label for p in result.validation} == set(calls[1:])
    assert result.within == (1, 4)  # 1/1.04 and 1/1.2: only the first within 5%
    again = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=1, validate=3)
    assert again.validation == result.validation  # a fixed seed


def test_search_never_answers_a_plan_over_the_memory_limit_or_one_that_failed():
    space = _space()
    order: list[str] = []

    def tracer(plans):
        values = []
        for plan in plans:
            order.append(plan.label)
            values.append("trace stage 0: boom" if len(order) == 1 else
                          (1.0, 5e6) if len(order) == 2 else (2.0, 1e6))
        return values

    result = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=3,
                    memory_limit_bytes=2e6)
    by_label = {o.plan.label: o for o in result.outcomes}
    assert by_label[order[0]].error == "trace stage 0: boom"
    assert result.best.plan.label == order[2]  # the 1 s plan needs 5 MB > 2 MB
    nothing = search("tiny", "28_64_64", "tx8-16", space, lambda plans: [(1.0, 9e9)] * len(plans),
                     devices=8, budget=2, memory_limit_bytes=2e6)
    assert nothing.best is None and len(nothing.traced) == 2
    # a limit no estimate fits (the weights alone are ~0.7 MB): nothing is traced at all
    calls = []
    none_fit = search("tiny", "28_64_64", "tx8-16", space, lambda plans: calls.extend(plans) or [],
                      devices=8, budget=2, memory_limit_bytes=1e3)
    assert none_fit.best is None and calls == [] and none_fit.stopped.startswith("no plan")


def test_search_stops_when_the_bound_rules_out_every_untraced_plan(tmp_path):
    # tx8-16 with TX8's GEMMs at the tile mappers' bound: the tiny model's plans spread widely
    # enough that the bound rules some out (the tiled model's per-op dispatch evens them out)
    (tmp_path / "tx8.toml").write_text(tx8_bound_toml(), encoding="utf-8")
    system_text = (REPO_ROOT / "hardware" / "data" / "tx8-16.toml").read_text(encoding="utf-8")
    hardware = tmp_path / "tx8-16.toml"
    hardware.write_text(system_text.replace('chip = "tx8"', f'chip = "{tmp_path / "tx8.toml"}"'), encoding="utf-8")
    space = _space()

    def tracer(plans):  # every plan traces at exactly 2x its estimate
        from planning.plan_search import estimate_plan

        system = load_system(str(hardware))
        return [(2 * estimate_plan(p, system).latency_s, 1.0) for p in plans]

    result = search("tiny", "28_64_64", str(hardware), space, tracer, devices=8, budget=100)
    # the best traced is the first, 2 x e1; a plan of estimate e can trace no faster than
    # e x 2 / BOUND_MARGIN, so tracing goes on while e < BOUND_MARGIN x e1 and then stops
    from planning.plan_search import BOUND_MARGIN

    estimates = [o.estimate.latency_s for o in result.outcomes]
    expected = sum(1 for e in estimates if e * 2 / BOUND_MARGIN < 2 * estimates[0])
    assert 1 <= expected < len(estimates)
    assert len(result.traced) == expected and result.stopped.startswith("bound")
    assert result.best is result.outcomes[0]


# -- the CLI's errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--strategies", "megatron,bogus"], "--strategies: unknown bogus"),
    (["--patches", "0"], "--patches '0'"),
    (["--stages", "3"], "--stages 3: expected a divisor of the 8 devices"),
    (["--devices", "32"], "--devices 32: tx8-16 has 16 chip(s)"),
    (["--shape", "28_64"], "28_64"),
    (["--config", "nosuch"], "unknown model config 'nosuch'"),
    (["--hw", "nosuch-hw"], "nosuch-hw"),
    (["--budget", "0"], "--budget"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, fragment, tmp_path):
    base = ["--config", "tiny", "--devices", "8", "--work-dir", str(tmp_path / "w"),
            "-o", str(tmp_path / "best.toml")]
    result = CliRunner().invoke(plan_search_command, base + args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], lines


def test_an_existing_plan_file_is_not_overwritten_and_nothing_is_traced(tmp_path):
    best = tmp_path / "best.toml"
    best.write_text("# mine\n")
    result = CliRunner().invoke(plan_search_command, [
        "--config", "tiny", "--devices", "8", "--work-dir", str(tmp_path / "w"), "-o", str(best)])
    assert result.exit_code == 2 and "--force" in result.output
    assert best.read_text() == "# mine\n" and not (tmp_path / "w").exists()


# -- the real search on the tiny model --------------------------------------------------------------


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "planning.plan_search_cli", *args], cwd=cwd,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


@pytest.mark.slow
def test_search_finds_the_exhaustive_optimum_tracing_at_most_a_third(tmp_path):
    """Issue 25's check on a representative subset of the tiny space (the whole space, 57 plans
    and 102 stage traces, takes ~5 minutes: benchmarks/plan_search.py runs it): two strategy
    families (sequence-parallel ds_ulysses, tensor-parallel megatron_sp), every mesh of 8
    devices and of 4, flat and 2 stages, M = 1, 2, 4: 14 plans. The search traces first (at most
    a third), then the exhaustive run traces the rest into the same content-keyed cache."""
    pytest.importorskip("torch_xla")
    space = ["--config", "tiny", "--shape", "28_64_64", "--hw", "tx8-16", "--devices", "8",
             "--strategies", "ds_ulysses,megatron_sp", "--stages", "1,2", "--patches", "1,2,4",
             "--jobs", "2", "--work-dir", "cache"]
    plans = len(enumerate_plans("tiny", "28_64_64", 8, strategies=("ds_ulysses", "megatron_sp"),
                                stage_counts=(1, 2), patch_counts=(1, 2, 4)).plans)
    assert plans == 14
    searched = _run([*space, "--budget", str(plans // 3), "--validate", "0", "--json", "search.json",
                     "-o", "best.toml", "--plot", "front.png"], tmp_path)
    assert searched.returncode == 0, searched.stderr[-2000:]
    exhaustive = _run([*space, "--exhaustive", "--json", "all.json", "-o", "all.toml"], tmp_path)
    assert exhaustive.returncode == 0, exhaustive.stderr[-2000:]
    import json

    found = json.loads((tmp_path / "search.json").read_text())
    every = json.loads((tmp_path / "all.json").read_text())
    assert all(plan["traced"] for plan in every["plans"]) and len(every["plans"]) == plans
    fitting = [p for p in every["plans"]
               if p["traced"]["memory_bytes"] <= every["memory_limit_bytes"]]
    optimum = min(fitting, key=lambda p: p["traced"]["latency_s"])
    assert found["best"]["plan"] == optimum["plan"]
    assert found["best"]["traced"] == optimum["traced"]
    traced = [p for p in found["plans"] if p["traced"]]
    assert len(traced) <= plans / 3
    # the report: the answer, the front, each traced plan's estimate beside its traced figure
    assert f"best plan (traced): {optimum['plan']}" in searched.stdout
    assert "Spearman rank correlation" in searched.stdout
    for plan in traced:
        assert plan["plan"] in searched.stdout
    # the plan file is a pipeline TOML the tools read as is: analyze-pipeline on the cached
    # dumps of that plan gives the reported latency
    from hlo_analyzer.mapping.pipeline import analyze_pipeline, load_plan
    from plans.config import load_config_file

    best = tmp_path / "best.toml"
    config = load_config_file(best)
    dumps = [str(tmp_path / "cache" / "pipelines" / "dumps" / f"{config.dump_name(stage)}.mlir")
             for stage in range(config.num_stages)]
    analysis = analyze_pipeline(load_plan(str(best)), dumps, "tx8-16")
    assert analysis.step.inference_s == pytest.approx(optimum["traced"]["latency_s"])
    assert tomllib.loads(best.read_text())["strategy"] == config.strategy
    if (tmp_path / "front.png").exists():  # drawn when matplotlib is there (the plot extra)
        assert (tmp_path / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_says_why_plans_were_refused_and_ranks_no_fewer_than_three():
    from planning.plan_search_cli import render_report

    space = _space()
    reasons = {reason for _, reason in space.infeasible}
    assert space.infeasible and len(reasons) >= 2
    per_reason = {reason: sum(1 for _, r in space.infeasible if r == reason) for reason in reasons}

    def tracer(plans):
        return [(float(i + 1), 1e6) for i, _ in enumerate(plans)]

    two = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=2, jobs=2)
    text = render_report(two)
    for reason, count in per_reason.items():
        assert f"  {count} x {reason} (" in text, reason
    refused_section = text.split("refused by the tracer, by reason (plans):\n", 1)[1].split("\n\n")[0]
    assert len(refused_section.splitlines()) == len(reasons)
    # two traced plans: their rank correlation is +1 or -1 whatever the estimate: not printed
    assert len(two.traced) == 2 and two.spearman is None
    assert "Spearman rank correlation n/a (fewer than 3 traced plans)" in text
    three = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=3, jobs=3)
    assert len(three.traced) == 3 and three.spearman == pytest.approx(
        spearman([o.estimate.latency_s for o in three.traced], [o.traced_latency_s for o in three.traced]))
    assert "Spearman rank correlation n/a" not in render_report(three)


def test_the_report_counts_the_untraced_plans_it_lists():
    """A space traced whole lists no untraced plan (it said "best 10 of 0"); a larger one lists
    at most 10, and says how many of how many."""
    from planning.plan_search_cli import render_report

    space = _space()
    accepted = len(space.plans)

    def tracer(plans):
        return [(float(i + 1), 1e6) for i, _ in enumerate(plans)]

    whole = search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=accepted,
                   jobs=accepted, exhaustive=True)
    text = render_report(whole)
    assert "of 0" not in text
    assert text.rstrip().endswith("untraced plans: none (every plan the tracer accepts was traced)")
    one = render_report(search("tiny", "28_64_64", "tx8-16", space, tracer, devices=8, budget=1))
    listed = min(10, accepted - 1)
    assert f"untraced plans, best {listed} of {accepted - 1} by estimate" in one
    assert len(one.split("by estimate (never an answer):\n", 1)[1].splitlines()) == listed


def test_the_stage_server_answers_each_line_and_one_error_line_for_a_malformed_one():
    pytest.importorskip("torch_xla")
    from tracing.calibrate import serve

    answers: list[str] = []
    serve(["not json\n", "{}\n", "[]\n"], answers.append)
    assert answers[0].startswith("Error: ") and answers[1] == "Error: expected a JSON list of requests on one line"
    assert answers[2] == "done"


def test_the_tracer_freezes_what_it_loaded_so_that_its_forked_traces_never_walk_it():
    """``load_tracer`` ends with ``gc.freeze()``: the objects of torch and torch-xla (some
    450,000) are left out of every collection of the forked trace children, which would
    otherwise walk them and copy each page they touch (half the CPU of a tiny trace)."""
    pytest.importorskip("torch_xla")
    script = "import gc; from tracing.calibrate import load_tracer; load_tracer(); print(gc.get_freeze_count())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert int(done.stdout.split()[-1]) > 100_000


@pytest.mark.slow
def test_a_plans_stages_traced_in_one_process_are_the_dumps_trace_stage_writes(tmp_path):
    """The confirmation's stages traced by the search's one tracing process (``pretrace_stages``)
    are byte for byte the dumps ``trace-stage --pipeline FILE --stage k`` writes, each in a
    process of its own; the runner then finds them and traces nothing."""
    pytest.importorskip("torch_xla")
    from planning.plan_search import StageServer, pretrace_stages
    from planning.runner import Paths

    plan = Plan(PipelineCase("tiny", "28_64_64", PipelineShape(2, 2, "ds_ulysses"), 2, TINY.depth, mesh=(1, 2)))
    paths = Paths(work=tmp_path / "one", hardware="tx8-16")
    pretrace_stages([plan.case], paths, StageServer())
    ours = sorted((paths.pipelines / "dumps").glob("*.mlir"))
    assert len(ours) == 2
    own = tmp_path / "own"
    pipeline = paths.pipeline_file(plan.case)
    for stage in range(2):
        subprocess.run([sys.executable, "-m", "tracing.cli", "--pipeline", str(pipeline), "--stage", str(stage),
                        "-o", str(own), "--force"], check=True, capture_output=True, cwd=REPO_ROOT)
    for dump in ours:
        assert (own / dump.name).read_bytes() == dump.read_bytes(), dump.name
