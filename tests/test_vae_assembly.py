"""The assembly of a VAE decode (models/zoo/videodit/vae_assembly.py): the decoded calls joined,
the tiles' overlaps blended by linear ramps and cropped to the stride. Eager checks on small
grids (tiles cut from one video give it back; constant tiles give the ramp written here), the
three models' inputs and output shapes, and the traced kernels' FLOPs and bytes against a hand
count from the tile grid and the overlaps alone."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from vae_trace import traced_report  # noqa: E402

from models.zoo.videodit.companions import ASSEMBLY_FACTORY, COMPANIONS, decoded_outputs  # noqa: E402
from models.zoo.videodit.vae_assembly import vae_decode_assembly  # noqa: E402

#: Two temporal tiles of one call (3 latent frames: 9 decoded frames, the second's first frame
#: dropped), each 2 x 2 spatial tiles of 4 and 2 latent pixels every 3: 32 and 16 pixels, overlap
#: (4 - 3) x 8 = 8 pixels, kept 3 x 8 = 24 (the factory's defaults).
TILED = dict(calls=[[3], [3]], rows=[4, 2], cols=[4, 2], tile=(4, 4), stride=(3, 3), time_tile=(2, 1),
             scale=(4, 8), running=False)
#: One tile of four one-frame calls, each joined to the frames so far (Wan's loop).
RUNNING = dict(calls=[[1, 1, 1, 1]], rows=[2], cols=[3], tile=(2, 3), stride=(2, 3), time_tile=(0, 0),
               scale=(4, 8), running=True)
#: A row of two tiles (4 and 2 latent pixels wide every 3) of 2 latent frames, two calls each.
ROW = dict(calls=[[1, 1]], rows=[2], cols=[4, 2], tile=(2, 4), stride=(2, 3), time_tile=(0, 0),
           scale=(4, 8), running=False)


def cut(kwargs: dict, video: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each call's frames cut from one video where the official loop decodes them: temporal tile
    k from latent frame k x stride (video frame 4 k stride), a tile's calls one after the other,
    tile (i, j) from pixel (8 i stride, 8 j stride)."""
    time, space = kwargs["scale"]
    inputs, at = {}, {}
    for name, shape in decoded_outputs(kwargs["calls"], kwargs["rows"], kwargs["cols"], kwargs["scale"]):
        k, i, j, c = map(int, name.split("_")[1:])
        start = at.get((k, i, j), time * k * kwargs["time_tile"][1])
        top, left = space * i * kwargs["stride"][0], space * j * kwargs["stride"][1]
        inputs[name] = video[:, :, start:start + shape[2], top:top + shape[3], left:left + shape[4]]
        at[(k, i, j)] = start + shape[2]
    return inputs


@pytest.mark.parametrize("kwargs, frames, height, width", [(TILED, 9, 40, 40), (RUNNING, 13, 16, 24),
                                                            (ROW, 5, 16, 40)])
def test_tiles_cut_from_one_video_give_it_back(kwargs, frames, height, width):
    video = torch.randn(1, 3, 16, 48, 48, dtype=torch.float64)
    out = vae_decode_assembly(**kwargs).double()(**cut(kwargs, video))
    assert out.shape == (1, 3, frames, height, width)
    torch.testing.assert_close(out, video[:, :, :frames, :height, :width], rtol=0, atol=1e-12)


def test_two_constant_tiles_blend_by_a_linear_ramp_over_their_overlap():
    """Tiles of a (32 pixels wide) and b (16): columns 0-23 are a, 24-31 a (1 - y / 8) + b y / 8,
    32-39 b (b's columns 8-15)."""
    shapes = dict(decoded_outputs(ROW["calls"], ROW["rows"], ROW["cols"], ROW["scale"]))
    values = {"out_0_0_0_0": 2.0, "out_0_0_0_1": 2.0, "out_0_0_1_0": 10.0, "out_0_0_1_1": 10.0}
    inputs = {name: torch.full(shapes[name], value, dtype=torch.float64) for name, value in values.items()}
    out = vae_decode_assembly(**ROW).double()(**inputs)
    expected = torch.tensor([2.0] * 24 + [2.0 * (1 - y / 8) + 10.0 * y / 8 for y in range(8)] + [10.0] * 8,
                            dtype=torch.float64)
    assert out.shape == (1, 3, 5, 16, 40)
    torch.testing.assert_close(out, expected.expand(1, 3, 5, 16, 40), rtol=0, atol=1e-12)


