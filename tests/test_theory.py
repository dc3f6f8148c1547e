"""The analytic per-strategy formulas (models.opensora.theory) and the theory table script."""

import subprocess
import sys
from pathlib import Path

import pytest

from hlo_trace.errors import UsageError
from models.opensora import theory
from models.opensora.config import get_config
from models.opensora.parallel import STRATEGY_NAMES, default_mesh
from models.opensora.theory import (
    ACTIVATION_STRATEGIES,
    NOTE_STRATEGIES,
    BlockDims,
    DeviceCountError,
    UnknownStrategyError,
    activation_per_device,
    block_gemm_flops,
    flops_per_device,
    layer_activation_bytes,
    layout_bytes_by_kind,
    layout_collectives,
    layout_gemm_flops_per_device,
)
from models.opensora.theory import note_communication_per_device as communication_per_device

REPO = Path(__file__).resolve().parent.parent
FULL = get_config("full")
REF = BlockDims.of(FULL, T=60, S=920)  # 204_640_360, B=2, h=1152, a=16, TOKEN=300, bf16
N_REF = 60 * 920


# -- the traced layouts, by hand (204_640_360, B=2, h=1152, TOKEN=300, bf16, 16 devices) -------
A = 2 * 2 * N_REF * 1152  # bytes of the whole (B, N, h) activation: 254,361,600
CAPTION = 2 * 2 * 300 * 1152  # bytes of one caption K or V (B*TOKEN, h): 1,382,400


@pytest.mark.parametrize(("strategy", "mesh", "expected"), [
    # 6 all-reduces of A over 16: 2*A*15/16 each.
    ("megatron", (1, 16), {"all_reduce": 6 * 2 * A * 15 / 16}),
    # 6 all-gathers + 6 reduce-scatters of the x-group's half A/2 over 8: A/2 * 7/8 each.
    ("megatron_sp", (2, 8), {"all_gather": 6 * A / 2 * 7 / 8, "reduce_scatter": 6 * A / 2 * 7 / 8}),
    # The same, plus 8 all-reduces over 8 of f32 (B/2, N, 1) statistics: 2 * 4*N * 7/8 each.
    ("two_dimension", (2, 8), {"all_gather": 6 * A / 2 * 7 / 8, "reduce_scatter": 6 * A / 2 * 7 / 8,
                               "all_reduce": 8 * 2 * 4 * N_REF * 7 / 8}),
    # 8 all-to-alls over 8 of the device's A/16: A/16 * 7/8 each (= 111,283,200 in all).
    ("ds_ulysses", (2, 8), {"all_to_all": 8 * A / 16 * 7 / 8}),
    # K and V around a ring of 8: 2*7 permutes of A/16; 4 caption all-gathers over 8.
    ("ring_attention", (2, 8), {"collective_permute": 14 * A / 16,
                                "all_gather": 4 * CAPTION * 7 / 8}),
    # ring 2 x ulysses 4: 8 all-to-alls over 4 of A/16, 2 permutes of A/16, 4 all-gathers over
    # the ring (2) of the caption's local heads C/4.
    ("usp", (2, 8), {"all_to_all": 8 * A / 16 * 3 / 4, "collective_permute": 2 * A / 16,
                     "all_gather": 4 * CAPTION / 4 / 2}),
    ("none", (1, 1), {}),
])
def test_layout_bytes_by_hand(strategy, mesh, expected):
    got = layout_bytes_by_kind(strategy, REF, mesh)
    assert got.keys() == expected.keys()
    for kind, volume in expected.items():
        assert got[kind] == pytest.approx(volume, rel=1e-12)
    assert set(got) <= set(theory.STRATEGY_TABLE[strategy].kinds)


def test_layout_collective_counts_and_usp_degrees():
    terms = {t.kind: t for t in layout_collectives("usp", REF, (2, 8), ring=4, ulysses=2)}
    assert terms["collective_permute"].count == 6 and terms["all_to_all"].group == 2
    assert layout_bytes_by_kind("ds_ulysses", REF, (2, 8))["all_to_all"] == pytest.approx(111_283_200)
    with pytest.raises(DeviceCountError, match="ring degree x Ulysses degree must equal the 8"):
        layout_collectives("usp", REF, (2, 8), ring=3)
    with pytest.raises(UnknownStrategyError, match="'tp'"):
        layout_collectives("tp", REF, (2, 8))


