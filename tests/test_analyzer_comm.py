"""Per-device bytes of every collective kind, with two group layouts, derived by hand."""

import pytest
from analyzer_samples import COLLECTIVES

from hardware.collectives import per_device_bytes
from hlo_analyzer import CommVisitor, RingLink, analyze, load_module_text
from hlo_analyzer.mlir import module_to_text, stablehlo_to_mhlo
from hlo_trace.errors import UnsupportedIRError


def comm_rows(source: str, **options):
    visitor = CommVisitor(**options)
    visitor.visit(load_module_text(source))
    return [(r.comm_kind, r.comm_bytes, r.comm_bytes_per_device, r.group_size, r.num_groups)
            for r in visitor.rows]


def test_ring_volumes_of_each_collective():
    assert comm_rows(COLLECTIVES) == [
        # all_gather 4x16 f32 -> 8x16 f32: M = 512 B gathered, n = 2: 512 * 1/2
        ("all_gather", 512, 256.0, 2, 2),
        # reduce_scatter of the full 8x16 f32 (512 B), groups {0,2},{1,3}: 512 * 1/2
        ("reduce_scatter", 512, 256.0, 2, 2),
        # all_to_all 4x16 bf16 = 128 B over 4: 128 * 3/4
        ("all_to_all", 128, 96.0, 4, 1),
        # collective_permute 4x16 f32: each sender sends its 256 B once
        ("collective_permute", 256, 256.0, 2, 4),
        # all_reduce 256 B in pairs: 2 * 256 * 1/2
        ("all_reduce", 256, 256.0, 2, 2),
        # all_reduce 256 B over all 4: 2 * 256 * 3/4
        ("all_reduce", 256, 384.0, 4, 1),
        # empty replica_groups = one group of mhlo.num_partitions (4) devices
        ("all_reduce", 256, 384.0, 4, 1),
    ]


def test_bruck_all_to_all_option():
    rows = comm_rows(COLLECTIVES, bruck=True)
    # 128 B over n = 4 with Bruck: 128 * log2(4) / 2 = 128
    assert rows[2] == ("all_to_all", 128, 128.0, 4, 1)


def test_per_device_bytes_formulas_for_a_group_of_eight():
    m = 8 * 1024
    assert per_device_bytes("all_reduce", 8, m) == 2 * m * 7 / 8
    assert per_device_bytes("all_gather", 8, m) == m * 7 / 8
    assert per_device_bytes("reduce_scatter", 8, m) == m * 7 / 8
    assert per_device_bytes("all_to_all", 8, m) == m * 7 / 8
    assert per_device_bytes("all_to_all", 8, m, bruck=True) == m * 3 / 2
    assert per_device_bytes("all_reduce", 1, m) == 0.0


def test_latency_from_link_bandwidth_and_hop_latency():
    link = RingLink(bandwidth_bytes_per_s=1e9, hop_latency_s=1e-6)
    report = analyze(load_module_text(COLLECTIVES), collective_time=link)
    first = report.rows[0]
    # all_gather over 2: 256 B / 1e9 B/s + (2-1) steps * 1 us
    assert first.comm_latency_s == pytest.approx(256e-9 + 1e-6)
    all_reduce_of_four = report.rows[5]
    # 384 B / 1e9 + 2*(4-1) steps * 1 us
    assert all_reduce_of_four.comm_latency_s == pytest.approx(384e-9 + 6e-6)
    assert report.comm_bytes_per_device == 256 + 256 + 96 + 256 + 256 + 384 + 384


def test_mhlo_collectives_give_the_same_volumes():
    mhlo_text = module_to_text(stablehlo_to_mhlo(load_module_text(COLLECTIVES)))
    assert '"mhlo.all_to_all"' in mhlo_text
    assert comm_rows(mhlo_text) == comm_rows(COLLECTIVES)


def test_empty_groups_without_a_device_count_is_a_clear_error():
    source = COLLECTIVES.replace("attributes {mhlo.num_partitions = 4 : i32} ", "")
    with pytest.raises(UnsupportedIRError, match="empty replica_groups"):
        comm_rows(source)


def test_uneven_replica_groups_are_rejected():
    source = COLLECTIVES.replace(
        "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>}\n       : (tensor<4x16xf32>) -> tensor<4x16xf32>",
        "dense<[[0, 1, 2], [3, -1, -1]]> : tensor<2x3xi64>}\n       : (tensor<4x16xf32>) -> tensor<4x16xf32>",
    )
    assert "[3, -1, -1]" in source
    with pytest.raises(UnsupportedIRError, match="different sizes"):
        comm_rows(source)


def test_all_reduce_then_dynamic_slice_counts_as_reduce_scatter():
    """two_dimension's reduce-scatters after proj/fc2: XLA's CPU backend writes each as an
    all-reduce of the (128 tokens x 64 hidden) bf16 partial sums over the 2 devices of y,
    followed by a dynamic_slice keeping 32 of the 64 features. 6 of them per block pair (two
    projections and an MLP in each of the spatial and temporal blocks), each sending
    128*64*2 B * (2-1)/2 = 8192 B per device."""
    from pathlib import Path

    dump = (Path(__file__).resolve().parent.parent / "dumps" / "stablehlo"
            / "tiny_28_64_64_two_dimension_2x2_stage1_pairs1-1.mlir")
    report = analyze(dump)
    scatters = [r for r in report.rows if r.comm_kind == "reduce_scatter"]
    assert [(r.op, r.comm_bytes, r.group_size, r.comm_bytes_per_device) for r in scatters] == [
        ("stablehlo.all_reduce", 128 * 64 * 2, 2, 8192.0)] * 6
