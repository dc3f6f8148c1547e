"""Collectives as NCCL runs them (hardware/nccl.py): every expected value is worked out by hand
from the rows of hardware/data/nccl/8xa100-40gb.toml, quoted where used.

nccl-tests: time = size x factor / busbw, factor 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all; the table was measured on n = 8 (factors 1.75, 0.875).
"""

import dataclasses
import math
from pathlib import Path

import pytest

from hardware import collective_time_s, load_system, model_assumptions
from hardware.nccl import bus_bandwidth, load_nccl_table
from hlo_trace.errors import InputFileError

TABLE_PATH = Path(__file__).resolve().parent.parent / "hardware" / "data" / "nccl" / "8xa100-40gb.toml"
A100 = load_system("8xa100")
H100 = load_system("8xh100")
MIB, GIB = 2**20, 2**30


def test_the_nvswitch_systems_carry_the_table_and_tx8_does_not():
    for name, scale in (("8xa100", 1.0), ("8xa100-40gb", 1.0), ("8xh100", 1.5), ("8xh200", 1.5)):
        system = load_system(name)
        assert system.nccl_table is not None and system.nccl_table.name == "8xa100-40gb"
        assert system.nccl_busbw_scale == scale
    assert load_system("tx8-16").nccl_table is None
    assert model_assumptions(H100).nccl_table["busbw_scale"] == 1.5
    assert model_assumptions(load_system("tx8-16")).nccl_table is None


def test_a_message_at_a_row_takes_the_rows_bus_bandwidth():
    # all_reduce row [1048576, 74.78, 24.54]: 1048576 x 1.75 / 24.54 GB/s = 74.77 us.
    assert bus_bandwidth(A100.nccl_table.curve("all_reduce"), MIB) == 24.54e9
    assert collective_time_s("all_reduce", 8, MIB, A100) == pytest.approx(MIB * 1.75 / 24.54e9)
    # all_reduce row [1073741824, 8159.5, 230.29]
    assert collective_time_s("all_reduce", 8, GIB, A100) == pytest.approx(GIB * 1.75 / 230.29e9)
    # all_to_all row [67108864, 396.8, 147.99]
    assert collective_time_s("all_to_all", 8, 64 * MIB, A100) == pytest.approx(64 * MIB * 0.875 / 147.99e9)


def test_between_rows_the_bus_bandwidth_is_log_log_interpolated():
    # Halfway in log(size) between [1048576, .., 24.54] and [2097152, .., 39.26]: the geometric
    # mean of the two bandwidths, sqrt(24.54 x 39.26) = 31.04 GB/s.
    size = MIB * math.sqrt(2)
    busbw = math.sqrt(24.54 * 39.26) * 1e9
    assert busbw == pytest.approx(31.04e9, rel=1e-3)
    assert collective_time_s("all_reduce", 8, size, A100) == pytest.approx(size * 1.75 / busbw)
    # 3 MiB between [2097152, .., 39.26] and [4194304, .., 65.52]: log2(1.5) = 0.585 of the way,
    # 39.26 x (65.52 / 39.26) ** 0.585 = 39.26 x 1.349 = 52.97 GB/s.
    busbw = 39.26e9 * (65.52 / 39.26) ** math.log2(1.5)
    assert busbw == pytest.approx(52.97e9, rel=1e-3)
    assert collective_time_s("all_reduce", 8, 3 * MIB, A100) == pytest.approx(3 * MIB * 1.75 / busbw)


def test_small_messages_take_the_measured_latency_floor():
    # First all_reduce row [32768, 36.65, 1.56]: 32768 x 1.75 / 1.56 GB/s = 36.76 us, the time of
    # any smaller message (the log's rows from 4 B to 16 KiB took 34.5-36.2 us).
    floor = 32768 * 1.75 / 1.56e9
    assert floor == pytest.approx(36.76e-6, rel=1e-3)
    for size in (8, 1024, 16384, 32768):
        assert collective_time_s("all_reduce", 8, size, A100) == pytest.approx(floor)
    # all_to_all's first row [131072, 87.35, 1.31]: 87.55 us, more than twice all-reduce's floor.
    assert collective_time_s("all_to_all", 8, 4096, A100) == pytest.approx(131072 * 0.875 / 1.31e9)
    # 8xh100: every bus bandwidth x 1.5, so the floor is 36.76 / 1.5 = 24.5 us.
    assert collective_time_s("all_reduce", 8, 1024, H100) == pytest.approx(floor / 1.5)


