"""The text report's small points (issue 35): runs of identical block pairs in one row, time
beside FLOPs in ``--by block``, memory in binary units as the chip files state it, and ``--hw``'s
help naming the network a chip name stands for."""

from __future__ import annotations

import csv
import io
import json
import re
import tomllib
from pathlib import Path

import pytest

from hardware.spec import load_chip
from hardware.systems import default_network
from hlo_analyzer.cli import analyze_command
from hlo_analyzer.table import collapsed_pair_rows
from hlo_trace.cli import run_click

REPO_ROOT = Path(__file__).resolve().parent.parent
SPLIT = REPO_ROOT / "dumps" / "split"
#: two block pairs on one device: the pairs' kernels are the same ops on the same shapes
NONE_PAIRS = SPLIT / "tiny_102_256_256_none_1x1_stage0_pairs0-1.mlir"
MEGATRON_PAIRS = SPLIT / "tiny_102_256_256_megatron_2x2_stage0_pairs0-1.mlir"


def analyze(capsys, *args) -> str:
    code = run_click(analyze_command, [str(a) for a in args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def pair_table(text: str) -> list[list[str]]:
    lines = text.split("by block pair (traced ops):\n", 1)[1].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("    ") or line.startswith("     "):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_runs_of_pairs_that_print_the_same_are_one_row():
    same, other = ["37", "1.4 ms"], ["37", "1.5 ms"]
    rows = [(None, ["23", "0.2 ms"]), (0, same), (1, same), (2, same), (3, other), (4, same),
            (6, same)]
    assert collapsed_pair_rows(rows) == [
        ["outside", "23", "0.2 ms"], ["0-2 (x3)", *same], ["3", *other], ["4", *same],
        ["6", *same]]  # 4 and 6 are not consecutive pairs
    assert collapsed_pair_rows([]) == []


def test_a_stage_whose_pairs_cost_the_same_prints_one_row_for_them(capsys):
    document = json.loads(analyze(capsys, NONE_PAIRS, "--hw", "tx8", "--format", "json"))
    pairs = {p["pair"]: p for p in document["mapping"]["pairs"]}
    assert pairs[0]["kernels"] == pairs[1]["kernels"]
    assert pairs[0]["seconds_by_kind"] == pytest.approx(pairs[1]["seconds_by_kind"], rel=1e-6)
    rows = pair_table(analyze(capsys, NONE_PAIRS, "--hw", "tx8"))
    assert [row[0] for row in rows] == ["outside", "0-1 (x2)"]
    assert rows[1][1] == str(pairs[0]["kernels"])


def test_pairs_that_differ_keep_their_own_rows(capsys):
    # megatron's two pairs differ in the last digits of their flash-attention time (the JSON)
    document = json.loads(analyze(capsys, MEGATRON_PAIRS, "--hw", "tx8", "--format", "json"))
    pairs = {p["pair"]: p for p in document["mapping"]["pairs"]}
    assert pairs[0]["seconds_by_kind"] != pairs[1]["seconds_by_kind"]
    rows = pair_table(analyze(capsys, MEGATRON_PAIRS, "--hw", "tx8"))
    assert [row[0] for row in rows] == ["outside", "0", "1"]


def test_by_block_gives_each_gemm_the_time_of_the_kernel_that_runs_it(capsys):
    document = json.loads(analyze(capsys, NONE_PAIRS, "--hw", "tx8", "--format", "json"))
    kernels = document["mapping"]["kernels"]
    records = list(csv.DictReader(io.StringIO(
        analyze(capsys, NONE_PAIRS, "--hw", "tx8", "--by", "block", "--format", "csv"))))
    labels = {(label["index"], name): positions for label in document["blocks"]["labels"]
              for name, positions in label["ops"].items()}
    assert len(records) == sum(len(p) for p in labels.values())
    for record in records:
        positions = labels[(int(record["block"]), record["label"])]
        [kernel] = [k for k in kernels if k["position"] == int(record["kernel"])]
        assert set(kernel["hlo_positions"]) & set(positions), record
        assert float(record["kernel_latency_s"]) == kernel["latency_s"]
    # an attention's two GEMMs run in one flash-attention kernel: one time, listed under both
    by_label = {(r["block"], r["label"]): r for r in records}
    scores, values = by_label[("0", "scores")], by_label[("0", "values")]
    assert scores["kernel"] == values["kernel"] and "flash_attention" in scores["kernel_name"]
    text = analyze(capsys, NONE_PAIRS, "--hw", "tx8", "--by", "block")
    header = next(line for line in text.splitlines() if line.startswith("block "))
    assert header.index("FLOPs") < header.index("time") < header.index("kernel")


def test_memory_is_in_binary_units_and_the_capacity_is_the_chip_files(capsys):
    # tx8.toml states its DRAM as "16 GiB": the report says 16.00 GiB, not 17.18 GB
    stated = tomllib.loads((REPO_ROOT / "hardware" / "data" / "tx8.toml").read_text())
    assert stated["dram_capacity"] == "16 GiB"
    text = analyze(capsys, MEGATRON_PAIRS, "--hw", "tx8")
    memory = text.split("Memory per device:\n", 1)[1].split("\nUnhandled", 1)[0]
    assert re.search(r"capacity\s+16\.00 GiB\s+fits", memory), memory
    assert not re.search(r"\d (k|M|G)B\b", memory), memory
    total = json.loads(analyze(capsys, MEGATRON_PAIRS, "--hw", "tx8", "--format", "json"))["memory"]["total_bytes"]
    assert f"{total / 2**20:.2f} MiB" in memory


def test_hw_help_names_the_network_a_chip_name_stands_for(capsys):
    assert run_click(analyze_command, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    claims = re.findall(r"--hw (\S+) on (?:an? )?(\d+)(?:-device dump| devices) is (\d+) .*? on (\S+?)'s", text)
    claims += re.findall(r"--hw (\S+) on (\d+) devices (\d+) \S+ on (\S+?)'s", text)
    assert {claim[0] for claim in claims} == {"tx8", "h100-sxm"}, text
    for chip, devices, chips, system in claims:
        assert devices == chips
        assert default_network(load_chip(chip)).name == system


def test_the_headline_comes_first_how_long_and_where(capsys):
    """The text report opens with the answer: the total time (the JSON's), the step's split by
    kind, the memory verdict and the heaviest kernels (grouped by name and shapes here from the
    JSON's kernel list), before the tables."""
    document = json.loads(analyze(capsys, MEGATRON_PAIRS, "--hw", "tx8", "--format", "json"))
    text = analyze(capsys, MEGATRON_PAIRS, "--hw", "tx8")
    lines = text.splitlines()
    totals, kernels = document["mapping"]["totals"], document["mapping"]["kernels"]
    first = lines[2].split()
    assert first[3] == "tx8x4" and seconds_of(first[0], first[1]) == pytest.approx(totals["inference_latency_s"], rel=1e-3)
    step = lines[3].split()
    assert step[:2] == ["one", "step"] and seconds_of(step[2], step[3].rstrip(":")) == pytest.approx(
        totals["step_latency_s"], rel=1e-3)
    shares = dict(part.rsplit(" ", 1) for part in lines[3].split(": ", 1)[1].split(", "))
    assert shares.keys() == {kind for kind, value in totals["seconds_by_kind"].items() if value > 0}
    assert sum(int(v.rstrip("%")) for v in shares.values()) == pytest.approx(100, abs=len(shares))
    assert "fits" in lines[5] and lines[5].startswith("  memory per device")
    groups: dict[tuple[str, str], list[float]] = {}
    for kernel in kernels:
        groups.setdefault((kernel["name"], kernel["shapes"]), []).append(kernel["latency_s"])
    (name, shapes), times = max(groups.items(), key=lambda item: sum(item[1]))
    heaviest = lines[lines.index(next(line for line in lines if "heaviest of" in line)) + 3].split()
    assert (heaviest[0], heaviest[3]) == (name[:40], str(len(times)))
    assert text.index("heaviest of") < text.index("category  ops")


def seconds_of(number: str, unit: str) -> float:
    return float(number) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]


def test_without_a_chip_the_headline_is_the_work(capsys):
    text = analyze(capsys, MEGATRON_PAIRS)
    assert text.splitlines()[2].startswith("  work (per device): ") and "(times: --hw CHIP)" in text.splitlines()[2]
