"""Multi-node systems (issue 32, item 3): the loader, hierarchical collectives counted by hand on
small groups (bytes on each level), stage transfers between nodes, and the validation of the
bundled 4x8xh100 against published multi-node nccl-tests rows (validation only: no constant of
the system file was chosen from them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware import load_hardware
from hardware.collectives import collective_time_s, hierarchical_cost, node_system
from hardware.nccl import load_nccl_measurement
from hardware.pipeline import transfer_time_s
from hardware.systems import resolve_system
from hlo_trace.errors import InputFileError

DATA = Path(__file__).resolve().parents[1] / "hardware" / "data"

L = 100e9      # node link bandwidth, B/s
HOP = 1e-6     # node hop latency
NIC = 10e9     # NIC bandwidth
NET = 5e-6     # inter-node step latency
M = 1e6        # message bytes


def _write_cluster(tmp_path: Path, *, switch: str = "rail_optimized", oversubscription: float = 1.0,
                   nics: int = 2) -> Path:
    """2 nodes of 2 chips on a switch (no NCCL table), ``nics`` NICs of 10 GB/s per node."""
    (tmp_path / "node.toml").write_text(
        'kind = "system"\nname = "node2"\nchip = "h100-sxm"\nchip_count = 2\ntopology = "switch"\n'
        'link_bandwidth = "100 GB/s"\nhop_latency = "1 us"\n')
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'kind = "system"\nname = "2x2"\nnode = "node.toml"\nnode_count = 2\n[inter_node]\n'
        f'nics_per_node = {nics}\nnic_bandwidth = "10 GB/s"\nlatency = "5 us"\nswitch = "{switch}"\n'
        f'oversubscription = {oversubscription}\n')
    return path


@pytest.fixture
def cluster(tmp_path):
    return load_hardware(_write_cluster(tmp_path))


def test_loader_builds_the_system_of_nodes(cluster):
    assert cluster.chip_count == 4 and cluster.chips_per_node == 2
    network = cluster.inter_node
    assert network.node_count == 2 and network.node_of(3) == 1 and network.local_id(3) == 1
    assert network.nic_bytes_per_s(1) == NIC and network.nic_bytes_per_s(2) == 2 * NIC
    assert node_system(cluster).chip_count == 2 and node_system(cluster).inter_node is None


def test_bundled_multi_node_systems():
    h100 = load_hardware("4x8xh100")
    assert (h100.chip_count, h100.chips_per_node, h100.inter_node.nics_per_node) == (32, 8, 8)
    assert h100.inter_node.nic_bandwidth_bytes_per_s == 50e9 and h100.nccl_table is not None
    tx8 = load_hardware("tx8-64")
    assert (tx8.chip_count, tx8.chips_per_node, tx8.topology_rows, tx8.topology_cols) == (64, 16, 4, 4)
    # a multi-node system is no chip's default network: --hw h100-sxm on 16 devices keeps 8xh100's
    assert resolve_system("h100-sxm", 16).system.inter_node is None
    assert resolve_system("4x8xh100", 32).system.inter_node is not None


def test_all_reduce_over_two_nodes_by_hand(cluster):
    """[0,1,2,3]: k = 2 nodes, g = 2 members each. Inside: reduce-scatter and all-gather of M over
    2 chips of the switch, M/2 each way at 100 GB/s + 1 hop, each; between: each member
    all-reduces M/2 with its peer, 2*(M/2)*(1/2) = M/2 bytes, 2 members: M per node over 2 NICs,
    + 2 steps of 5 us. NCCL pipelines the levels: the slower one plus the faster one's latency."""
    cost = hierarchical_cost("all_reduce", [[0, 1, 2, 3]], M, cluster)
    assert cost.intra_phases == (("reduce_scatter", M), ("all_gather", M))
    assert cost.inter_kind == "all_reduce" and cost.inter_message_bytes == M / 2
    assert cost.nic_bytes_per_node == pytest.approx(M)
    intra = 2 * (M / 2 / L + HOP)
    inter = M / (2 * NIC) + 2 * NET
    assert cost.intra_s == pytest.approx(intra) and cost.inter_s == pytest.approx(inter)
    assert cost.seconds == pytest.approx(inter + 2 * HOP)
    assert collective_time_s("all_reduce", 4, M, cluster) == pytest.approx(cost.seconds)