def test_all_to_all_has_its_own_curve():
    # 64 MiB on 8 GPUs: all_to_all [67108864, 396.8, 147.99], all_gather [67108864, 379.7, 154.65]
    # (the same factor 0.875, a different measurement), all_reduce [67108864, 584.5, 200.91].
    size = 64 * MIB
    all_to_all = collective_time_s("all_to_all", 8, size, A100)
    assert all_to_all == pytest.approx(size * 0.875 / 147.99e9)  # 396.8 us
    assert collective_time_s("all_gather", 8, size, A100) == pytest.approx(size * 0.875 / 154.65e9)  # 379.5 us
    assert collective_time_s("all_reduce", 8, size, A100) == pytest.approx(size * 1.75 / 200.91e9)  # 584.6 us
    assert collective_time_s("reduce_scatter", 8, size, A100) == pytest.approx(size * 0.875 / 164.89e9)


def test_another_group_size_keeps_the_bus_bandwidth_and_the_floor():
    # 4 GPUs, 64 MiB all-reduce: factor 2 x 3/4 = 1.5 at the 8-GPU row's 200.91 GB/s.
    assert collective_time_s("all_reduce", 4, 64 * MIB, A100) == pytest.approx(64 * MIB * 1.5 / 200.91e9)
    # 2 GPUs, 1 GiB all-gather: factor 1/2 at [1073741824, 4413.4, 212.88].
    assert collective_time_s("all_gather", 2, GIB, A100) == pytest.approx(GIB * 0.5 / 212.88e9)
    # 2 GPUs, 64 KiB all-reduce: 65536 x 1 / 3.03 GB/s = 21.6 us, under the 36.76 us floor.
    assert collective_time_s("all_reduce", 2, 65536, A100) == pytest.approx(32768 * 1.75 / 1.56e9)
    # Concurrent groups use their own switch ports: the same time as one group alone.
    pairs = [[i, i + 4] for i in range(4)]
    assert (collective_time_s("all_gather", 2, GIB, A100, devices=[0, 4], concurrent_groups=pairs)
            == collective_time_s("all_gather", 2, GIB, A100))


def test_beyond_the_last_row_the_peak_holds_and_h100_scales_it():
    # 16 GiB all-reduce: the last row's 235.26 GB/s (8589934592 B).
    assert collective_time_s("all_reduce", 8, 16 * GIB, A100) == pytest.approx(16 * GIB * 1.75 / 235.26e9)
    # 8xh100, 1 GiB all-reduce: 230.29 x 1.5 = 345.4 GB/s.
    assert collective_time_s("all_reduce", 8, GIB, H100) == pytest.approx(GIB * 1.75 / (230.29e9 * 1.5))


def test_nothing_to_move_takes_no_time_and_permute_keeps_the_port_model():
    assert collective_time_s("all_reduce", 1, GIB, A100) == 0.0
    assert collective_time_s("all_to_all", 8, 0, A100) == 0.0
    # collective_permute of 1e8 B: through one 300 GB/s port, one step of 2 us.
    assert collective_time_s("collective_permute", 2, 1e8, A100) == pytest.approx(1e8 / 300e9 + 2e-6)


def test_the_rows_reproduce_the_measured_times():
    """Each row's time was transcribed apart from its busbw: the model gives the logged time at
    every row to within the rounding of busbw (under 0.4%) or, where the log dips below its first
    row (all-to-all: 86.58 us at 512 KiB), the floor (87.55 us, 1.1% above)."""
    table = load_nccl_table(TABLE_PATH)
    for curve in table.curves:
        for size, logged in zip(curve.sizes_bytes, curve.times_s, strict=True):
            predicted = collective_time_s(curve.kind, 8, size, A100)
            assert predicted == pytest.approx(logged, rel=0.012), (curve.kind, size)


