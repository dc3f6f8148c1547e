"""Hardware descriptions: units, bundled files, and one-line errors for bad files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hardware.spec import (
    ChipSpec,
    SystemSpec,
    as_system,
    bundled_hardware_names,
    load_chip,
    load_hardware,
    load_system,
    one_node_system_chip,
)
from hardware.units import Dimension, parse_quantity
from hlo_trace.errors import InputFileError

TX8_TOML = (Path(__file__).resolve().parents[1] / "hardware" / "data" / "tx8.toml").read_text()


@pytest.mark.parametrize(
    ("text", "dimension", "expected"),
    [
        ("128 GB/s", Dimension.BANDWIDTH, 128e9),
        ("3 MB", Dimension.BYTES, 3e6),
        ("3 MiB", Dimension.BYTES, 3 * 2**20),
        ("0.01 us", Dimension.TIME, 1e-8),
        ("0.1us", Dimension.TIME, 1e-7),
        ("8 TFLOPS", Dimension.THROUGHPUT, 8e12),
        ("0.0625 TOPS", Dimension.THROUGHPUT, 6.25e10),
        ("3.35 TB/s", Dimension.BANDWIDTH, 3.35e12),
        ("1e3 B", Dimension.BYTES, 1000.0),
    ],
)
def test_units_parse_with_decimal_si_and_binary_iec_prefixes(text, dimension, expected):
    assert parse_quantity(text, dimension) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "dimension"),
    [("128 Gb/s", Dimension.BANDWIDTH), ("3", Dimension.BYTES), ("3 MB", Dimension.TIME), ("8 TFLOP", Dimension.THROUGHPUT)],
)
def test_units_reject_unknown_or_missing_units(text, dimension):
    with pytest.raises(ValueError):
        parse_quantity(text, dimension)


def test_tx8_matches_the_user_table():
    chip = load_hardware("tx8")
    assert isinstance(chip, ChipSpec)
    assert chip.tile_count == 16 and (chip.tile_grid_rows, chip.tile_grid_cols) == (4, 4)
    assert chip.sram_bytes_per_tile == 3 * 2**20
    assert chip.noc_bandwidth_bytes_per_s_per_link == 128e9
    assert chip.dram_bandwidth_bytes_per_s == 100e9
    assert chip.dram_latency_s == pytest.approx(0.1e-6)
    assert chip.gemm_flops_per_s_per_tile == 8e12
    assert chip.gemm_flops_per_s == 128e12
    assert chip.vector_flops_per_s_per_tile == 62.5e9
    assert chip.hop_latency_s == pytest.approx(0.01e-6)
    assert chip.sram_buffering_stages == 2


def test_tx8_16_system_and_its_chip():
    system = load_hardware("tx8-16")
    assert isinstance(system, SystemSpec)
    assert system.chip == load_hardware("tx8")
    assert system.chip_count == 16 and system.topology == "mesh2d"
    assert (system.topology_rows, system.topology_cols) == (4, 4)
    assert system.link_bandwidth_bytes_per_s > 0 and system.hop_latency_s > 0
    assert load_chip("tx8-16") == system.chip
    assert load_system("tx8").chip_count == 1


def test_every_bundled_file_loads_and_specs_are_frozen():
    names = bundled_hardware_names()
    assert {"tx8", "tx8-16", "h100-sxm", "h200-sxm", "a100-sxm"} <= set(names)
    for name in names:
        spec = load_hardware(name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.name = "changed"  # type: ignore[misc]


def test_gpu_h100_numbers_from_datasheet():
    gpu = load_hardware("h100-sxm")
    assert gpu.tile_count == 132
    # 989.4 TFLOPS dense BF16 over 132 SMs
    assert gpu.gemm_flops_per_s == pytest.approx(989.4e12, rel=1e-3)
    assert gpu.dram_bandwidth_bytes_per_s == 3.35e12


def test_load_by_path_and_relative_chip_reference(tmp_path):
    (tmp_path / "mychip.toml").write_text(TX8_TOML.replace('name = "tx8"', 'name = "mychip"'))
    (tmp_path / "ring.toml").write_text(
        'kind = "system"\nname = "ring8"\nchip = "mychip.toml"\nchip_count = 8\ntopology = "ring"\n'
        'link_bandwidth = "25 GB/s"\nhop_latency = "2 us"\n'
    )
    system = load_hardware(tmp_path / "ring.toml")
    assert system.chip.name == "mychip" and system.chip_count == 8
    assert system.link_bandwidth_bytes_per_s == 25e9
    assert as_system(system) is system


def _write_chip(tmp_path: Path, old: str, new: str) -> Path:
    assert old in TX8_TOML
    path = tmp_path / "bad.toml"
    path.write_text(TX8_TOML.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("old", "new", "field", "reason"),
    [
        ('dram_bandwidth = "100 GB/s"', "", "dram_bandwidth", "missing"),
        ('dram_bandwidth = "100 GB/s"', 'dram_bandwidth = "-100 GB/s"', "dram_bandwidth", "negative"),
        ('noc_link_bandwidth = "128 GB/s"', 'noc_link_bandwidth = "128 Gbit/s"', "noc_link_bandwidth", "unknown unit"),
        ('sram_per_tile = "3 MiB"', 'sram_per_tile = 3', "sram_per_tile", "unit"),
        ('gemm_granule = 16', 'gemm_granule = 16\nclock = "1 GHz"', "clock", "unknown field"),
        ('tile_grid = "4x4"', 'tile_grid = "4x3"', "tile_grid", "tile_count"),
        ('noc_topology = "mesh"', 'noc_topology = "torus"', "noc_topology", "expected one of"),
        ('dram_latency = "0.1 us"', 'dram_latency = "0.1 GB"', "dram_latency", "unknown unit"),
    ],
)
def test_bad_chip_files_give_one_line_naming_file_and_field(tmp_path, old, new, field, reason):
    path = _write_chip(tmp_path, old, new)
    with pytest.raises(InputFileError) as info:
        load_hardware(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert f"field '{field}'" in message
    assert reason in message


def test_bad_system_file_names_the_field(tmp_path):
    path = tmp_path / "sys.toml"
    path.write_text('kind = "system"\nname = "s"\nchip = "tx8"\nchip_count = 16\ntopology = "mesh2d"\n'
                    'topology_grid = "4x4"\nlink_bandwidth = "0 GB/s"\nhop_latency = "1 us"\n')
    with pytest.raises(InputFileError, match=r"field 'link_bandwidth': must be positive"):
        load_hardware(path)
    path.write_text('kind = "system"\nname = "s"\nchip = "nochip"\nchip_count = 2\ntopology = "ring"\n'
                    'link_bandwidth = "1 GB/s"\nhop_latency = "1 us"\n')
    with pytest.raises(InputFileError, match=r"field 'chip'"):
        load_hardware(path)


def test_unknown_name_and_broken_toml(tmp_path):
    with pytest.raises(InputFileError, match="no such hardware file or bundled name"):
        load_hardware("tx9")
    path = tmp_path / "broken.toml"
    path.write_text("kind = \n")
    with pytest.raises(InputFileError, match="not valid TOML"):
        load_hardware(path)
    path.write_text('name = "x"\n')
    with pytest.raises(InputFileError, match="field 'kind': missing"):
        load_hardware(path)


def test_a_one_node_systems_chip_read_alone_is_the_chip_of_the_whole_system():
    """``one_node_system_chip`` (what ``default_network`` reads of every bundled file) against
    the full loader: the same chip for each one-node system, None for chips and multi-node
    systems."""
    kinds = set()
    for name in bundled_hardware_names():
        whole = load_hardware(name)
        one_node = isinstance(whole, SystemSpec) and whole.inter_node is None
        kinds.add((isinstance(whole, SystemSpec), one_node))
        assert one_node_system_chip(name) == (whole.chip if one_node else None), name
    assert kinds == {(False, False), (True, True), (True, False)}  # chips, one-node, multi-node