def test_one_member_per_node_uses_that_members_nics(cluster):
    """[0,2]: one chip on each node, the ring of 2 nodes: 2*M*(1/2) = M over the one NIC the
    chip owns. The concurrent group [1,3] takes the node's other NIC: the same time."""
    alone = hierarchical_cost("all_reduce", [[0, 2]], M, cluster)
    assert alone.intra_phases == () and alone.nic_bytes_per_node == pytest.approx(M)
    assert alone.seconds == pytest.approx(M / NIC + 2 * NET)
    both = hierarchical_cost("all_reduce", [[0, 2], [1, 3]], M, cluster)
    assert both.nic_bytes_per_node == pytest.approx(2 * M)
    assert both.seconds == pytest.approx(alone.seconds)


def test_all_gather_and_reduce_scatter_by_hand(cluster):
    gather = hierarchical_cost("all_gather", [[0, 1, 2, 3]], M, cluster)
    # between: each member gathers M/2 from its peer ((M/2)*(1/2) sent), 2 members per node
    assert gather.nic_bytes_per_node == pytest.approx(M / 2)
    assert gather.intra_phases == (("all_gather", M),)
    scatter = hierarchical_cost("reduce_scatter", [[0, 1, 2, 3]], M, cluster)
    assert scatter.nic_bytes_per_node == pytest.approx(M / 2)
    assert scatter.intra_phases == (("reduce_scatter", M),)
    inter = (M / 2) / (2 * NIC) + NET
    assert gather.seconds == pytest.approx(inter + HOP)


def test_all_to_all_is_bounded_by_the_nics(tmp_path):
    """n = 4, g = 2: each member sends M/4 to each of the 4 ranks; M/2 of it leaves the node, so
    M per node over its 2 NICs. Rail-optimised: the half of that bound for the other rail first
    moves inside the node (PXN), so the node's all-to-all carries M/2 + M/4 per member."""
    (tmp_path / "a").mkdir()
    rail = load_hardware(_write_cluster(tmp_path / "a"))
    cost = hierarchical_cost("all_to_all", [[0, 1, 2, 3]], M, rail)
    assert cost.nic_bytes_per_node == pytest.approx(M)
    assert cost.intra_phases == (("all_to_all", pytest.approx(0.75 * M)),)
    assert cost.seconds == pytest.approx(M / (2 * NIC) + NET + HOP)
    (tmp_path / "b").mkdir()
    fat = load_hardware(_write_cluster(tmp_path / "b", switch="fat_tree", oversubscription=2.0))
    cost = hierarchical_cost("all_to_all", [[0, 1, 2, 3]], M, fat)
    assert cost.intra_phases == (("all_to_all", pytest.approx(0.5 * M)),)
    assert cost.seconds == pytest.approx(M / (2 * NIC / 2) + NET + HOP)


def test_a_group_inside_one_node_runs_on_the_node(cluster):
    node = node_system(cluster)
    assert collective_time_s("all_reduce", 2, M, cluster, devices=[2, 3]) == pytest.approx(
        collective_time_s("all_reduce", 2, M, node, devices=[0, 1]))
    assert collective_time_s("all_reduce", 2, M, cluster, devices=[2, 3]) == pytest.approx(2 * (M / 2 / L + HOP))


def test_collective_permute_across_nodes(cluster):
    cost = hierarchical_cost("collective_permute", [[0, 2]], M, cluster)
    assert cost.nic_bytes_per_node == M and cost.seconds == pytest.approx(M / NIC + NET)


def test_stage_transfer_between_nodes(cluster):
    # two pairs leave node 0 at once: M/2 each, sharing the node's 2 NICs
    assert transfer_time_s(M, [0, 1], [2, 3], cluster) == pytest.approx((M / 2) * 2 / (2 * NIC) + NET)
    # inside a node: the node's link
    assert transfer_time_s(M, [2], [3], cluster) == pytest.approx(M / L + HOP)