def test_layout_flops_repeat_only_the_caption_projection():
    block = block_gemm_flops(REF)
    assert layout_gemm_flops_per_device("megatron", REF, (1, 16)) == block / 16
    # Caption K/V projection, 4*B*TOKEN*h^2 per block, split 8 ways instead of 16.
    caption = 2 * 4 * 2 * 300 * 1152**2
    for strategy in ("megatron_sp", "two_dimension", "ds_ulysses", "ring_attention", "usp"):
        assert layout_gemm_flops_per_device(strategy, REF, (2, 8)) == pytest.approx(
            block / 16 + caption * (1 / 8 - 1 / 16))
    ratio = 16 * layout_gemm_flops_per_device("ds_ulysses", REF, (2, 8)) / block
    assert 1.0006 < ratio < 1.001  # the 0.07% the study reports


def test_final_layer_gathers_its_output_only_when_S_is_split():
    # 204_640_360 on 2x8: T = 60 is no multiple of 8, S is: the (1, N, 32) bf16 output of one
    # batch group is all-gathered over 8, 2*55200*32 * 7/8 bytes per device.
    (term,) = theory.final_layer_collectives("ds_ulysses", REF, (2, 8), out_features=32)
    assert term.kind == "all_gather" and term.bytes_per_device == 2 * N_REF * 32 * 7 / 8
    assert theory.final_layer_collectives("ds_ulysses", BlockDims.of(FULL, 120, 920), (2, 8), 32) == ()
    assert theory.final_layer_collectives("megatron", REF, (1, 16), 32) == ()
    # opensora_sp gathers the final layer's input (hidden h), whichever factor y divides
    (term,) = theory.final_layer_collectives("opensora_sp", BlockDims.of(FULL, 120, 920), (1, 8), 32)
    assert term.kind == "all_gather" and term.message_bytes == 2 * 2 * 120 * 920 * 1152


def test_strategy_table_meshes():
    assert STRATEGY_NAMES == ("none", "megatron", "megatron_sp", "two_dimension", "ds_ulysses",
                              "opensora_sp", "ring_attention", "usp", "dp")
    assert default_mesh("opensora_sp", 8) == (1, 8)  # OpenSora's group spans all devices
    assert default_mesh("megatron", 16) == (1, 16) and default_mesh("none", 16) == (1, 1)
    assert default_mesh("usp", 16) == (2, 8) and default_mesh("dp", 16) == (1, 16)
    with pytest.raises(UsageError, match="even count"):
        default_mesh("ds_ulysses", 15)
    with pytest.raises(UnknownStrategyError, match="'single'"):
        default_mesh("single", 16)


def test_megatron_is_24_BTSh_alpha():
    # Brief section 6: 6 all-reduces of 2*B*T*S*h bytes each, ring factor 2*(n-1)/n.
    assert communication_per_device("megatron", REF, 16) == pytest.approx(
        24 * 2 * N_REF * 1152 * 15 / 16)


def test_two_dimension_by_hand():
    # Mesh 2x8: per linear pair M->H->M, 2*q*(B*N*M*(ny-1) + M*H*(nx-1))/n bytes.
    B, h, q = 2, 1152, 2
    attn = 2 * q * (B * N_REF * h * 7 + h * h * 1) / 16
    mlp = 2 * q * (B * N_REF * h * 7 + h * 4 * h * 1) / 16
    assert communication_per_device("two_dimension", REF, 16) == pytest.approx(2 * (2 * attn + mlp))
    assert communication_per_device("two_dimension", REF, 16, mesh=(2, 8)) == pytest.approx(
        2 * (2 * attn + mlp))


def test_ulysses_by_hand():
    # Note 000: 8*alpha*b*s*h/n bytes per attention; a global (b, s, h) tensor costs q*alpha/n per
    # element. Two self-attentions (4 tensors of B*N*h), two cross-attentions (q, out of B*N*h,
    # k, v of B*TOKEN*h).
    elements = 2 * 4 * 2 * N_REF * 1152 + 2 * (2 * 2 * N_REF * 1152 + 2 * 2 * 300 * 1152)
    assert communication_per_device("ds_ulysses", REF, 16) == pytest.approx(elements * 2 * 15 / 16 / 16)
    # One self-attention of a (b, s, h) = (1, 1000, 8) layer at n=4 would be 8*alpha*bsh/n:
    small = BlockDims(T=10, S=100, batch=1, hidden=8, heads=4, token=0, mlp_ratio=4)
    per_attention = 8 * (3 / 4) * 1000 * 8 / 4
    assert communication_per_device("ds_ulysses", small, 4) == pytest.approx(
        2 * per_attention + 2 * per_attention / 2)  # a cross-attention moves only q and out