# -- bad files ------------------------------------------------------------------------------------------
GOOD = TABLE_PATH.read_text()


def _table(tmp_path, text):
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("old", "new", "message"), [
    ('kind = "nccl_table"', 'kind = "system"', r"field 'kind': expected 'nccl_table'"),
    ("group_size = 8", "group_size = 1", r"field 'group_size': expected an integer of at least 2"),
    ('columns = ["size (B)", "time (us)", "busbw (GB/s)"]', 'columns = ["size", "time", "busbw"]', r"field 'columns'"),
    ("[65536, 37.82, 3.03]", "[65536, 37.82, 30.3]", r"field 'all_reduce.rows\[1\]': time 37.82 us and busbw 30.3 GB/s disagree"),
    ("[65536, 37.82, 3.03]", "[16384, 37.82, 3.03]", r"field 'all_reduce.rows\[1\]': sizes must increase"),
    ("[65536, 37.82, 3.03]", "[65536, -37.82, 3.03]", r"field 'all_reduce.rows\[1\]': expected a positive number"),
    ("[65536, 37.82, 3.03]", "[65536, 37.82]", r"field 'all_reduce.rows\[1\]': expected \[size \(B\), time \(us\), busbw \(GB/s\)\]"),
    ("[all_to_all]", "[alltoall]", r"field 'alltoall': unknown field"),
])
def test_a_bad_table_names_the_field(tmp_path, old, new, message):
    assert old in GOOD
    with pytest.raises(InputFileError, match=message):
        load_nccl_table(_table(tmp_path, GOOD.replace(old, new, 1)))


def _system(tmp_path, extra, topology='topology = "switch"'):
    (tmp_path / "t.toml").write_text(GOOD)
    path = tmp_path / "s.toml"
    path.write_text(f'kind = "system"\nname = "s"\nchip = "a100-sxm"\nchip_count = 8\n{topology}\n'
                    f'link_bandwidth = "300 GB/s"\nhop_latency = "2 us"\n{extra}')
    return path


def test_a_system_file_loads_its_table_relative_to_itself(tmp_path):
    system = load_system(_system(tmp_path, 'nccl_table = "t.toml"\nnccl_busbw_scale = 2\n'))
    assert system.nccl_table.name == "8xa100-40gb" and system.nccl_busbw_scale == 2.0
    # 2 x 230.29 GB/s at 1 GiB
    assert collective_time_s("all_reduce", 8, GIB, system) == pytest.approx(GIB * 1.75 / (2 * 230.29e9))


@pytest.mark.parametrize(("extra", "topology", "message"), [
    ('nccl_table = "missing.toml"\n', 'topology = "switch"', r"field 'nccl_table': no file 'missing.toml'"),
    ('nccl_table = "t.toml"\n', 'topology = "ring"', r"field 'nccl_table': .*topology must be 'switch'"),
    ("nccl_busbw_scale = 1.5\n", 'topology = "switch"', r"field 'nccl_busbw_scale': given without an 'nccl_table'"),
    ('nccl_table = "t.toml"\nnccl_busbw_scale = 0\n', 'topology = "switch"', r"field 'nccl_busbw_scale': expected a positive number"),
])
def test_a_bad_system_reference_names_the_field(tmp_path, extra, topology, message):
    with pytest.raises(InputFileError, match=message):
        load_system(_system(tmp_path, extra, topology))


def test_the_port_model_is_what_the_table_replaces():
    # Without the table the 8xa100 all-reduce of 1 GiB is 2 x 7/8 GiB through a 300 GB/s port
    # plus 14 steps of 2 us: 6.29 ms; NCCL measured 8.16 ms.
    port = dataclasses.replace(A100, nccl_table=None)
    assert collective_time_s("all_reduce", 8, GIB, port) == pytest.approx(1.75 * GIB / 300e9 + 28e-6)
    assert collective_time_s("all_reduce", 8, GIB, A100) == pytest.approx(8159.5e-6, rel=1e-3)