def test_four_constant_tiles_blend_above_then_left_each_neighbour_as_its_blends_left_it():
    """2 x 2 tiles of c00, c01, c10, c11 (32 and 16 pixels, overlap 8, kept 24): along row y and
    column x of the overlaps (u = y / 8, v = x / 8) the ramps of each pair; in the corner, tile
    (1, 1) blended first with the tile above (its last rows already blended with (0, 0): c00 (1 -
    v) + c01 v) and then with the tile on its left (its last columns already blended with (0, 0):
    c00 (1 - u) + c10 u)."""
    kwargs = dict(TILED, calls=[[3]], time_tile=(0, 0))
    c = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 4.0, (1, 1): 8.0}
    inputs = {name: torch.full(shape, c[(int(name[6]), int(name[8]))], dtype=torch.float64)
              for name, shape in decoded_outputs(kwargs["calls"], kwargs["rows"], kwargs["cols"], kwargs["scale"])}
    out = vae_decode_assembly(**kwargs).double()(**inputs)[0, 0, 0]
    u = torch.arange(8, dtype=torch.float64)[:, None] / 8
    v = torch.arange(8, dtype=torch.float64)[None, :] / 8
    expected = torch.empty(40, 40, dtype=torch.float64)
    expected[:24, :24], expected[:24, 32:], expected[32:, :24], expected[32:, 32:] = 1.0, 2.0, 4.0, 8.0
    expected[:24, 24:32] = (1.0 * (1 - v) + 2.0 * v).expand(24, 8)
    expected[24:32, :24] = (1.0 * (1 - u) + 4.0 * u).expand(8, 24)
    expected[24:32, 32:] = (2.0 * (1 - u) + 8.0 * u).expand(8, 8)
    expected[32:, 24:32] = (4.0 * (1 - v) + 8.0 * v).expand(8, 8)
    above_then = (1.0 * (1 - v) + 2.0 * v) * (1 - u) + 8.0 * u
    expected[24:32, 24:32] = (1.0 * (1 - u) + 4.0 * u) * (1 - v) + above_then * v
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_two_constant_temporal_tiles_blend_by_a_linear_ramp_in_time():
    """Two temporal tiles of 9 frames (the second without its first: 8), overlap (2 - 1) x 4 = 4
    frames, kept 1 x 4 (the first 5): frames 0-4 are a, 5-8 a (1 - y / 4) + b y / 4."""
    kwargs = dict(TILED, rows=[2], cols=[2])
    shapes = dict(decoded_outputs(kwargs["calls"], kwargs["rows"], kwargs["cols"], kwargs["scale"]))
    inputs = {name: torch.full(shape, 1.0 if name.startswith("out_0") else 5.0, dtype=torch.float64)
              for name, shape in shapes.items()}
    out = vae_decode_assembly(**kwargs).double()(**inputs)
    expected = torch.tensor([1.0] * 5 + [1.0 * (1 - y / 4) + 5.0 * y / 4 for y in range(4)], dtype=torch.float64)
    torch.testing.assert_close(out, expected.reshape(1, 1, 9, 1, 1).expand(1, 3, 9, 16, 16), rtol=0, atol=1e-12)


#: (model, video) -> (inputs, the first input's shape) by hand: CogVideoX 9 tiles x 6 calls (9
#: frames of 3 latent frames, then 8 of 2) of 240 x 360 pixels; HunyuanVideo 3 temporal tiles x 28
#: spatial tiles, one call each (65 frames of 17 latent frames) of 256 x 256; Wan 21 calls of the
#: whole 480 x 832 frame (the first one frame).
BY_HAND = {("cogvideox_5b", (49, 480, 720)): (54, "out_0_0_0_0=1x3x9x240x360:bfloat16"),
           ("hunyuan_video", (129, 720, 1280)): (84, "out_0_0_0_0=1x3x65x256x256:float16"),
           ("wan21_14b", (81, 480, 832)): (21, "out_0_0_0_0=1x3x1x480x832:float32")}


@pytest.mark.parametrize("model, video", list(BY_HAND))
def test_each_models_assembly_takes_every_call_and_makes_the_video(model, video):
    assembly = COMPANIONS[model].assembly(*video)
    count, first = BY_HAND[(model, video)]
    assert (len(assembly.inputs), assembly.inputs[0]) == (count, first)
    with torch.device("meta"):
        module = vae_decode_assembly(**assembly.kwargs)
        inputs = {spec.split("=")[0]: torch.empty([int(n) for n in spec.split("=")[1].split(":")[0].split("x")])
                  for spec in assembly.inputs}
        assert module(**inputs).shape == (1, 3, *video)


