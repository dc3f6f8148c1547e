"""Collective model: ring volumes, steps and hop latency on the chip-to-chip topology.

Hand numbers use the bundled tx8-16 default: 50 GB/s per link, 1 us per hop, 4x4 mesh.
"""

from __future__ import annotations

import dataclasses

import pytest

from hardware.collectives import (
    collective_time_s,
    hop_distance,
    per_device_bytes,
    ring_hops_per_step,
    ring_steps,
)
from hardware.spec import load_system

SYSTEM = load_system("tx8-16")
LINK = 50e9
HOP = 1e-6


@pytest.mark.parametrize(
    ("kind", "expected_bytes", "expected_steps"),
    [
        ("all_reduce", 2 * 1600 * 3 / 4, 6),
        ("all_gather", 1600 * 3 / 4, 3),
        ("reduce_scatter", 1600 * 3 / 4, 3),
        ("all_to_all", 1600 * 3 / 4, 3),
        ("collective_permute", 1600, 1),
    ],
)
def test_ring_formulas(kind, expected_bytes, expected_steps):
    assert per_device_bytes(kind, 4, 1600) == pytest.approx(expected_bytes)
    assert ring_steps(kind, 4) == expected_steps


def test_all_reduce_over_all_16_chips():
    # 2 * 1 GB * 15/16 = 1.875 GB at 50 GB/s = 37.5 ms; 30 steps on the 1-hop Hamiltonian ring of
    # the full 4x4 mesh = 30 us.
    assert collective_time_s("all_reduce", 16, 1e9, SYSTEM) == pytest.approx(0.0375 + 30e-6)


def test_group_spanning_two_hops_pays_more_latency():
    # The X groups of a 2x8 logical mesh are {i, i+8}: chips (0,0) and (2,0), two links apart.
    # all-gather of 1 MB: 0.5 MB / 50 GB/s = 10 us, 1 step x 2 hops x 1 us = 2 us.
    assert hop_distance(0, 8, SYSTEM) == 2
    assert collective_time_s("all_gather", 2, 1e6, SYSTEM, devices=[0, 8]) == pytest.approx(12e-6)
    assert collective_time_s("all_gather", 2, 1e6, SYSTEM, devices=[0, 1]) == pytest.approx(11e-6)


def test_ring_hops_on_mesh_rectangles_and_lines():
    assert ring_hops_per_step(list(range(8)), SYSTEM) == 1  # 2x4 rectangle
    assert ring_hops_per_step([0, 1, 2, 3], SYSTEM) == 3  # a row: closing the ring crosses 3 links
    torus = dataclasses.replace(SYSTEM, topology="torus2d")
    assert ring_hops_per_step([0, 1, 2, 3], torus) == 1  # wrap-around link
    switch = dataclasses.replace(SYSTEM, topology="switch")
    assert ring_hops_per_step([0, 5, 10], switch) == 1


def test_trivial_groups_and_bad_input():
    assert collective_time_s("all_reduce", 1, 1e9, SYSTEM) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time_s("broadcast", 2, 1, SYSTEM)
    with pytest.raises(ValueError, match="does not fit"):
        collective_time_s("all_reduce", 32, 1, SYSTEM)


def test_time_grows_with_bytes_and_group_size():
    sizes = [collective_time_s("all_reduce", n, 1e8, SYSTEM) for n in (2, 4, 8, 16)]
    assert sizes == sorted(sizes)
    assert collective_time_s("all_to_all", 8, 2e8, SYSTEM) > collective_time_s("all_to_all", 8, 1e8, SYSTEM)
