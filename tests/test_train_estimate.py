"""The training search's traced-kernel step (issue 32, item 1; ``planning.train_estimate``): the
1F1B composition by hand; and, with the trace extra, a traced pair's kernels split by when they
run (against the analyzer's own totals and its collectives by phase and traffic) and the
calibration's rescaled kernels against a trace at the plan's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from planning.plan_estimate import GroupCost
from planning.train_estimate import DUMPS_DIR, PairKey, compose_step, pair_stage

SHAPE = "68_256_64"  # T = 20, W = 16: calibrations 41_768_64 and 123_3840_64


def test_an_op_without_a_location_runs_in_the_first_phase_that_reads_it():
    """``hlo_analyzer.training.node_phases`` on a hand-made graph: the forward's unnamed cast of
    an argument and its copy of a forward value are forward work (by their location alone, the
    backward's: the derived recompute then left them out of the rerun); the backward's cast of
    a value the forward computed is backward work (by what it reads alone, the forward's); the
    copy of an optimizer result into the step's outputs is the optimizer's (a fused AdamW
    kernel ends in one: it ran once a micro-batch)."""
    import networkx as nx

    from hlo_analyzer.training import BACKWARD, FORWARD, OPTIMIZER, TrainingLayout, node_phases

    fwd, opt = "hlo_trace_forward.1/aten__mul.2/aten__mul @ m.py:3", "hlo_trace_optimizer.2/aten__mul.4/aten__mul @ t.py:9"
    nodes = [(0, "convert", [None], ""), (1, "multiply", [0], fwd), (2, "convert", [1], ""),
             (3, "multiply", [2], "aten__mul.7/aten__mul @ graph.py:841"), (4, "copy", [1], ""),
             (5, "add", [4, 1], fwd), (6, "multiply", [3], opt), (7, "copy", [6], ""), (8, "return", [5, 7], "")]
    graph = nx.DiGraph(producers={node: [p for p in operands if p is not None] for node, _, operands, _ in nodes},
                       walk_order=True)
    for node, name, operands, _ in nodes:
        graph.add_node(node, name=name, operands=operands)
        graph.add_edges_from((p, node) for p in operands if p is not None)
    layout = TrainingLayout((), (), "hlo_trace_forward", "hlo_trace_optimizer")
    phases = node_phases(graph, {node: location for node, _, _, location in nodes}, layout)
    assert [phases[node] for node in range(8)] == [FORWARD, FORWARD, BACKWARD, BACKWARD, FORWARD, FORWARD,
                                                    OPTIMIZER, OPTIMIZER]


def test_the_step_is_the_1f1b_slots_of_the_stage_plus_the_update_once():
    # one pair: 3 ms of kernels + 1 ms of collectives per micro-batch, 0.5 + 0.25 ms per step;
    # 4 pairs a stage, 2 stages, 4 micro-batches, 2 ms to cross the boundary both ways:
    # a slot is 4 * 4 + 2 = 18 ms, (4 + 2 - 1) = 5 slots = 90 ms, plus 4 * 0.75 = 3 ms
    groups = {"micro": GroupCost(3e-3, 1e-3), "update": GroupCost(0.5e-3, 0.25e-3)}
    step = compose_step(groups, pairs=4, stages=2, micro_batches=4, boundary_s=2e-3)
    assert step.step_s == pytest.approx(93e-3)
    assert step.compute_s == pytest.approx(4 * 4 * 3e-3)      # m x pairs x kernels
    assert step.comm_s == pytest.approx(4 * 4 * 1e-3)
    assert step.update_s == pytest.approx(3e-3)
    assert step.bubble_s == pytest.approx(18e-3)              # (P - 1) slots
    assert step.boundary_s == pytest.approx(5 * 2e-3)
    # one stage, one micro-batch: the pair's own step times the pairs
    flat = compose_step(groups, pairs=28, stages=1, micro_batches=1, boundary_s=0.0)
    assert flat.step_s == pytest.approx(28 * 4.75e-3)


def test_the_traced_pair_is_the_middle_stage_of_one_pair():
    assert pair_stage(28) == ("0-0,1-1,2-27", 1)
    assert pair_stage(2) == ("0-0,1-1", 1) and pair_stage(1) == ("0-0", 0)
    key = PairKey("full", "usp", (8, 2), 1, 2, True, 8)
    request = key.request("41_384_360", Path("/x"))
    assert (request["stage_ids"], request["stages"], request["batch"]) == ("0-0,1-1,2-27", [1], 8)
    assert request["train"] == {"zero": 2, "recompute": "full", "label": "train_zero2_recompute"}


@pytest.mark.slow  # three tiny training traces
@pytest.mark.trace
def test_a_traced_pair_splits_into_micro_batch_and_step_kernels_and_the_calibration_rescales(tmp_path):
    """usp on 2 x 2 with ZeRO-2 (one pair of the full model at a small shape, batch 2; at
    smaller shapes, 14_32_64, the calibration programs differ: an attention over 8 tokens is
    found as GEMMs at 41_96_64 and as a flash attention at 123_480_64, and the estimate falls
    back to the ideal one): the two groups
    cost what analyze-hlo's totals say of the whole program; the once-per-step group holds
    every optimizer-phase collective and the backward's gradient sums (all-reduce and
    reduce-scatter of parameter/gradient traffic), as many as the analyzer's training section
    counts; and the calibration's two small programs rescaled to the shape cost what the
    program traced at the shape costs."""
    pytest.importorskip("torch_xla")
    import json
    import subprocess
    import sys

    from hardware import load_system
    from hlo_analyzer import load_module
    from hlo_analyzer.mapping.kernel_list import sources_from_document
    from hlo_analyzer.training import measure_training, read_training_layout
    from planning.train_estimate import TrainKernels, analyze_pair, cost_groups, step_groups

    config = "full"
    system = load_system("4x8xh100")
    kernels = TrainKernels(tmp_path / "work", config, SHAPE, lock=None)  # tiny traces
    key = PairKey(config, "usp", (2, 2), 1, 2, False, 2)
    full = kernels.full(key, system)
    assert not isinstance(full, str), full
    dump = next((kernels.work / DUMPS_DIR / key.name(SHAPE)).glob("*.mlir"))
    root = Path(__file__).resolve().parents[1]
    analysed = subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(dump), "--hw", "4x8xh100",
                               "--format", "json"], cwd=root, capture_output=True, text=True)
    assert analysed.returncode == 0, analysed.stderr[-2000:]
    traced_step = json.loads(analysed.stdout)["mapping"]["totals"]["step_latency_s"]
    groups, memory = full
    assert sum(g.compute_s + g.comm_s for g in groups.values()) == pytest.approx(traced_step, rel=1e-9)

    program = analyze_pair(str(dump), system)
    split = measure_training(load_module(dump), read_training_layout(dump.with_suffix(".json")))
    once = sum(count for (phase, traffic, kind), (count, _) in split.comm.items()
               if phase == "optimizer" or (traffic == "param_grad" and kind in ("all_reduce", "reduce_scatter")))
    update, _ = sources_from_document(program.groups["update"])
    micro = [k for name in ("forward", "backward") for k in sources_from_document(program.groups[name])[0]]
    assert once > 0 and sum(1 for k in update if k.collective is not None) == once
    assert sum(1 for k in micro if k.collective is not None) == sum(c for c, _ in split.comm.values()) - once
    assert memory == {k: split.memory[k] for k in ("param", "grad", "optimizer_state", "activation")}

    estimate, basis = kernels.estimate(key, system)
    assert basis.startswith("traced kernels")
    direct = step_groups(cost_groups(program.groups, system))
    for name in ("micro", "update"):
        assert estimate[name].compute_s == pytest.approx(direct[name].compute_s, rel=0.05), name
        assert estimate[name].comm_s == pytest.approx(direct[name].comm_s, rel=0.05, abs=1e-12), name