# -- the traced program against a hand count --------------------------------------------------------
def hand_count(kwargs: dict, element_bytes: int) -> tuple[int, int, int]:
    """(FLOPs, bytes read and written, kernels) of an assembly from its grid alone. A blend of n
    elements over E positions is two products (each reading n elements and E weights, writing
    n) and a sum (reading 2n, writing n; torch-xla writes aten's add as a + 1 x b: 2 FLOPs an
    element): 4n FLOPs, 7n + 2E elements. A tile is cut in bands along each axis (its overlaps
    with the tiles before and after it, and the rest between); each blend runs band by band. A join (torch.cat) reads and writes its
    result. Spatial tiles: E = (tile - stride) x 8 (at most either tile), kept stride x 8; the
    crops of a tile row joined per band of rows, then the bands into frames."""
    time, space = kwargs["scale"]
    rows = [space * r for r in kwargs["rows"]]
    cols = [space * c for c in kwargs["cols"]]
    over = [space * (kwargs["tile"][a] - kwargs["stride"][a]) for a in (0, 1)]
    keep = [space * kwargs["stride"][a] for a in (0, 1)]
    flops = moved = kernels = 0

    def blend(n: int, extent: int) -> None:
        nonlocal flops, moved, kernels
        flops, moved, kernels = flops + 4 * n, moved + 7 * n + 2 * extent, kernels + 3

    def join(n: int) -> None:
        nonlocal moved, kernels
        moved, kernels = moved + 2 * n, kernels + 1

    chunks = []
    for tile_calls in kwargs["calls"]:
        frames = [time * f - (time - 1 if c == 0 else 0) for c, f in enumerate(tile_calls)]
        pixels = 3 * sum(frames)
        for h in rows:
            for w in cols:
                if kwargs["running"]:
                    for c in range(1, len(frames)):
                        join(3 * sum(frames[:c + 1]) * h * w)
                elif len(frames) > 1:
                    join(pixels * h * w)
        if len(rows) * len(cols) == 1:
            chunks.append(sum(frames))
            continue
        ev = [0] + [min(over[0], a, b) for a, b in zip(rows, rows[1:])]
        eh = [0] + [min(over[1], a, b) for a, b in zip(cols, cols[1:])]
        ev, eh = ev + [0], eh + [0]
        for i, h in enumerate(rows):
            for j, w in enumerate(cols):
                # bands: the overlap with the tile before, with the tile after, and between
                row_bands = [b for b in (ev[i], h - ev[i] - ev[i + 1], ev[i + 1]) if b]
                col_bands = [b for b in (eh[j], w - eh[j] - eh[j + 1], eh[j + 1]) if b]
                for band in col_bands if ev[i] else []:
                    blend(pixels * ev[i] * band, ev[i])
                for band in row_bands if eh[j] else []:
                    blend(pixels * band * eh[j], eh[j])
        width = sum(min(w, keep[1]) for w in cols)
        for i, h in enumerate(rows):
            for band in ([ev[i], min(h, keep[0]) - ev[i]] if ev[i] else [min(h, keep[0])]):
                join(pixels * band * width)
        join(pixels * sum(min(h, keep[0]) for h in rows) * width)
        chunks.append(sum(frames))
    if len(chunks) > 1:
        frame = 3 * sum(min(h, keep[0]) for h in rows) * sum(min(w, keep[1]) for w in cols)
        lengths = [chunks[0]] + [n - 1 for n in chunks[1:]]
        over_t, keep_t = time * (kwargs["time_tile"][0] - kwargs["time_tile"][1]), time * kwargs["time_tile"][1]
        for a, b in zip(lengths, lengths[1:]):
            blend(frame * min(over_t, a, b), min(over_t, a, b))
        join(frame * (min(lengths[0], keep_t + 1) + sum(min(n, keep_t) for n in lengths[1:])))
    return flops, moved * element_bytes, kernels


def traced(tmp_path: Path, kwargs: dict, dtype: str) -> dict:
    inputs = [f"{name}={'x'.join(map(str, shape))}:{dtype}"
              for name, shape in decoded_outputs(kwargs["calls"], kwargs["rows"], kwargs["cols"], kwargs["scale"])]
    return traced_report(tmp_path, ASSEMBLY_FACTORY, kwargs, inputs, dtype)


@pytest.mark.trace
@pytest.mark.parametrize("kwargs, dtype, element_bytes", [(TILED, "bfloat16", 2), (RUNNING, "float32", 4),
                                                          (ROW, "float16", 2)])
def test_traced_flops_and_bytes_equal_the_hand_count(tmp_path, kwargs, dtype, element_bytes):
    pytest.importorskip("torch_xla")
    report = traced(tmp_path, kwargs, dtype)
    kernels = report["mapping"]["kernels"]
    flops, moved, count = hand_count(kwargs, element_bytes)
    assert report["totals"]["total_flops"] == flops
    assert sum(k["dram_bytes"] for k in kernels) == moved
    assert len(kernels) == count


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.parametrize("model, video", list(BY_HAND))
def test_traced_flops_and_bytes_of_each_models_assembly_equal_the_hand_count(tmp_path, model, video):
    """At the model's standard shape, in the dtype its official decode runs in (placeholders, no
    data: a few seconds each)."""
    pytest.importorskip("torch_xla")
    assembly, dtype = COMPANIONS[model].assembly(*video), COMPANIONS[model].decoder.dtype
    report = traced(tmp_path, assembly.kwargs, dtype)
    kernels = report["mapping"]["kernels"]
    expected = hand_count(assembly.kwargs, 4 if dtype == "float32" else 2)
    assert (report["totals"]["total_flops"], sum(k["dram_bytes"] for k in kernels), len(kernels)) == expected