def test_ring_by_hand():
    # Note 004: 2*B*(TS + TOKEN)*h*(N-1)/N*2*2 bytes per block pair.
    assert communication_per_device("ring_attention", REF, 16) == pytest.approx(
        2 * 2 * (N_REF + 300) * 1152 * 15 / 16 * 2 * 2)


def test_usp_reduces_to_ulysses_and_ring():
    assert theory.comm_usp(REF, ulysses=16, ring=1) == pytest.approx(theory.comm_ds_ulysses(REF, 16))
    assert theory.comm_usp(REF, ulysses=1, ring=16) == pytest.approx(theory.comm_ring_attention(REF, 16))
    # Default mesh 2x8: ring on X (2), Ulysses on Y (8).
    assert communication_per_device("usp", REF, 16) == pytest.approx(theory.comm_usp(REF, 8, 2))


def test_one_device_sends_nothing_and_dp_sends_nothing():
    for strategy in ("megatron", "ds_ulysses", "ring_attention", "dp"):
        assert communication_per_device(strategy, REF, 1) == 0
    assert communication_per_device("dp", REF, 2) == 0


def test_block_flops_closed_form_matches_per_op_count():
    """Two derivations: the closed form here, the per-GEMM sum of models.opensora.flops."""
    from models.opensora.config import get_config
    from models.opensora.flops import gemm_flops
    from models.opensora.inputs import REFERENCE_SHAPES, geometry

    full = get_config("full")
    for shape in REFERENCE_SHAPES:
        geo = geometry(full, shape)
        dims = BlockDims.of(full, geo.T, geo.S)
        assert block_gemm_flops(dims) == gemm_flops(full, shape)["per_block"]["total"]
        for strategy in ("megatron", "ds_ulysses", "ring_attention", "usp", "two_dimension"):
            assert flops_per_device(strategy, dims, 16) == block_gemm_flops(dims) / 16


def test_activation_formulas_by_hand():
    b, s, h, a = 2, 1000, 1024, 16
    bsh = b * s * h
    assert layer_activation_bytes("none", b, s, h, a, 1) == pytest.approx(bsh * (34 + 5 * a * s / h))
    assert layer_activation_bytes("megatron", b, s, h, a, 8) == pytest.approx(
        bsh * (10 + 3 + 5 * a * s / (h * 8)))
    assert layer_activation_bytes("megatron_sp", b, s, h, a, 8) == pytest.approx(
        bsh / 8 * (34 + 5 * a * s / h))
    for strategy in ("ds_ulysses", "ring_attention"):
        assert layer_activation_bytes(strategy, b, s, h, a, 8) == pytest.approx(
            bsh * (34 / 8 + 5 * a * s / h))


def test_activation_on_one_device_is_strategy_independent():
    unsplit = activation_per_device("none", REF, 1)
    for strategy in ACTIVATION_STRATEGIES:
        assert activation_per_device(strategy, REF, 1) == pytest.approx(unsplit)
    assert activation_per_device("megatron_sp", REF, 16) == pytest.approx(unsplit / 16)


@pytest.mark.parametrize("strategy", ["megatron", "ds_ulysses"])
def test_heads_not_divisible_by_devices(strategy):
    with pytest.raises(DeviceCountError) as info:
        communication_per_device(strategy, REF, 12)
    message = str(info.value)
    assert isinstance(info.value, UsageError) and "\n" not in message
    assert "16 attention heads" in message and "12 devices" in message


def test_heads_not_divisible_in_activation_and_flops():
    with pytest.raises(DeviceCountError, match="12 devices"):
        activation_per_device("megatron", REF, 12)
    with pytest.raises(DeviceCountError, match="12 devices"):
        flops_per_device("megatron", REF, 12)


def test_dp_batch_and_bad_meshes():
    with pytest.raises(DeviceCountError, match="batch 2 over 16 devices"):
        communication_per_device("dp", REF, 16)
    with pytest.raises(DeviceCountError, match="mesh 4x8 has 32 devices, not 16"):
        communication_per_device("two_dimension", REF, 16, mesh=(4, 8))
    with pytest.raises(DeviceCountError, match="batch 2 over mesh X=4"):
        communication_per_device("two_dimension", REF, 16, mesh=(4, 4))
    with pytest.raises(DeviceCountError, match="device count 0"):
        communication_per_device("ring_attention", REF, 0)