@pytest.mark.parametrize("text, field", [
    ('node = "node.toml"\nnode_count = 1\n[inter_node]\nnics_per_node = 1\nnic_bandwidth = "1 GB/s"\n'
     'latency = "1 us"\nswitch = "fat_tree"\n', "node_count"),
    ('node = "node.toml"\nnode_count = 2\n[inter_node]\nnic_bandwidth = "1 GB/s"\nlatency = "1 us"\n'
     'switch = "fat_tree"\n', "inter_node.nics_per_node"),
    ('node = "node.toml"\nnode_count = 2\n[inter_node]\nnics_per_node = 1\nnic_bandwidth = "1 GB/s"\n'
     'latency = "1 us"\nswitch = "torus"\n', "inter_node.switch"),
    ('node = "node.toml"\nnode_count = 2\n[inter_node]\nnics_per_node = 1\nnic_bandwidth = "1 GB/s"\n'
     'latency = "1 us"\nswitch = "fat_tree"\nspeed = 3\n', "inter_node.speed"),
    ('node = "node.toml"\nnode_count = 2\n', "inter_node"),
    ('node = "cluster.toml"\nnode_count = 2\n[inter_node]\nnics_per_node = 1\nnic_bandwidth = "1 GB/s"\n'
     'latency = "1 us"\nswitch = "fat_tree"\n', "node"),
])
def test_bad_multi_node_files_name_the_field(tmp_path, text, field):
    _write_cluster(tmp_path)
    path = tmp_path / "bad.toml"
    path.write_text('kind = "system"\nname = "bad"\n' + text)
    with pytest.raises(InputFileError, match=f"field '{field}'"):
        load_hardware(path)


# ---------------------------------------------------------------------------------------------
# Validation against published multi-node nccl-tests (hardware/data/nccl/4x8xh100-allreduce*.toml)
# ---------------------------------------------------------------------------------------------

#: (file, smallest size checked, tolerance on model / measured - 1): the agreement measured
#: when the model was written, stated, not fitted (docs/gpu.md, docs/sources.md).
VALIDATION = [("4x8xh100-allreduce", 8 << 20, 0.12), ("4x8xh100-allreduce", 1 << 30, 0.05),
              ("4x8xh100-allreduce-b", 1 << 30, 0.15)]


@pytest.mark.parametrize("name, smallest, tolerance", VALIDATION)
def test_all_reduce_against_published_multi_node_rows(name, smallest, tolerance):
    measured = load_nccl_measurement(DATA / "nccl" / f"{name}.toml")
    system = load_hardware("4x8xh100")
    assert measured.ranks == system.chip_count
    curve = measured.curves[0]
    ratios = [collective_time_s("all_reduce", measured.ranks, size, system) / seconds
              for size, seconds in zip(curve.sizes_bytes, curve.times_s, strict=True) if size >= smallest]
    assert ratios and max(abs(r - 1) for r in ratios) <= tolerance, ratios


def test_small_messages_are_latency_bound_and_overestimated_by_at_most_half():
    """Below 8 MiB the model adds the intra-node floors of the A100-derived table (2 x 24 us) to
    6 inter-node steps; the measured H100 run (NVLS, LL protocols) is faster: at most 1.5x."""
    measured = load_nccl_measurement(DATA / "nccl" / "4x8xh100-allreduce.toml")
    system = load_hardware("4x8xh100")
    curve = measured.curves[0]
    ratios = [collective_time_s("all_reduce", 32, size, system) / seconds
              for size, seconds in zip(curve.sizes_bytes, curve.times_s, strict=True) if size < 8 << 20]
    assert max(ratios) <= 1.5


def test_measurement_rows_are_checked(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('kind = "nccl_measurement"\nname = "x"\nsource = "s"\nnodes = 2\nranks_per_node = 8\n'
                    'columns = ["size (B)", "time (us)", "busbw (GB/s)"]\n'
                    '[all_reduce]\nrows = [[1048576, 10.0, 24.73]]\n')
    with pytest.raises(InputFileError, match="disagree"):
        load_nccl_measurement(path)
