"""What runs outside the video DiTs' sampling loop (models/zoo/videodit/companions.py): the latent
shapes the VAEs decode follow from their compression, and the report page lists every model's text
encoders and VAE with their sizes; torch-free."""

from __future__ import annotations

from pathlib import Path

from models.zoo.videodit.companions import COMPANIONS
from models.zoo.videodit.configs import MODELS
from scripts.videodit import page, read_rows

RESULTS = Path(__file__).resolve().parent.parent / "results" / "videodit"

#: (channels, T, H, W) by hand: a causal VAE keeps the first frame and compresses the rest 4x in
#: time, 8x in height and width, into 16 channels: T = (frames - 1) / 4 + 1, H = height / 8.
BY_HAND = {
    ("hunyuan_video", (129, 720, 1280)): (16, 33, 90, 160),   # 128 / 4 + 1 = 33
    ("hunyuan_video", (129, 544, 960)): (16, 33, 68, 120),
    ("wan21_14b", (81, 480, 832)): (16, 21, 60, 104),         # 80 / 4 + 1 = 21
    ("wan21_14b", (81, 720, 1280)): (16, 21, 90, 160),
    ("wan21_1.3b", (81, 480, 832)): (16, 21, 60, 104),
    ("cogvideox_5b", (49, 480, 720)): (16, 13, 60, 90),       # 48 / 4 + 1 = 13
}


def test_every_model_has_its_encoders_and_vae():
    assert set(COMPANIONS) == set(MODELS)
    encoders = {name: {e.name.split(" (")[0] for e in c.text_encoders} for name, c in COMPANIONS.items()}
    assert any("LLaMA-3-8B" in e for e in encoders["hunyuan_video"])
    assert any("CLIP ViT-L" in e for e in encoders["hunyuan_video"])
    assert encoders["wan21_14b"] == encoders["wan21_1.3b"] == {"umT5-XXL encoder"}
    assert encoders["cogvideox_5b"] == {"T5 v1.1 XXL encoder"}
    for companion in COMPANIONS.values():
        assert companion.vae.role == "VAE"
        assert all(e.role == "text encoder" for e in companion.text_encoders)
        for part in (*companion.text_encoders, companion.vae):
            assert part.bf16_bytes == 2 * part.parameters > 0


def test_latent_shapes_follow_from_the_vae_compression():
    listed = {(name, shape): c.latent_shape(*shape) for name, c in COMPANIONS.items() for shape in c.shapes}
    assert listed == BY_HAND


def test_the_page_lists_every_encoder_and_vae_with_its_size():
    text = page(read_rows(RESULTS / "latency.csv"))
    assert text == (RESULTS / "latency.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for name, companion in COMPANIONS.items():
        for part in (*companion.text_encoders, companion.vae):
            size = f"| {part.parameters / 1e9:.3f} B | {part.bf16_bytes / 1e9:.2f} |"
            assert any(line.startswith(f"| {name} | {part.role} | {part.name} {size}") for line in rows), part
    for (name, (f, h, w)), shape in BY_HAND.items():
        assert f"{f} x {h} x {w} -> {' x '.join(map(str, shape))}" in text


def test_the_wan_decode_is_one_call_per_latent_frame_at_the_latent_size():
    (call,) = COMPANIONS["wan21_14b"].decode_calls(81, 720, 1280)
    assert call.count == 21   # (81 - 1) / 4 + 1 latent frames, one a call, no tiling
    assert call.inputs == ("latent=1x16x1x90x160:float32",)
    assert (call.kwargs["z_dim"], call.kwargs["height"], call.kwargs["width"], call.kwargs["dim"]) == (16, 90, 160, 96)
