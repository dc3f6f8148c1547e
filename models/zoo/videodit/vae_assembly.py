"""The assembly of a VAE decode: the frames that the decoder's calls return (one input per call,
``companions.decoded_outputs``) joined, blended and cropped into the video, as the official
decode loops do it after their calls (written from the public descriptions of tiled decoding
in the CogVideoX and HunyuanVideo repositories and diffusers' documentation, and of Wan's
chunked decode: docs/videodit.md; nothing copied).

* The calls of one tile are joined in time: at once (CogVideoX: a tile's six calls), or each
  call's frames to the frames so far (Wan: twenty joins of a growing video).
* Spatial tiles (CogVideoX, HunyuanVideo): each tile is blended with the tile above it over
  their overlap (E = (tile - stride) x 8 rows: above's last E rows fade out as the tile's first
  E rows fade in, row y weighted y / E), then with the tile on its left over E columns, each
  neighbour read as its own blends left it; then cropped to the stride (stride x 8 rows and
  columns from its start, an edge tile to its size). The crops are joined into rows of tiles and
  the rows into frames.
* Temporal tiles (HunyuanVideo): each temporal tile's frames (assembled in space) but the
  first's lose their first frame (decoded from the latent frame the previous tile ends on), are
  blended with the previous tile over E = (size - stride) x 4 frames, cropped to stride x 4
  frames (the first tile one more) and joined.

The official code blends in place, row by row: for each of the E rows, two products by the
row's weight, a sum and a copy into the tile (four kernels). Here the blend runs out of place
over the whole overlap at once: a tile is kept as its bands (:class:`Bands`: the blended rows
and columns apart from the rest), each band blended by two products and a sum (the bytes of the
row loop's three kernels, launched once instead of E times) and read where it was computed by
the joins; the copy of the blended rows back into their tile is left out (docs/videodit.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from models.zoo.videodit.companions import decoded_outputs

#: The weights of the blends along an axis over E positions, by (axis, E): (1 - y / E, y / E)
#: for y < E, each shaped to broadcast along the axis.
Fades = Mapping[tuple[int, int], tuple[Tensor, Tensor]]

#: The axes of a video (batch, channels, frames, height, width) the blends run along.
TIME, HEIGHT, WIDTH = 2, 3, 4


def overlap(extent: int, first: int, second: int) -> int:
    """The rows (columns, frames) two neighbouring tiles of ``first`` and ``second`` blend over:
    the tiling's overlap, at most either tile's size."""
    return min(extent, first, second)


def ramp_blend(tail: Tensor, head: Tensor, dim: int, fades: Fades) -> Tensor:
    """``tail`` faded out and ``head`` faded in along ``dim``: at position y of E, ``tail`` x
    (1 - y / E) + ``head`` x y / E (the weights ``fades[(dim, E)]``: out, in), in the head's
    type."""
    fade_out, fade_in = fades[(dim, head.shape[dim])]
    # one op a line: torch-xla computes a 16-bit product in float32 and writes the casts on the
    # product's line; the analyzer joins a cast to the call of its line that it reads or feeds
    # (hlo_analyzer.mapping.library_calls), which must be the product's, not a blend's sum
    faded_out = tail * fade_out
    faded_in = head * fade_in
    return faded_out + faded_in


class Bands:
    """A decoded tile held as a grid of bands: the row and column boundaries (:func:`_bounds`:
    the band blended with the tile above or on the left first) and each band's tensor (a view
    of the tile until a blend replaces it)."""

    def __init__(self, tile: Tensor, rows: list[int], cols: list[int]) -> None:
        self.rows, self.cols = rows, cols
        self.parts = {(r, c): tile[..., rows[r]:rows[r + 1], cols[c]:cols[c + 1]]
                      for r in range(len(rows) - 1) for c in range(len(cols) - 1)}

    @property
    def height(self) -> int:
        return self.rows[-1]

    @property
    def width(self) -> int:
        return self.cols[-1]

    def region(self, top: int, bottom: int, left: int, right: int) -> Tensor:
        """Rows top..bottom and columns left..right, which must lie in one band."""
        r = _band(self.rows, top, bottom)
        c = _band(self.cols, left, right)
        return self.parts[(r, c)][..., top - self.rows[r]:bottom - self.rows[r],
                                  left - self.cols[c]:right - self.cols[c]]

    def cropped(self, r: int, height: int, width: int) -> list[Tensor]:
        """The bands of row band ``r`` within the first ``height`` rows and ``width`` columns."""
        top, bottom = self.rows[r], min(self.rows[r + 1], height)
        if bottom <= top:
            return []
        pieces = []
        for c in range(len(self.cols) - 1):
            left, right = self.cols[c], min(self.cols[c + 1], width)
            if right > left:
                pieces.append(self.parts[(r, c)][..., :bottom - top, :right - left])
        return pieces


def _bounds(overlaps: list[int], index: int, size: int) -> list[int]:
    """A tile's band boundaries along one axis: the rows it blends with the tile before it, the
    rows the tile after it blends with it, and those between (each band a tensor of its own, so
    that a neighbour reads a band whole: a slice of a computed band would let XLA move the slice
    into the computation, which eager PyTorch does not do)."""
    after = overlaps[index + 1] if index + 1 < len(overlaps) else 0
    if overlaps[index] > size - after:
        raise ValueError(f"a tile of {size} rows or columns is shorter than its two overlaps")
    return sorted({0, overlaps[index], size - after, size})


def _band(bounds: list[int], start: int, stop: int) -> int:
    for index in range(len(bounds) - 1):
        if bounds[index] <= start and stop <= bounds[index + 1]:
            return index
    raise ValueError(f"rows or columns {start}..{stop} span two bands {bounds}: a tile shorter than "
                     "two overlaps")


def assemble_space(tiles: list[list[Tensor]], extent: tuple[int, int], limit: tuple[int, int],
                   fades: Fades) -> Tensor:
    """One temporal tile's frames from its grid of decoded spatial tiles: blended with the
    tiles above and on the left over ``extent`` (rows, columns: :func:`overlap`), cropped to
    ``limit`` (rows, columns) and joined."""
    if len(tiles) == 1 and len(tiles[0]) == 1:
        return tiles[0][0]
    over_rows = [0] + [overlap(extent[0], a[0].shape[HEIGHT], b[0].shape[HEIGHT]) for a, b in zip(tiles, tiles[1:])]
    over_cols = [0] + [overlap(extent[1], a.shape[WIDTH], b.shape[WIDTH]) for a, b in zip(tiles[0], tiles[0][1:])]
    grid: list[list[Bands]] = []
    for i, row in enumerate(tiles):
        grid.append([])
        for j, tile in enumerate(row):
            bands = Bands(tile, _bounds(over_rows, i, tile.shape[HEIGHT]), _bounds(over_cols, j, tile.shape[WIDTH]))
            if over_rows[i]:
                above = grid[i - 1][j]
                for c in range(len(bands.cols) - 1):
                    tail = above.region(above.height - over_rows[i], above.height, bands.cols[c], bands.cols[c + 1])
                    bands.parts[(0, c)] = ramp_blend(tail, bands.parts[(0, c)], HEIGHT, fades)
            if over_cols[j]:
                left = grid[i][j - 1]
                for r in range(len(bands.rows) - 1):
                    tail = left.region(bands.rows[r], bands.rows[r + 1], left.width - over_cols[j], left.width)
                    bands.parts[(r, 0)] = ramp_blend(tail, bands.parts[(r, 0)], WIDTH, fades)
            grid[i].append(bands)
    strips = []
    for row_bands in grid:
        for r in range(len(row_bands[0].rows) - 1):
            pieces = [piece for bands in row_bands for piece in bands.cropped(r, *limit)]
            if pieces:
                strips.append(torch.cat(pieces, dim=WIDTH))
    return torch.cat(strips, dim=HEIGHT)


def assemble_time(chunks: list[Tensor], extent: int, limit: int, fades: Fades) -> Tensor:
    """The video from its temporal tiles' frames: every tile but the first without its first
    frame, blended with the previous tile over ``extent`` frames (:func:`overlap`), cropped to
    ``limit`` frames (the first tile to ``limit`` + 1) and joined."""
    if len(chunks) == 1:
        return chunks[0]
    previous, blended = chunks[0], 0
    pieces = [previous[:, :, :limit + 1]]
    for chunk in chunks[1:]:
        chunk = chunk[:, :, 1:]
        over = overlap(extent, previous.shape[TIME], chunk.shape[TIME])
        start = previous.shape[TIME] - over
        if start < blended:
            raise ValueError(f"a temporal tile of {previous.shape[TIME]} frames is shorter than two overlaps")
        mixed = ramp_blend(previous[:, :, start:], chunk[:, :, :over], TIME, fades)
        pieces += [mixed[:, :, :limit], chunk[:, :, over:limit]]
        previous, blended = chunk, over
    return torch.cat([p for p in pieces if p.shape[TIME]], dim=TIME)


class DecodeAssembly(nn.Module):
    """The decoded calls (keyword inputs ``out_k_i_j_c``: ``companions.decoded_outputs``) ->
    the video (1, 3, frames, height, width). ``calls``: each temporal tile's calls (latent
    frames); ``rows``, ``cols``: the tiles' heights and widths; ``tile``, ``stride``: the
    spatial tiling's (latent pixels); ``time_tile``: the temporal tiling's (size, stride), (0, 0)
    for none; ``scale``: the VAE's compression (time, space); ``running``: each call's frames
    joined to the frames so far (else a tile's calls joined at once). The blends' weights are
    buffers, one pair per axis and overlap (``fade_out_AXIS_E``, ``fade_in_AXIS_E``)."""

    def __init__(self, calls: list[list[int]], rows: list[int], cols: list[int], tile: tuple[int, int],
                 stride: tuple[int, int], time_tile: tuple[int, int], scale: tuple[int, int],
                 running: bool) -> None:
        super().__init__()
        self.calls, self.rows, self.cols, self.running, self.scale = calls, rows, cols, running, scale
        time, space = scale
        self.extent = ((tile[0] - stride[0]) * space, (tile[1] - stride[1]) * space)
        self.limit = (stride[0] * space, stride[1] * space)
        self.time_extent, self.time_limit = (time_tile[0] - time_tile[1]) * time, time_tile[1] * time
        for dim, extent in sorted(self.overlaps()):
            shape = [1] * (WIDTH + 1)
            shape[dim] = extent
            ramp = (torch.arange(extent, dtype=torch.float64) / extent).reshape(shape)
            self.register_buffer(f"fade_out_{dim}_{extent}", (1 - ramp).float())
            self.register_buffer(f"fade_in_{dim}_{extent}", ramp.float())

    def overlaps(self) -> set[tuple[int, int]]:
        """Every (axis, overlap) a blend of this decode runs over (:func:`overlap` of each pair
        of neighbours): rows, columns and frames."""
        time, space = self.scale
        frames = [time * sum(tile) - (time - 1) - (1 if k else 0) for k, tile in enumerate(self.calls)]
        found = {(HEIGHT, overlap(self.extent[0], space * a, space * b)) for a, b in zip(self.rows, self.rows[1:])}
        found |= {(WIDTH, overlap(self.extent[1], space * a, space * b)) for a, b in zip(self.cols, self.cols[1:])}
        found |= {(TIME, overlap(self.time_extent, a, b)) for a, b in zip(frames, frames[1:])}
        return {(dim, extent) for dim, extent in found if extent}

    def forward(self, **outputs: Tensor) -> Tensor:
        fades = {(dim, e): (getattr(self, f"fade_out_{dim}_{e}"), getattr(self, f"fade_in_{dim}_{e}"))
                 for dim, e in self.overlaps()}
        names = iter(name for name, _ in decoded_outputs(self.calls, self.rows, self.cols, self.scale))
        chunks = []
        for tile_calls in self.calls:
            grid = [[self._join([outputs[next(names)] for _ in tile_calls]) for _ in self.cols] for _ in self.rows]
            chunks.append(assemble_space(grid, self.extent, self.limit, fades))
        return assemble_time(chunks, self.time_extent, self.time_limit, fades)

    def _join(self, frames: list[Tensor]) -> Tensor:
        if len(frames) == 1:
            return frames[0]
        if not self.running:
            return torch.cat(frames, dim=TIME)
        video = frames[0]
        for more in frames[1:]:
            video = _kept(torch.cat([video, more], dim=TIME))
        return video


def _kept(joined: Tensor) -> Tensor:
    """A join kept as a copy of its own when traced: XLA's simplifier folds a join of a join
    into one (a compiled program copies the frames once), where the official eager loop copies
    the growing video at every join; an optimization barrier (no kernel: the analyzer charges
    nothing for it) keeps the joins apart. Eagerly, the join itself."""
    if joined.device.type == "xla":
        import torch_xla.core.xla_model as xm

        xm.optimization_barrier_([joined])
    return joined


def vae_decode_assembly(calls: list[list[int]] = ((3,), (3,)), rows: list[int] = (4, 2),
                        cols: list[int] = (4, 2), tile: tuple[int, int] = (4, 4), stride: tuple[int, int] = (3, 3),
                        time_tile: tuple[int, int] = (2, 1), scale: tuple[int, int] = (4, 8),
                        running: bool = False) -> DecodeAssembly:
    """The assembly of a decode (tiny by default: a latent of 4 x 5 x 5 in two temporal tiles of
    3 latent frames, each cut into 2 x 2 spatial tiles; ``companions.Companions.assembly`` gives
    a model's)."""
    return DecodeAssembly([list(c) for c in calls], list(rows), list(cols), tuple(tile), tuple(stride),
                          tuple(time_tile), tuple(scale), running)
