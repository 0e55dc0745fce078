"""Where a slide's level-0 pixels land in a viewer's world: the one formula for every layer.

napari draws data index i of a layer at world `translate + i · scale`, and puts pixel *centres* on
integer indices. A slide layer's pixel k (level 0) covers the level-0 interval [k, k + 1), so its centre
is at world `offset + k · mpp`. Everything drawn over the slide derives from the same `Placement`:

- a raster whose cell (i, j) covers level-0 pixels [x0 + jP, x0 + (j+1)P) × [y0 + iP, y0 + (i+1)P)
  (heatmaps, tile masks): scale = P·mpp, translate = offset + (origin + (P − 1)/2)·mpp;
- shapes whose vertices are level-0 positions (regions, lesions, tile boxes; pixel k spans [k, k + 1)):
  scale = mpp, translate = offset − mpp/2.

`mpp` is the slide's *effective* level-0 µm/px (the file's, or the user's fallback); world units are µm.
Without one the world is in level-0 pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

Pair = tuple[float, float]


@dataclass(frozen=True)
class Placement:
    """One slide in the world: its effective level-0 µm/px (x, y) and the world (row, col) of pixel 0."""

    mpp: Pair | None = None
    offset: Pair = (0.0, 0.0)

    @property
    def units(self) -> str:
        return "um" if self.mpp else "pixel"

    @property
    def pixel_scale(self) -> Pair:
        """World size (row, col) of one level-0 pixel."""
        mx, my = self.mpp or (1.0, 1.0)
        return (float(my), float(mx))

    def raster(self, cell_size_level0: float = 1.0, origin: Pair = (0.0, 0.0)) -> tuple[Pair, Pair]:
        """(scale, translate) of an image whose cells are `cell_size_level0` level-0 pixels wide and whose
        cell (0, 0) starts at level-0 (x, y) `origin`."""
        sy, sx = self.pixel_scale
        p = float(cell_size_level0)
        scale = (p * sy, p * sx)
        translate = (
            self.offset[0] + (origin[1] + (p - 1) / 2) * sy,
            self.offset[1] + (origin[0] + (p - 1) / 2) * sx,
        )
        return scale, translate

    def vertices(self) -> tuple[Pair, Pair]:
        """(scale, translate) of shapes whose vertex data are level-0 (row, col) positions."""
        sy, sx = self.pixel_scale
        return (sy, sx), (self.offset[0] - sy / 2, self.offset[1] - sx / 2)

    def to_level0(self, world: Pair) -> Pair:
        """Level-0 (x, y) position of a world (row, col) point (pixel k spans [k, k + 1))."""
        sy, sx = self.pixel_scale
        return ((world[1] - self.offset[1]) / sx + 0.5, (world[0] - self.offset[0]) / sy + 0.5)
