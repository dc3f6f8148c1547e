"""Collective times by topology and algorithm (hardware/collectives.py), derived by hand.

TX8 chips: 50 GB/s per link and direction, 1 us per hop, 100 GB/s DRAM; 4x4 grid, row-major.
8xa100 without its NCCL table: 300 GB/s per GPU port each way into NVSwitch, 2 us per step.
"""

import dataclasses

import pytest

from hardware import collective_time_s, load_system
from hardware.collectives import all_to_all_bisection_bound_s, bisection_links, route
from hlo_trace.errors import InputFileError

TX8_16 = load_system("tx8-16")


def variant(algorithm, *, dram=False, topology="mesh2d"):
    return dataclasses.replace(TX8_16, collective_algorithm=algorithm, transfers_through_dram=dram, topology=topology)


def test_unidirectional_ring_on_the_mesh():
    # all-reduce of 1.6 GB over 16: 2 * 1.6e9 * 15/16 = 3e9 B over one link each = 60 ms; the
    # 16 chips ride the 1-hop snake cycle: 30 steps x 1 us.
    assert collective_time_s("all_reduce", 16, 1.6e9, variant("ring")) == pytest.approx(0.060 + 30e-6)


def test_bidirectional_ring_halves_the_bytes_per_link():
    # half of 3e9 each way round: 1.5e9 B per directed link = 30 ms; same 30 steps.
    assert collective_time_s("all_reduce", 16, 1.6e9, variant("bidirectional_ring")) == pytest.approx(0.030 + 30e-6)


def test_per_dimension_on_a_2d_torus_and_mesh():
    """Rows then columns of the 4x4 grid, M = 1.6e9:
    row reduce-scatter: 1.2e9 per chip, half each way on the row ring -> 0.6e9 per link;
    column all-reduce of M/4: 2 * 0.4e9 * 3/4 = 0.6e9 per chip -> 0.3e9 per link;
    row all-gather: as the reduce-scatter. Torus (wrap links, 1 hop per step):
    12 + 6 + 12 = 30 ms, steps 3 + 6 + 3 = 12 x 1 us.
    Mesh: a row ring's closing edge runs back over the row's links (3 hops), so each directed
    link carries 1.2e9, 0.6e9, 1.2e9: 24 + 12 + 24 = 60 ms, steps x 3 hops = 36 us."""
    torus = variant("per_dimension", topology="torus2d")
    assert collective_time_s("all_reduce", 16, 1.6e9, torus) == pytest.approx(0.030 + 12e-6)
    assert collective_time_s("all_reduce", 16, 1.6e9, variant("per_dimension")) == pytest.approx(0.060 + 36e-6)
    # all-gather of M: rows gather M/4 (0.3e9 per chip), columns gather M (1.2e9 per chip):
    # torus links carry half of each: 3 ms + 12 ms; steps 3 + 3.
    assert collective_time_s("all_gather", 16, 1.6e9, torus) == pytest.approx(0.003 + 0.012 + 6e-6)


def test_switch_all_reduce_and_all_to_all():
    """The port model of a switch (the bundled 8xa100 times these kinds from its NCCL table,
    tests/test_nccl_model.py; here without it)."""
    system = dataclasses.replace(load_system("8xa100"), nccl_table=None)
    assert system.topology == "switch" and system.collective_algorithm == "switch"
    # 2 * 1.2e9 * 7/8 = 2.1e9 B through each GPU's 300 GB/s port = 7 ms; 14 steps x 2 us.
    assert collective_time_s("all_reduce", 8, 1.2e9, system) == pytest.approx(0.007 + 28e-6)
    # all-to-all of 0.8e9: each GPU sends 7 x 0.1e9 through its port = 2.333 ms; 7 steps x 2 us.
    # The bisection bound (4 x 4 pairs x 0.1e9 over 4 ports x 300 GB/s = 1.333 ms) is lower.
    assert collective_time_s("all_to_all", 8, 0.8e9, system) == pytest.approx(0.7e9 / 300e9 + 14e-6)
    assert all_to_all_bisection_bound_s(8, 0.8e9, system) == pytest.approx(1.6e9 / 1.2e12)
    assert route(2, 5, system) == [(2, -1), (-1, 5)]


def test_tx8_dram_bounds_a_bidirectional_ring():
    # all-gather of 1.6e9 over 16: each chip sends 1.5e9 (0.75e9 each way = 15 ms on the links)
    # and receives 1.5e9: 3e9 B through its 100 GB/s DRAM = 30 ms. 15 steps x 1 us.
    assert TX8_16.transfers_through_dram and TX8_16.collective_algorithm == "bidirectional_ring"
    assert collective_time_s("all_gather", 16, 1.6e9, TX8_16) == pytest.approx(0.030 + 15e-6)
    free = variant("bidirectional_ring", dram=False)
    assert collective_time_s("all_gather", 16, 1.6e9, free) == pytest.approx(0.015 + 15e-6)


def test_concurrent_pairs_share_the_middle_links():
    # Pairs {i, i+8} (2 rows apart): (0,c)->(2,c) and (1,c)->(3,c) both cross (1,c)->(2,c).
    # all-gather of 1e8: 0.5e8 per chip; alone 1 ms on the link (DRAM: 1e8 B = 1 ms),
    # with the 8 pairs at once 2 transfers on that link = 2 ms; 1 step x 2 hops.
    pairs = [[i, i + 8] for i in range(8)]
    alone = collective_time_s("all_gather", 2, 1e8, TX8_16, devices=[0, 8])
    shared = collective_time_s("all_gather", 2, 1e8, TX8_16, devices=[0, 8], concurrent_groups=pairs)
    assert alone == pytest.approx(0.001 + 2e-6)
    assert shared == pytest.approx(0.002 + 2e-6)


def test_all_to_all_meets_the_bisection_bound_on_the_mesh():
    """16 chips, M = 1.6e9, 1e8 per pair. Cut between rows 1 and 2: 8 x 8 pairs x 1e8 = 6.4e9 B
    each way over 4 links -> 32 ms. X-then-Y routing loads each middle vertical link with the
    16 flows into its column's lower half (1.6e9 B = 32 ms) and no link more. DRAM: 3e9 B per
    chip = 30 ms. Steps 15 x longest route 6 hops."""
    assert bisection_links(TX8_16) == 4
    assert all_to_all_bisection_bound_s(16, 1.6e9, TX8_16) == pytest.approx(0.032)
    assert collective_time_s("all_to_all", 16, 1.6e9, TX8_16) == pytest.approx(0.032 + 90e-6)


def test_algorithm_must_fit_the_topology(tmp_path):
    text = (tmp_path / "s.toml")
    text.write_text('kind = "system"\nname = "x"\nchip = "a100-sxm"\nchip_count = 8\ntopology = "switch"\n'
                    'collective_algorithm = "per_dimension"\nlink_bandwidth = "300 GB/s"\nhop_latency = "1 us"\n')
    with pytest.raises(InputFileError, match="collective_algorithm.*does not run on topology 'switch'"):
        load_system(text)
    text.write_text(text.read_text().replace('collective_algorithm = "per_dimension"\n', "transfers_through_dram = 1\n"))
    with pytest.raises(InputFileError, match="transfers_through_dram.*true or false"):
        load_system(text)