@pytest.mark.parametrize("name", ["tensor_parallel", "Megatron", ""])
def test_unknown_strategy(name):
    with pytest.raises(UnknownStrategyError) as info:
        communication_per_device(name, REF, 16)
    assert isinstance(info.value, UsageError)
    assert repr(name) in str(info.value) and "megatron" in str(info.value)
    with pytest.raises(UnknownStrategyError, match=repr(name)):
        activation_per_device(name, REF, 16)


def test_every_formula_cites_its_note():
    for fn in (theory.block_gemm_flops, theory.comm_megatron, theory.comm_two_dimension,
               theory.comm_ds_ulysses, theory.comm_ring_attention, theory.comm_usp,
               theory.comm_dp, theory.layer_activation_bytes, theory.layout_switch_per_device):
        assert "note 00" in fn.__doc__.lower(), fn.__name__
    assert set(NOTE_STRATEGIES) == {"megatron", "two_dimension", "ds_ulysses", "ring_attention", "usp", "dp"}


def test_theory_does_not_import_torch():
    code = "import sys, models.opensora.theory; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO).returncode == 0


def run_table(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "theory_table.py"), *args],
                          check=False, capture_output=True, text=True, cwd=REPO)


def test_theory_table_prints_the_four_shapes():
    result = run_table()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| shape | T | S | N |") and len(lines) == 6
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert set(rows) == {"204_640_360", "408_640_360", "51_1280_720", "102_1280_720"}
    assert rows["204_640_360"][:3] == ["60", "920", "55200"]
    assert rows["51_1280_720"][:3] == ["15", "3600", "54000"]
    # Whole forward, by hand: 28 block pairs + embeddings + final layer (B=2, h=1152, N=55200).
    B, N, h, TOK, T, S = 2, 55200, 1152, 300, 60, 920
    block = 56 * B * N * h**2 + 8 * B * TOK * h**2 + 4 * B * N * h * (S + T) + 8 * (B * N) * (B * TOK) * h
    embeddings = (2 * B * N * h * 16 + 2 * (2 * B * 256 * h + 2 * B * h * h)
                  + 2 * B * TOK * 4096 * h + 2 * B * TOK * h * h + 2 * B * 6 * h * h)
    final = 2 * B * N * 32 * h
    assert rows["204_640_360"][3] == f"{(28 * block + embeddings + final) / 1e12:.2f}"
    assert rows["204_640_360"][4] == f"{block / 1e12:.3f}"
    assert rows["204_640_360"][5] == f"{24 * B * N * h * 15 / 16 / 1e9:.3f}"  # megatron, GB
    assert "n/a" in rows["204_640_360"]  # dp cannot split B=2 over 16 devices


def test_theory_table_help_and_errors():
    help_text = run_table("--help")
    assert help_text.returncode == 0 and "--devices" in help_text.stdout and "megatron" in help_text.stdout
    bad = run_table("--shape", "204x640")
    assert bad.returncode == 2 and bad.stderr.startswith("Error: bad video shape '204x640'")


def test_two_dimension_official_path_all_reduces_each_norm_twice():
    """two_dimension on (2, 8): each LayerNorm's mean and variance are summed over Y in float32,
    4 * B * N / X bytes each. The clean path has norm1 and norm2 in both blocks: 2 x 2 x 2 = 8
    all-reduces a pair; the official path computes each of them twice (t and t0 modulation): 16."""
    stats = 4 * REF.batch * REF.N / 2
    clean = {t.kind: t for t in layout_collectives("two_dimension", REF, (2, 8))}["all_reduce"]
    official = {t.kind: t for t in layout_collectives("two_dimension", REF, (2, 8), official=True)}["all_reduce"]
    assert (clean.count, official.count) == (8, 16)
    assert clean.group == official.group == 8 and official.bytes_per_device == pytest.approx(16 * stats * 2 * 7 / 8)
    assert layout_bytes_by_kind("two_dimension", REF, (2, 8), official=True)["all_reduce"] == pytest.approx(
        2 * layout_bytes_by_kind("two_dimension", REF, (2, 8))["all_reduce"])
    assert layout_bytes_by_kind("megatron", REF, (1, 16), official=True) == layout_bytes_by_kind("megatron", REF, (1, 16))
