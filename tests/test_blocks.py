"""Block segmentation of the bundled tiny-config dumps, against dictionaries derived by hand.

Tiny config: h=64, 4 heads of 16, mlp 256, TOKEN=8; shape 28_64_64: T=28*5//17=8 frames,
latent 8x8 -> S=16 patches, N=128 tokens per sample; batch B=2 (dp: 4). All dumps are stage 1 of
``--stage-ids 0-0,1-1`` (one spatial+temporal pair) on a 2x2 mesh (none: 1x1, usp: 2x4), in bf16
(Q=2).
"""

from pathlib import Path

import pytest

from hlo_analyzer import load_module
from hlo_analyzer.blocks import NotSTDiTError, segment_blocks
from hlo_trace.examples import example_dump

DUMPS = Path(__file__).resolve().parent.parent / "dumps"

COMMON = {"S_KV_spt": 16, "D_QKV": 64, "H_A": 16, "H_O_spt": 64, "H_O_tmp": 64, "B_cro": 1,
          "H_O_cro": 64, "D_FU": 64, "H_FD": 64, "L": 1, "Q": 2}

EXPECTED = {
    # heads, hidden and mlp split 4 ways: qkv 3*64/4, 1 head, proj in 64/4, fc1 out 256/4;
    # attentions see the whole sequence: spatial batch B*T=16, temporal B*S=32; cross: all
    # B*N=256 queries against all B*TOKEN=16 caption tokens.
    "megatron": {"B_spt": 16, "S_Q_spt": 16, "H_QKV": 48, "N_A": 1, "D_O_spt": 16,
                 "B_tmp": 32, "S_Q_tmp": 8, "S_KV_tmp": 8, "D_O_tmp": 16,
                 "S_Q_cro": 256, "S_KV_cro": 16, "D_O_cro": 16, "H_FU": 64, "D_FD": 64},
    # batch over x (1 sample per device), hidden over y (2): qkv 96, 2 heads, proj in 32,
    # fc1 out 128; spatial batch 1*8, temporal 1*16; cross: one sample's 128 queries, all 16 keys.
    "two_dimension": {"B_spt": 8, "S_Q_spt": 16, "H_QKV": 96, "N_A": 2, "D_O_spt": 32,
                      "B_tmp": 16, "S_Q_tmp": 8, "S_KV_tmp": 8, "D_O_tmp": 32,
                      "S_Q_cro": 128, "S_KV_cro": 16, "D_O_cro": 32, "H_FU": 128, "D_FD": 128},
    # batch 4 over all 4 devices: whole weights and heads; spatial batch 1*8, temporal 1*16;
    # cross: one sample's 128 queries against every caption token, 4*8=32.
    "dp": {"B_spt": 8, "S_Q_spt": 16, "H_QKV": 192, "N_A": 4, "D_O_spt": 64,
           "B_tmp": 16, "S_Q_tmp": 8, "S_KV_tmp": 8, "D_O_tmp": 64,
           "S_Q_cro": 128, "S_KV_cro": 32, "D_O_cro": 64, "H_FU": 256, "D_FD": 256},
    # one device: everything whole.
    "none": {"B_spt": 16, "S_Q_spt": 16, "H_QKV": 192, "N_A": 4, "D_O_spt": 64,
             "B_tmp": 32, "S_Q_tmp": 8, "S_KV_tmp": 8, "D_O_tmp": 64,
             "S_Q_cro": 256, "S_KV_cro": 16, "D_O_cro": 64, "H_FU": 256, "D_FD": 256},
    # tokens (batch on x, frame-major sequence on y) split 4 ways: the spatial attention is
    # local, B*T/4 = 4 frames x 4 heads = 16; the temporal one all-to-alls to heads on y:
    # (B*S/2 = 16) x (4/2 heads) = 32; the cross-attention all-to-alls its queries to heads
    # too: 1 x 2 heads, the 128 queries of one sample (x) against all 16 keys.  One N_A serves
    # all three: gcd(4, 2, 2) = 2 heads, so B_spt = 16/2, B_tmp = 32/2, B_cro = 2/2.
    "ds_ulysses": {"B_spt": 8, "S_Q_spt": 16, "H_QKV": 192, "N_A": 2, "D_O_spt": 64,
                   "B_tmp": 16, "S_Q_tmp": 8, "S_KV_tmp": 8, "D_O_tmp": 64,
                   "S_Q_cro": 128, "S_KV_cro": 16, "D_O_cro": 64, "H_FU": 256, "D_FD": 256},
    # tensor parallel over y (2) with the batch on x: as two_dimension (qkv 96, 2 heads, proj
    # in 32, fc1 out 128), each attention sees its gathered sequence: spatial 8 frames,
    # temporal 16 positions of one sample; cross: one sample's 128 queries, all 16 keys.
    "megatron_sp": {"B_spt": 8, "S_Q_spt": 16, "H_QKV": 96, "N_A": 2, "D_O_spt": 32,
                    "B_tmp": 16, "S_Q_tmp": 8, "S_KV_tmp": 8, "D_O_tmp": 32,
                    "S_Q_cro": 128, "S_KV_cro": 16, "D_O_cro": 32, "H_FU": 128, "D_FD": 128},
    # 2x4, y = ring 2 x ulysses 2, frame-major (T = 8 over 4): spatial local, B*T/8 = 2 frames
    # x 4 heads = 8; temporal: heads to ulysses (2 of 4), T over the ring: (B*S/2 = 16) x 2
    # heads = 32, query chunk 8/2 = 4, keys 4 per step x 2 steps; cross: 2 heads, queries over
    # (x, ring) 256/4 = 64.  N_A = gcd(4, 2, 2) = 2: B_spt 4, B_tmp 16, B_cro 1.  Weights whole.
    "usp": {"B_spt": 4, "S_Q_spt": 16, "H_QKV": 192, "N_A": 2, "D_O_spt": 64,
            "B_tmp": 16, "S_Q_tmp": 4, "S_KV_tmp": 8, "D_O_tmp": 64,
            "S_Q_cro": 64, "S_KV_cro": 16, "D_O_cro": 64, "H_FU": 256, "D_FD": 256},
    # as ds_ulysses, but the temporal attention keeps T split over y (4 local frames) and passes
    # K/V round a ring of 2: batch (B*S/2=16) x 4 heads = 64 = B_tmp * N_A with B_tmp = 16,
    # query length 4, key length 4 per step x 2 steps = 8.
    "ring_attention": {"B_spt": 4, "S_Q_spt": 16, "H_QKV": 192, "N_A": 4, "D_O_spt": 64,
                       "B_tmp": 16, "S_Q_tmp": 4, "S_KV_tmp": 8, "D_O_tmp": 64,
                       "S_Q_cro": 64, "S_KV_cro": 16, "D_O_cro": 64, "H_FU": 256, "D_FD": 256},
}
MESH = {"dp": "2x2", "none": "1x1", "usp": "2x4"}


def dump_path(strategy: str, dialect: str = "stablehlo") -> Path:
    mesh = MESH.get(strategy, "2x2")
    return DUMPS / dialect / f"tiny_28_64_64_{strategy}_{mesh}_stage1_pairs1-1.mlir"


@pytest.mark.parametrize("strategy", sorted(EXPECTED))
def test_segmenter_recovers_the_hand_derived_dictionary(strategy):
    segmentation = segment_blocks(load_module(dump_path(strategy)))
    assert [block.kind for block in segmentation.blocks] == ["spatial", "temporal"]
    assert segmentation.pairs == 1
    assert segmentation.shapes.as_dict() == {**COMMON, **EXPECTED[strategy]}


@pytest.mark.parametrize("strategy", ["megatron", "ring_attention"])
def test_mhlo_form_segments_the_same(strategy):
    stablehlo = segment_blocks(load_module(dump_path(strategy)))
    mhlo = segment_blocks(load_module(dump_path(strategy, "mhlo")))
    assert mhlo.shapes == stablehlo.shapes
    assert [b.labels() for b in mhlo.blocks] == [b.labels() for b in stablehlo.blocks]


def test_every_block_gets_all_eleven_labels():
    segmentation = segment_blocks(load_module(dump_path("megatron")))
    for block in segmentation.blocks:
        labels = block.labels()
        assert list(labels) == ["qkv", "scores", "values", "proj", "cross_q", "cross_kv",
                                "cross_scores", "cross_values", "cross_proj", "fc1", "fc2"]
        positions = [p for ps in labels.values() for p in ps]
        assert len(set(positions)) == len(positions)  # no GEMM has two labels


def test_a_dump_that_is_not_stdit_says_so():
    with pytest.raises(NotSTDiTError, match="does not look like an STDiT3 stage"):
        segment_blocks(load_module(example_dump()), "mlp")


def test_stage_zero_with_the_embeddings_interleaved_segments_the_same():
    """Stage 0 adds the patch conv and the four embedding MLPs (t, fps, caption, t_block), whose
    GEMM pairs look like an MLP and feed the first block; the dictionary must not change."""
    stage0 = segment_blocks(load_module(
        DUMPS / "stablehlo" / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir"))
    assert stage0.pairs == 1
    assert stage0.shapes.as_dict() == {**COMMON, **EXPECTED["megatron"]}
